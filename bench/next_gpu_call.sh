#!/usr/bin/env bash
# The last one-GPU call (run 18 in bench/fp8-gemm-2026-12-04.md, run at c80a2da): GeluTanh in the exp2 + rcp
# form (common.cuh) on the GPU. The GPU tests of every op that computes GELU (the BF16 ops
# against the CPU backend, the fused GELU casts bit for bit against their two-op forms, the
# 200-step seed job), fp8_gemm_bench's fused line (fc1's GEMM casting fc2's input), then FP8
# GPT-2 steps with that fusion off and on, alternating. About 4-5 minutes. (Run 17, this
# script's previous contents, measured session 14's fused casts at 9a32da9.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer fp8_gemm_bench cuda_ops_test cuda_fp8_test \
#     cuda_fp8_gelu_test engine_fp8_gpu_test engine_step_graph_gpu_test engine_model_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/bin/fp8_gemm_bench \
#     build/tests/cuda_ops_test build/tests/cuda_fp8_test build/tests/cuda_fp8_gelu_test \
#     build/tests/engine_fp8_gpu_test build/tests/engine_step_graph_gpu_test \
#     build/tests/engine_model_gpu_test
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
test_line() {  # NAME LOG RC SECONDS
  echo "$1 rc=$3 $(grep -E '^\[  (PASSED|FAILED) ' "$2" | tr '\n' ' ')$4s" | tee -a "$S"
}
for t in cuda_ops_test cuda_fp8_test cuda_fp8_gelu_test engine_fp8_gpu_test \
  engine_step_graph_gpu_test engine_model_gpu_test; do
  s=$(date +%s)
  timeout 240 ".gpu/bin/$t" > "$W/$t.log" 2>&1
  test_line "$t" "$W/$t.log" $? $(($(date +%s) - s))
done
s=$(date +%s)
BOULDER_FP8_GEMM_GELU=on timeout 180 .gpu/bin/engine_fp8_gpu_test > "$W/fused-engine.log" 2>&1
test_line "engine_fp8_gpu_test (BOULDER_FP8_GEMM_GELU=on)" "$W/fused-engine.log" $? \
  $(($(date +%s) - s))
grep -h -E "Failure|Expected|Which is|differ|tolerance" "$W"/*.log | head -16 | tee -a "$S"
grep -h -E "loss|stride" "$W/engine_model_gpu_test.log" | tail -4 | tee -a "$S"
timeout 120 .gpu/bin/fp8_gemm_bench --workloads seed,gpt2 --reps 20 > "$OUT/fp8_gemm_bench.log" 2>&1
echo "fp8_gemm_bench rc=$?" | tee -a "$S"
grep -E "fc1 fwd|per step|fc2 input cast" "$OUT/fp8_gemm_bench.log" | tee -a "$S"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, BOULDER_FP8_GEMM_GELU
for spec in "gpt2 off" "gpt2 on" "gpt2 off" "gpt2 on" "seed off" "seed on"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_FP8_GEMM_GELU=$2 timeout 150 bench/gpu_bench.sh "$W/run$n" --workloads "$1" \
    --precisions fp8 --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 fp8 GEMM_GELU=$2 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 fp8 GEMM_GELU=$2: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
