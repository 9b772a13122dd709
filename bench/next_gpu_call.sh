#!/usr/bin/env bash
# The next one-GPU call (session 23): the split master weights (BOULDER_MASTER_WEIGHTS=split,
# kernels/split_master.h) on a GPU for the first time, then the issue table at this commit
# (bench/table_call.sh: the master weights as the commit's default, an FP32 copy). The GPU
# tests: cuda_ops_test's AdamW tests (the split layout against the FP32 copy, bit for bit), and
# with BOULDER_MASTER_WEIGHTS=split the step-graph GPU tests and the checkpoint resume GPU
# test (a checkpoint's FP32 master section written and read through the split form). About
# 8 minutes. (Session 22's contents, the weight-gradient overwrite A/B: see git history.)
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer cuda_ops_test engine_step_graph_gpu_test \
#     engine_resume_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/tests/cuda_ops_test \
#     build/tests/engine_step_graph_gpu_test build/tests/engine_resume_gpu_test
#   strip .gpu/bin/*; tar -cf - .gpu | xz -T2 -3 > .gpuz/gpu.tar.xz
# There (the device tool, carry [".gpuz"]):
#   BOULDER_COMMIT=<commit> bash bench/next_gpu_call.sh
# Writes $OUT/summary.txt, the table's files (bench/table_call.sh) and the tests' log tails.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
export NCCL_NVLS_ENABLE=0
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > "$S"
t() {  # t NAME [ENV=...] BINARY ARGS...: one test binary, its verdict into the summary
  local name=$1; shift
  local start=$SECONDS
  timeout 240 env "$@" > "/tmp/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "/tmp/$name.log" | tr '\n' ' ') $((SECONDS - start))s" >> "$S"
  grep -E '^\[  FAILED  \]|Failure' "/tmp/$name.log" | head -5 >> "$S"
}
t cuda_ops_adamw .gpu/bin/cuda_ops_test --gtest_filter='*AdamW*'
t step_graph_split BOULDER_MASTER_WEIGHTS=split .gpu/bin/engine_step_graph_gpu_test
t resume_split BOULDER_MASTER_WEIGHTS=split .gpu/bin/engine_resume_gpu_test
tail -n 30 /tmp/resume_split.log > "$OUT/resume_split-tail.txt"
TABLE_TIMEOUT=${TABLE_TIMEOUT:-450} bash bench/table_call.sh >> "$S" 2>&1
cat "$S"
