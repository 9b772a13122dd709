#!/usr/bin/env bash
# The main job: builds Boulder, starts a local coordinator (SQLite file under .boulder/) and one
# worker on 127.0.0.1, submits the seed mini-GPT job, follows it to the end with live progress,
# then shows the generated tokens. GPU when the worker trains on one, CPU otherwise.
# Extra arguments go to `boulder submit` (e.g. --set training.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BIN=$PWD/${BUILD_DIR:-build}/bin
STATE=$PWD/.boulder
mkdir -p "$STATE"
LOG=$STATE/logs; mkdir -p "$LOG"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

wait_for() {  # wait_for FILE REGEX SECONDS -> prints the first match
  local deadline=$((SECONDS + $3))
  until grep -Eom1 "$2" "$1" 2>/dev/null; do
    if ((SECONDS >= deadline)); then echo "quickstart: timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1; fi
    sleep 0.2
  done
}

# TLS and tokens as in production: a CA and certificates for 127.0.0.1 (scripts/gen-certs.sh)
# and a tokens file with one admin user and a worker join token, made once under .boulder/.
if [ ! -f "$STATE/pki/server.pem" ]; then scripts/gen-certs.sh "$STATE/pki" >/dev/null; fi
if [ ! -f "$STATE/tokens" ]; then
  (umask 077
   openssl rand -hex 32 >"$STATE/user.token"
   openssl rand -hex 32 >"$STATE/join.token"
   printf 'user %s %s admin\nworker %s\n' quickstart "$(cat "$STATE/user.token")" \
     "$(cat "$STATE/join.token")" >"$STATE/tokens")
fi
export BOULDER_TLS_CA=$STATE/pki/ca.pem BOULDER_TOKEN=$(cat "$STATE/user.token")

"$BIN/boulder-coordinator" --listen 127.0.0.1:0 --db "$STATE/quickstart.db" \
  --tls-cert "$STATE/pki/server.pem" --tls-key "$STATE/pki/server.key" \
  --auth-file "$STATE/tokens" >"$LOG/coordinator.log" 2>&1 &
pids+=($!)
ADDR=$(wait_for "$LOG/coordinator.log" '127\.0\.0\.1:[0-9]+' 30)
export BOULDER_COORDINATOR=$ADDR
echo "coordinator on $ADDR (database $STATE/quickstart.db, log $LOG/coordinator.log)"

"$BIN/boulder-worker" --coordinator "$ADDR" --backend auto --work-dir "$STATE/worker" \
  --tls-ca "$STATE/pki/ca.pem" --join-token-file "$STATE/join.token" >"$LOG/worker.log" 2>&1 &
pids+=($!)
wait_for "$LOG/worker.log" 'registered.*' 30

if "$BIN/boulder" workers -o json | grep -q '"backend": "cuda"'; then
  SPEC=examples/minigpt.yaml
else
  SPEC=examples/minigpt-cpu.yaml
fi
echo "submitting $SPEC"
"$BIN/boulder" submit "$SPEC" --follow "$@"
