#!/usr/bin/env bash
# The next one-GPU call: our Hopper BF16 GEMM (bf16_gemm_sm90.h) on the GPU for the first time.
# Its GPU tests (cuda_ops_test's OwnBf16GemmForward against the CPU backend, every tile; the
# MatmulWithEpilogues test and the 200-step seed job with BOULDER_BF16_GEMM=own), then
# bf16_gemm_bench (ours against cuBLASLt per Linear forward of each workload), then BF16 steps
# with cuBLASLt and with ours (own-gelu: fc1's forwards only; own: every forward it takes),
# alternating. About 6-7 minutes. (Run 18, this script's previous contents, measured GeluTanh's
# exp2 + rcp form at c80a2da: see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer bf16_gemm_bench cuda_ops_test \
#     engine_model_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/bin/bf16_gemm_bench \
#     build/tests/cuda_ops_test build/tests/engine_model_gpu_test
#   strip .gpu/bin/*; tar -cf - .gpu | xz -T2 -3 > .gpuz/gpu.tar.xz
# There (the device tool, carry [".gpuz"]):
#   BOULDER_COMMIT=<commit> bash bench/next_gpu_call.sh
# Writes $OUT/summary.txt (a few lines per step) and a few small logs (the device tool brings
# back a limited number of files: keep them few).
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
export NCCL_NVLS_ENABLE=0
W=/tmp/next-gpu-call
mkdir -p "$W"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee -a "$S"
test_line() {  # NAME LOG RC SECONDS
  echo "$1 rc=$3 $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$2" | tr '\n' ' ')$4s" | tee -a "$S"
}
s=$(date +%s)
timeout 150 .gpu/bin/cuda_ops_test --gtest_filter='*OwnBf16Gemm*:*Matmul*' > "$W/ops.log" 2>&1
test_line "cuda_ops_test (ours, matmul)" "$W/ops.log" $? $(($(date +%s) - s))
s=$(date +%s)
BOULDER_BF16_GEMM=own timeout 150 .gpu/bin/cuda_ops_test --gtest_filter='*Matmul*' \
  > "$W/ops-own.log" 2>&1
test_line "cuda_ops_test Matmul* (BOULDER_BF16_GEMM=own)" "$W/ops-own.log" $? $(($(date +%s) - s))
s=$(date +%s)
BOULDER_BF16_GEMM=own timeout 200 .gpu/bin/engine_model_gpu_test > "$W/model-own.log" 2>&1
test_line "engine_model_gpu_test (BOULDER_BF16_GEMM=own)" "$W/model-own.log" $? \
  $(($(date +%s) - s))
grep -h -E "Failure|Expected|Which is|differ|tolerance|rror" "$W"/*.log | head -20 | tee -a "$S"
grep -h -E "loss|stride" "$W/model-own.log" | tail -4 | tee -a "$S"
cp "$W/ops.log" "$OUT/ops.log"
timeout 150 .gpu/bin/bf16_gemm_bench --reps 20 > "$OUT/bf16_gemm_bench.log" 2>&1
echo "bf16_gemm_bench rc=$?" | tee -a "$S"
cat "$OUT/bf16_gemm_bench.log" >> "$S"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, BOULDER_BF16_GEMM, BOULDER_BF16_GEMM_TILE
for spec in "h2048 cublaslt auto" "h2048 own-gelu auto" "h2048 own-gelu pingpong" \
  "h2048 own auto" "h2048 cublaslt auto" "h2048 own-gelu pingpong" \
  "gpt2 cublaslt auto" "gpt2 own-gelu auto" "gpt2 own-gelu pingpong" "gpt2 own auto" \
  "seed cublaslt auto" "seed own auto"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_BF16_GEMM=$2 BOULDER_BF16_GEMM_TILE=$3 timeout 100 bench/gpu_bench.sh "$W/run$n" \
    --workloads "$1" --precisions bf16 --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 bf16 GEMM=$2 tile=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 bf16 GEMM=$2 tile=$3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
