#!/usr/bin/env bash
# CPU benchmark (issue 2): Boulder's CPU trainer against the same model in PyTorch, one after
# the other in one run, on the seed mini-GPT (vocab 96, hidden 768, 12 heads, 4 layers,
# FFN 3072, context 256) at batch 8 x 64, FP32, the same number of threads for both.
#
#   bench/cpu_bench.sh [--steps N] [--threads N]      (defaults: 20 steps, 2 threads)
#
# ms/step is the median over steps 3..N (the first two are warm-up). Writes bench/cpu-DATE.md
# (the table) and bench/results/cpu-DATE-COMMIT.json (the rows). Target: Boulder at least
# 1.3x faster than PyTorch. Run it on a quiet machine: anything else running skews both.
#
# Environment: BUILD_DIR (default build) or BOULDER_TRAINER (the trainer binary); PYTHON (the
# interpreter with PyTorch, default /usr/bin/python3: Debian's python3-torch lives there).
# PyTorch is a benchmark dependency only, so it is installed here when missing, not by
# scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=20
THREADS=2
while (($#)); do
  case "$1" in
    --steps) STEPS=${2:?--steps needs a value}; shift 2 ;;
    --threads) THREADS=${2:?--threads needs a value}; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "cpu_bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
WARMUP=2
MIN_TIMED=10
if ! [[ $STEPS =~ ^[0-9]+$ ]] || ((STEPS < WARMUP + MIN_TIMED)); then
  echo "cpu_bench: --steps must be at least $((WARMUP + MIN_TIMED)) ($WARMUP warm-up + $MIN_TIMED timed)" >&2
  exit 2
fi
if ! [[ $THREADS =~ ^[1-9][0-9]*$ ]]; then
  echo "cpu_bench: --threads must be a positive integer" >&2
  exit 2
fi

TRAINER=${BOULDER_TRAINER:-${BUILD_DIR:-build}/bin/boulder-trainer}
PYTHON=${PYTHON:-/usr/bin/python3}
SPEC=examples/minigpt-cpu.yaml
BATCH=8
SEQ=64
WORKLOAD="minigpt b${BATCH}x${SEQ}"

if [[ ! -x $TRAINER ]]; then
  echo "cpu_bench: $TRAINER not found; build it first (bash scripts/build.sh, or set BOULDER_TRAINER)" >&2
  exit 1
fi
if [[ ! -f $SPEC ]]; then
  echo "cpu_bench: $SPEC not found" >&2
  exit 1
fi

# Debian's torch links the generic libblas.so.3; libopenblas0 makes that OpenBLAS, as Boulder
# uses, instead of the much slower reference BLAS.
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
if ! "$PYTHON" -c 'import torch' 2>/dev/null || ! have_pkg libopenblas0; then
  echo "cpu_bench: installing Debian's python3-torch and libopenblas0 (benchmark dependency only)"
  SUDO=""
  if [[ $(id -u) != 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends python3-torch libopenblas0
  if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "cpu_bench: $PYTHON still cannot import torch (Debian's python3-torch is for /usr/bin/python3; set PYTHON)" >&2
    exit 1
  fi
fi

# Both sides get the same thread budget: OpenBLAS and OpenMP size their pools from these.
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS

DATE=$(date -u +%Y-%m-%d)
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== Boulder: $TRAINER, $STEPS steps, $THREADS threads"
# The overrides pin the benchmark's config whatever the example file says, print every step,
# and skip the greedy generation after training (not part of a step).
"$PYTHON" bench/trainer_bench.py --workload "$WORKLOAD" --implementation boulder-cpu \
  --precision fp32 --batch $BATCH --seq $SEQ --warmup $WARMUP --min-timed $MIN_TIMED \
  --json "$TMP/boulder.json" -- \
  "$TRAINER" --spec "$SPEC" --threads "$THREADS" \
  --set model.preset=minigpt --set training.steps="$STEPS" --set training.batch_size=$BATCH \
  --set training.seq_len=$SEQ --set precision=fp32 --set training.grad_clip=1.0 \
  --set training.weight_decay=0 --set training.log_every_steps=1 --set generation.tokens=0 \
  --set resources.backend=cpu

echo "== PyTorch: $PYTHON, $STEPS steps, $THREADS threads"
"$PYTHON" bench/pytorch_reference.py --device cpu --preset minigpt --batch $BATCH --seq $SEQ \
  --precision fp32 --mode eager --steps "$STEPS" --warmup $WARMUP --threads "$THREADS" \
  --workload "$WORKLOAD" --json "$TMP/pytorch.json"

BLAS=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["blas"])' "$TMP/pytorch.json")
if [[ $BLAS != openblas ]]; then
  echo "cpu_bench: warning: PyTorch ran on '$BLAS', not OpenBLAS: the comparison is not like for like" >&2
fi

echo "== Report"
"$PYTHON" bench/report.py --title "CPU training step: Boulder vs PyTorch (seed mini-GPT, batch $BATCH x $SEQ, FP32, $THREADS threads)" \
  --baseline pytorch-eager --target boulder-cpu=1.3 \
  --note "ms/step: median over steps $((WARMUP + 1))..$STEPS; speedup = PyTorch ms/step / ms/step; peak memory: the process's peak RSS (ru_maxrss)." \
  --note "Produced by bench/cpu_bench.sh --steps $STEPS --threads $THREADS." \
  --md "bench/cpu-$DATE.md" --json "bench/results/cpu-$DATE-$COMMIT.json" \
  "$TMP/boulder.json" "$TMP/pytorch.json"
