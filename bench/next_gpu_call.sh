#!/usr/bin/env bash
# The one-GPU call queued since session 13 (bench/fp8-gemm-2026-12-04.md, "Queued"), as one
# script: the GPU tests of what has not run on a GPU yet (the tile choice, the ping-pong kernel,
# fc2's input cast in fc1's epilogue, the projection's input cast in the attention forward),
# fp8_gemm_bench (ping-pong and fused-cast columns), then whole FP8 steps with the fused casts
# off, the GEMM's on, and both on, alternating. About 7-9 minutes.
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer fp8_gemm_bench attention_bench cuda_fp8_test \
#     engine_fp8_gpu_test engine_step_graph_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/bin/fp8_gemm_bench \
#     build/bin/attention_bench \
#     build/tests/cuda_fp8_test build/tests/engine_fp8_gpu_test build/tests/engine_step_graph_gpu_test
#   strip .gpu/bin/*; tar -cf - .gpu | xz -T2 -3 > .gpuz/gpu.tar.xz
# There (the device tool, carry [".gpuz"]):
#   BOULDER_COMMIT=<commit> bash bench/next_gpu_call.sh
# Writes $OUT/summary.txt (a few lines per step) and $OUT/*.json / *.log (small files only).
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
for t in cuda_fp8_test engine_fp8_gpu_test engine_step_graph_gpu_test; do
  s=$(date +%s)
  timeout 180 ".gpu/bin/$t" > "$W/$t.log" 2>&1
  test_line "$t" "$W/$t.log" $? $(($(date +%s) - s))
done
# The Model with the fused casts (off by default until measured).
s=$(date +%s)
BOULDER_FP8_GEMM_GELU=on BOULDER_FP8_ATTENTION_CAST=on timeout 180 .gpu/bin/engine_fp8_gpu_test \
  > "$W/fused-engine.log" 2>&1
test_line "engine_fp8_gpu_test (both fused casts on)" "$W/fused-engine.log" $? \
  $(($(date +%s) - s))
grep -h -E "Failure|Expected|Which is|differ" "$W"/*.log | head -12 | tee -a "$S"
timeout 150 .gpu/bin/fp8_gemm_bench --workloads seed,gpt2,h2048 --reps 20 > "$OUT/fp8_gemm_bench.log" 2>&1
echo "fp8_gemm_bench rc=$?" | tee -a "$S"
grep -E "fwd|per step|fc2 input cast" "$OUT/fp8_gemm_bench.log" | tee -a "$S"
timeout 120 .gpu/bin/attention_bench --shape all --iters 20 > "$OUT/attention_bench.log" 2>&1
echo "attention_bench rc=$?" | tee -a "$S"
grep -E "FP8|codes differ" "$OUT/attention_bench.log" | tee -a "$S"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, BOULDER_FP8_GEMM_GELU, BOULDER_FP8_ATTENTION_CAST
for spec in "gpt2 off off" "gpt2 on off" "gpt2 on on" "gpt2 off off" "gpt2 on off" "gpt2 on on" \
  "seed off off" "seed on on"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_FP8_GEMM_GELU=$2 BOULDER_FP8_ATTENTION_CAST=$3 timeout 150 bench/gpu_bench.sh \
    "$W/run$n" --workloads "$1" --precisions fp8 --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 fp8 GEMM_GELU=$2 ATTENTION_CAST=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
    cp "$W/run$n/gpu-bench.json" "$OUT/run$n.json"
  else
    echo "run $n: $1 fp8 GEMM_GELU=$2 ATTENTION_CAST=$3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
