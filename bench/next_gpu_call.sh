#!/usr/bin/env bash
# The next one-GPU call: the attention backward with dQ from the stored dS
# (AttentionDq::kStoredDs, attention_bwd_sm90.cuh) on the GPU for the first time. Its GPU tests
# (cuda_ops_test's attention cases against the CPU backend, both dQ ways, stored dS run twice
# bit-identical; the 200-step seed job with BOULDER_ATTENTION_DQ=stored), then attention_bench
# (both dQ ways per shape), then steps with recompute and stored, alternating: BF16 on the three
# workloads, FP8 on GPT-2 and hidden-2048. About 6 minutes. (The previous contents measured our
# BF16 GEMM, bench/bf16-gemm-2026-12-07.md: see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer attention_bench cuda_ops_test \
#     engine_model_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/bin/attention_bench \
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
timeout 150 .gpu/bin/cuda_ops_test --gtest_filter='*Attention*' > "$W/ops.log" 2>&1
test_line "cuda_ops_test *Attention*" "$W/ops.log" $? $(($(date +%s) - s))
s=$(date +%s)
BOULDER_ATTENTION_DQ=stored timeout 200 .gpu/bin/engine_model_gpu_test > "$W/model-stored.log" 2>&1
test_line "engine_model_gpu_test (BOULDER_ATTENTION_DQ=stored)" "$W/model-stored.log" $? \
  $(($(date +%s) - s))
grep -h -E "Failure|Expected|Which is|differ|tolerance|rror" "$W"/*.log | head -20 | tee -a "$S"
grep -h -E "loss|stride" "$W/model-stored.log" | tail -4 | tee -a "$S"
cp "$W/ops.log" "$OUT/ops.log"
timeout 120 .gpu/bin/attention_bench --iters 50 > "$OUT/attention_bench.log" 2>&1
echo "attention_bench rc=$?" | tee -a "$S"
cat "$OUT/attention_bench.log" >> "$S"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, precision, BOULDER_ATTENTION_DQ
for spec in "h2048 bf16 recompute" "h2048 bf16 stored" "h2048 bf16 recompute" "h2048 bf16 stored" \
  "gpt2 bf16 recompute" "gpt2 bf16 stored" "gpt2 bf16 recompute" "gpt2 bf16 stored" \
  "seed bf16 recompute" "seed bf16 stored" \
  "h2048 fp8 recompute" "h2048 fp8 stored" "gpt2 fp8 recompute" "gpt2 fp8 stored"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_ATTENTION_DQ=$3 timeout 100 bench/gpu_bench.sh "$W/run$n" \
    --workloads "$1" --precisions "$2" --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 $2 dQ=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 $2 dQ=$3: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
