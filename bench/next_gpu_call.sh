#!/usr/bin/env bash
# The next one-GPU call (session 24): the split master weights' step time, A against B. With
# BOULDER_MASTER_WEIGHTS=split and =fp32 alternating, Boulder alone (no PyTorch rows): BF16
# and FP8 on hidden-2048 and GPT-2, BF16 on the seed, and before that the GPU tests the split
# layout touches (cuda_ops_test's AdamW tests; engine_model_gpu_test, the whole step against
# the CPU backend and the 200-step seed job, with split). About 6 minutes. (Session 23's
# contents, the split layout's first GPU tests and the table: see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer cuda_ops_test engine_model_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/tests/cuda_ops_test \
#     build/tests/engine_model_gpu_test
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
  timeout 240 env "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$W/$name.log" | tr '\n' ' ') $((SECONDS - start))s" | tee -a "$S"
}
t cuda_ops_adamw .gpu/bin/cuda_ops_test --gtest_filter='*AdamW*'
t model_gpu_split BOULDER_MASTER_WEIGHTS=split .gpu/bin/engine_model_gpu_test
grep -h -E "loss|stride" "$W/model_gpu_split.log" | tail -4 | tee -a "$S"
grep -h -E "FAILED|Failure" -A8 "$W"/*.log | head -60 > "$OUT/failures.txt"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, precision, BOULDER_MASTER_WEIGHTS
for spec in "h2048 bf16 split" "h2048 bf16 fp32" "h2048 bf16 split" "h2048 bf16 fp32" \
  "gpt2 bf16 split" "gpt2 bf16 fp32" "gpt2 bf16 split" "gpt2 bf16 fp32" \
  "h2048 fp8 split" "h2048 fp8 fp32" "h2048 fp8 split" "h2048 fp8 fp32" \
  "gpt2 fp8 split" "gpt2 fp8 fp32" "seed bf16 split" "seed bf16 fp32"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_MASTER_WEIGHTS=$3 timeout 100 bench/gpu_bench.sh "$W/run$n" \
    --workloads "$1" --precisions "$2" --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 $2 master=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 $2 master=$3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
