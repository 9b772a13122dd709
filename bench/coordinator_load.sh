#!/usr/bin/env bash
# Coordinator load benchmark: a coordinator (TLS and tokens on, a fresh SQLite file) holding
# JOBS queued jobs (default 10000) while WORKERS simulated workers (default 500) heartbeat every
# second, with SubmitJob and Heartbeat latency and the coordinator's CPU recorded.
#   bench/coordinator_load.sh [OUT.md]     (default bench/coordinator-load-DATE.md)
# Environment: JOBS, WORKERS, SECONDS_MEASURED (60), SUBMIT_RATE (10/s), BUILD (build).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${JOBS:-10000}
WORKERS=${WORKERS:-500}
SECONDS_MEASURED=${SECONDS_MEASURED:-60}
SUBMIT_RATE=${SUBMIT_RATE:-10}
OUT=${1:-bench/coordinator-load-$(date -u +%F).md}
cmake --build "$BUILD" -j2 --target boulder-coordinator coordinator_load_bench >/dev/null

tmp=$(mktemp -d)
coordinator_pid=""
cleanup() {
  if [ -n "$coordinator_pid" ]; then kill "$coordinator_pid" 2>/dev/null || true; wait "$coordinator_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
scripts/gen-certs.sh "$tmp/pki" >/dev/null
user=$(openssl rand -hex 24)
join=$(openssl rand -hex 24)
printf 'user bench %s admin\nworker %s\n' "$user" "$join" >"$tmp/tokens"
echo "$user" >"$tmp/user.token"
echo "$join" >"$tmp/join.token"

"$BUILD/bin/boulder-coordinator" --listen 127.0.0.1:0 --db "$tmp/bench.db" \
  --tls-cert "$tmp/pki/server.pem" --tls-key "$tmp/pki/server.key" --auth-file "$tmp/tokens" \
  >"$tmp/coordinator.out" 2>"$tmp/coordinator.err" &
coordinator_pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$tmp/coordinator.out" 2>/dev/null && break
  sleep 0.1
done
addr=$(sed -n 's/.*listening on //p' "$tmp/coordinator.out")
[ -n "$addr" ] || { cat "$tmp/coordinator.err"; exit 1; }

commit=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " (with uncommitted changes)" || true)
{
  echo "# Coordinator load benchmark, $(date -u '+%F %H:%M') UTC, commit $commit$dirty"
  echo
  echo "\`bench/coordinator_load.sh\` on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')):"
  echo "one boulder-coordinator (TLS, bearer tokens, SQLite WAL with synchronous=FULL on"
  echo "$(df -h "$tmp" | awk 'NR==2 {print $1}')) and the load generator \`coordinator_load_bench\` on the same machine."
  echo "The queued jobs need a CUDA worker and the simulated workers are CPU ones: the scheduler"
  echo "never places anything, the worst case for a scan of the whole queue."
  echo
  echo "| | |"
  echo "|---|---|"
  "$BUILD/bench/coordinator_load_bench" --coordinator "$addr" --tls-ca "$tmp/pki/ca.pem" \
    --token-file "$tmp/user.token" --join-token-file "$tmp/join.token" --jobs "$JOBS" \
    --workers "$WORKERS" --measure-seconds "$SECONDS_MEASURED" --submit-per-second "$SUBMIT_RATE" \
    --coordinator-pid "$coordinator_pid" --spec examples/minigpt-cpu.yaml
  echo
  echo "Other load on the machine while measuring: see 'whole machine busy' (the other processes'"
  echo "share is what remains after the coordinator and the load generator)."
} >"$OUT"
cat "$OUT"
