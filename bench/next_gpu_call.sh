#!/usr/bin/env bash
# The next one-GPU call (session 24): the split master weights (now the default) and GELU's
# output kept per layer (activation_checkpointing "none" now keeps it; "gelu" is the old
# "none"), on a GPU for the first time as defaults, and their step time against the old
# defaults. The GPU tests they touch: cuda_ops_test's AdamW tests, engine_model_gpu_test (the
# whole step against the CPU backend, the 200-step seed job), engine_model_features_gpu_test
# (the four checkpointing modes: losses and peak memory), engine_step_graph_gpu_test. Then
# Boulder alone (no PyTorch rows), alternating, three settings:
#   old    BOULDER_MASTER_WEIGHTS=fp32, training.activation_checkpointing=gelu
#   split  BOULDER_MASTER_WEIGHTS=split, training.activation_checkpointing=gelu
#   new    the defaults (split, none)
# About 8 minutes. (Session 23's contents, the split layout's first GPU tests and the table:
# see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer cuda_ops_test engine_model_gpu_test \
#     engine_model_features_gpu_test engine_step_graph_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/tests/cuda_ops_test \
#     build/tests/engine_model_gpu_test build/tests/engine_model_features_gpu_test \
#     build/tests/engine_step_graph_gpu_test
#   strip .gpu/bin/*; tar -cf - .gpu | xz -T2 -3 > .gpuz/gpu.tar.xz
# There (the device tool, carry [".gpuz"]):
#   BOULDER_COMMIT=<commit> bash bench/next_gpu_call.sh
# Writes $OUT/summary.txt (one line per test binary and per run) and the failures, if any.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
export NCCL_NVLS_ENABLE=0
W=/tmp/next-gpu-call
rm -rf "$W" && mkdir -p "$W"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$S"
t() {  # t NAME [ENV=...] BINARY ARGS...: one test binary, its verdict into the summary
  local name=$1; shift
  local start=$SECONDS
  timeout 200 env "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$W/$name.log" | tr '\n' ' ') $((SECONDS - start))s" | tee -a "$S"
}
t cuda_ops_adamw .gpu/bin/cuda_ops_test --gtest_filter='*AdamW*'
t model_gpu .gpu/bin/engine_model_gpu_test
grep -h -E "loss|stride" "$W/model_gpu.log" | tail -4 | tee -a "$S"
t model_features_gpu .gpu/bin/engine_model_features_gpu_test
grep -h "peak bytes" "$W/model_features_gpu.log" | tee -a "$S"
t step_graph_gpu .gpu/bin/engine_step_graph_gpu_test
grep -h -E "FAILED|Failure" -A8 "$W"/*.log | head -80 > "$OUT/failures.txt"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, precision, setting
for spec in "h2048 bf16 old" "h2048 bf16 split" "h2048 bf16 new" \
  "h2048 bf16 old" "h2048 bf16 split" "h2048 bf16 new" \
  "gpt2 bf16 old" "gpt2 bf16 split" "gpt2 bf16 new" \
  "h2048 fp8 old" "h2048 fp8 split" "h2048 fp8 new" \
  "gpt2 fp8 old" "gpt2 fp8 new" "seed bf16 old" "seed bf16 new"; do
  set -- $spec
  n=$((n + 1))
  case $3 in
    old) mw=fp32 ckpt=gelu ;;
    split) mw=split ckpt=gelu ;;
    new) mw=split ckpt=none ;;
  esac
  BOULDER_MASTER_WEIGHTS=$mw timeout 80 bench/gpu_bench.sh "$W/run$n" --workloads "$1" \
    --precisions "$2" --modes "" --set "training.activation_checkpointing=$ckpt" \
    > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 $2 $3 (master $mw, ckpt $ckpt) ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 $2 $3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
grep -h "fp8: weight" "$W"/run1[0-4]/*.log 2>/dev/null | sort | uniq -c | tee -a "$S"
