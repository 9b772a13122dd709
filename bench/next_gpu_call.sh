#!/usr/bin/env bash
# The next one-GPU call: session 22's changes on the GPU for the first time. The GPU tests
# (cuda_ops_test whole: the memory report counting scratch and workspaces, the weight gradient
# written with '=', Memset0Ranges; the FP8 and engine GPU tests: the step graphs with the
# first micro-batch's '=' weight gradients, the 200-step seed job), then steps with
# BOULDER_WEIGHT_GRAD_OVERWRITE on and off, alternating: BF16 on the three workloads, FP8 on
# GPT-2 and hidden-2048. About 7 minutes. (The previous contents measured the stored-dS
# attention backward, bench/attention-dq-2026-12-07.md: see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer cuda_ops_test cuda_fp8_test \
#     engine_fp8_gpu_test engine_step_graph_gpu_test engine_model_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/tests/cuda_ops_test \
#     build/tests/cuda_fp8_test build/tests/engine_fp8_gpu_test \
#     build/tests/engine_step_graph_gpu_test build/tests/engine_model_gpu_test
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
for t in cuda_ops_test cuda_fp8_test engine_fp8_gpu_test engine_step_graph_gpu_test \
  engine_model_gpu_test; do
  s=$(date +%s)
  timeout 200 .gpu/bin/$t > "$W/$t.log" 2>&1
  test_line "$t" "$W/$t.log" $? $(($(date +%s) - s))
done
grep -h -E "Failure|Expected|Which is|differ|tolerance|rror" "$W"/*.log | head -20 | tee -a "$S"
grep -h -E "loss|stride" "$W/engine_model_gpu_test.log" | tail -4 | tee -a "$S"
grep -h -E "FAILED|Failure" -A8 "$W"/*.log | head -60 > "$OUT/failures.txt"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, precision, BOULDER_WEIGHT_GRAD_OVERWRITE
for spec in "h2048 bf16 on" "h2048 bf16 off" "h2048 bf16 on" "h2048 bf16 off" \
  "gpt2 bf16 on" "gpt2 bf16 off" "gpt2 bf16 on" "gpt2 bf16 off" \
  "seed bf16 on" "seed bf16 off" \
  "h2048 fp8 on" "h2048 fp8 off" "gpt2 fp8 on" "gpt2 fp8 off"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_WEIGHT_GRAD_OVERWRITE=$3 timeout 100 bench/gpu_bench.sh "$W/run$n" \
    --workloads "$1" --precisions "$2" --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 $2 overwrite=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 $2 overwrite=$3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
