#!/usr/bin/env bash
# The next one-GPU call (session 26): the gradient norm computed bucket by bucket during the
# backward, beside it on a stream of its own (ModelOptions::grad_norm_in_backward,
# BOULDER_GRAD_NORM=backward; off by default until this call has run: BOULDER_GRAD_NORM=step,
# the default, is the single pass after the backward). The GPU tests it
# touches: cuda_ops_test's norm and AdamW tests (NormSquaredBeside: eager, accumulating, in a
# replayed graph), engine_step_graph_gpu_test (GradNormInTheBackwardReplaysAndMatchesOnePass:
# graphed steps bit-identical to eager ones with the option on, BF16 and FP8, the norm equal to
# the single pass's; its trainer-level tests also run again with BOULDER_GRAD_NORM=backward, as
# do engine_fp8_gpu_test's), engine_model_gpu_test (the whole step against the CPU backend,
# the 200-step seed job; the option's default, off). Then Boulder alone (no PyTorch rows), alternating BOULDER_GRAD_NORM =
# backward / step. About 8 minutes. (Session 24's contents: see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer cuda_ops_test engine_model_gpu_test \
#     engine_step_graph_gpu_test engine_fp8_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/tests/cuda_ops_test \
#     build/tests/engine_model_gpu_test build/tests/engine_step_graph_gpu_test \
#     build/tests/engine_fp8_gpu_test
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
t cuda_ops_norm .gpu/bin/cuda_ops_test --gtest_filter='*NormSquared*:*NormAdamW*:*AdamW*'
t step_graph_gpu .gpu/bin/engine_step_graph_gpu_test
t fp8_gpu .gpu/bin/engine_fp8_gpu_test
t step_graph_gpu_norm_backward BOULDER_GRAD_NORM=backward .gpu/bin/engine_step_graph_gpu_test
t fp8_gpu_norm_backward BOULDER_GRAD_NORM=backward .gpu/bin/engine_fp8_gpu_test
t model_gpu .gpu/bin/engine_model_gpu_test
grep -h -E "loss|stride" "$W/model_gpu.log" | tail -4 | tee -a "$S"
grep -h -E "FAILED|Failure" -A8 "$W"/*.log | head -80 > "$OUT/failures.txt"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, precision, where the norm is computed
for spec in "h2048 bf16 backward" "h2048 bf16 step" "h2048 bf16 backward" "h2048 bf16 step" \
  "h2048 bf16 backward" "h2048 bf16 step" \
  "h2048 fp8 backward" "h2048 fp8 step" "h2048 fp8 backward" "h2048 fp8 step" \
  "gpt2 bf16 backward" "gpt2 bf16 step" "gpt2 fp8 backward" "gpt2 fp8 step" \
  "seed bf16 backward" "seed bf16 step"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_GRAD_NORM=$3 timeout 80 bench/gpu_bench.sh "$W/run$n" --workloads "$1" \
    --precisions "$2" --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 $2 norm=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 $2 norm=$3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
mkdir -p "$OUT/logs"
for f in "$W"/run*/*.log; do
  r=$(basename "$(dirname "$f")")
  tail -n 2 "$f" > "$OUT/logs/$r-$(basename "$f")"
done
grep -h "cuda graph" "$W"/run*/*.log 2>/dev/null | sed 's/.*cuda graph/cuda graph/' | sort | uniq -c | tee -a "$S"
