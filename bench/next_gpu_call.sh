#!/usr/bin/env bash
# The next one-GPU calls (session 26; no device was lent in that session, so none of this has
# run yet). Two changes, both off by default until these calls have measured them:
#  - the gradient norm computed bucket by bucket during the backward, beside it on a stream of
#    its own (ModelOptions::grad_norm_in_backward, BOULDER_GRAD_NORM=backward; the default
#    "step" is the single pass after the backward);
#  - the pipelined wgmma attention forward (attention_fwd_sm90_pipelined.cuh,
#    BOULDER_ATTENTION_FWD=pipelined|pipelined1; the default "plain" is today's kernel).
# Parts (arguments, in order; about 5 minutes each, so two calls):
#   tests      cuda_ops_test's norm, AdamW and attention tests (NormSquaredBeside eager,
#              accumulating and in a replayed graph; the pipelined forwards bit-identical to the
#              plain one), engine_step_graph_gpu_test (GradNormInTheBackwardReplaysAndMatches-
#              OnePass; its trainer-level tests again with BOULDER_GRAD_NORM=backward, as
#              engine_fp8_gpu_test's), engine_model_gpu_test (the whole step against the CPU,
#              the 200-step seed job) with the defaults and BOULDER_ATTENTION_FWD=pipelined
#   attention  attention_bench (the three forwards, per layer call, and whether they agree bit
#              for bit) and PyTorch SDPA on the same shapes; then steps alternating
#              BOULDER_ATTENTION_FWD = plain / pipelined / pipelined1
#   norm       steps alternating BOULDER_GRAD_NORM = backward / step
# Boulder rows only (no PyTorch training rows: bench/table_call.sh makes the issue table).
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer cuda_ops_test engine_model_gpu_test \
#     engine_step_graph_gpu_test engine_fp8_gpu_test attention_bench
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/tests/cuda_ops_test \
#     build/tests/engine_model_gpu_test build/tests/engine_step_graph_gpu_test \
#     build/tests/engine_fp8_gpu_test build/bin/attention_bench
#   strip .gpu/bin/*; tar -cf - .gpu | xz -T2 -3 > .gpuz/gpu.tar.xz
# There (the device tool, carry [".gpuz"]):
#   BOULDER_COMMIT=<commit> bash bench/next_gpu_call.sh tests attention
#   BOULDER_COMMIT=<commit> bash bench/next_gpu_call.sh norm
# Writes $OUT/summary.txt (one line per test binary and per run), $OUT/failures.txt and the
# runs' last log lines under $OUT/logs.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
(($#)) || set -- tests attention
if [[ -f .gpuz/gpu.tar.xz && ! -d .gpu/bin ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
export NCCL_NVLS_ENABLE=0
W=/tmp/next-gpu-call
mkdir -p "$W" "$OUT/logs"
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$S"
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
t() {  # t NAME [ENV=...] BINARY ARGS...: one test binary, its verdict into the summary
  local name=$1; shift
  local start=$SECONDS
  timeout 200 env "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$W/$name.log" | tr '\n' ' ') $((SECONDS - start))s" | tee -a "$S"
}
n=0
runs() {  # runs ENV_NAME "workload precision value" ...: one timed trainer run each
  local var=$1; shift
  local spec
  for spec in "$@"; do
    set -- $spec
    n=$((n + 1))
    env "$var=$3" timeout 80 bench/gpu_bench.sh "$W/run$n" --workloads "$1" --precisions "$2" \
      --modes "" > "$W/run$n.log" 2>&1
    if [[ -f $W/run$n/gpu-bench.json ]]; then
      python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 $2 $var=$3 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
      for f in "$W/run$n"/*.log; do tail -n 2 "$f" > "$OUT/logs/run$n-$(basename "$f")"; done
    else
      echo "run $n: $1 $2 $var=$3: no result; its log ends:" | tee -a "$S"
      tail -n 3 "$W/run$n.log" | tee -a "$S"
    fi
  done
}
for part in "$@"; do
  echo "== $part" | tee -a "$S"
  case $part in
    tests)
      t cuda_ops .gpu/bin/cuda_ops_test --gtest_filter='*NormSquared*:*NormAdamW*:*AdamW*:*Attention*'
      t step_graph_gpu .gpu/bin/engine_step_graph_gpu_test
      t step_graph_gpu_norm_backward BOULDER_GRAD_NORM=backward .gpu/bin/engine_step_graph_gpu_test
      t fp8_gpu_norm_backward BOULDER_GRAD_NORM=backward .gpu/bin/engine_fp8_gpu_test
      t fp8_gpu_attention_pipelined BOULDER_ATTENTION_FWD=pipelined .gpu/bin/engine_fp8_gpu_test
      t model_gpu_attention_pipelined BOULDER_ATTENTION_FWD=pipelined .gpu/bin/engine_model_gpu_test
      grep -h -E "loss|stride" "$W/model_gpu_attention_pipelined.log" | tail -4 | tee -a "$S"
      grep -h -E "FAILED|Failure" -A8 "$W"/*.log | head -80 >> "$OUT/failures.txt"
      ;;
    attention)
      timeout 150 .gpu/bin/attention_bench --iters 50 > "$W/attention_bench.log" 2>&1
      echo "attention_bench rc=$?" | tee -a "$S"
      grep -E "forward|fwd|differ" "$W/attention_bench.log" | tee -a "$S"
      timeout 100 python3 bench/attention_sdpa.py > "$W/attention_sdpa.log" 2>&1
      grep -E "forward|fwd" "$W/attention_sdpa.log" | tee -a "$S"
      cp "$W/attention_bench.log" "$W/attention_sdpa.log" "$OUT/logs/"
      runs BOULDER_ATTENTION_FWD "h2048 bf16 plain" "h2048 bf16 pipelined" "h2048 bf16 pipelined1" \
        "h2048 bf16 plain" "h2048 bf16 pipelined" "h2048 bf16 pipelined1" \
        "gpt2 bf16 plain" "gpt2 bf16 pipelined" "gpt2 bf16 pipelined1" \
        "h2048 fp8 plain" "h2048 fp8 pipelined" "seed bf16 plain" "seed bf16 pipelined"
      ;;
    norm)
      runs BOULDER_GRAD_NORM "h2048 bf16 backward" "h2048 bf16 step" "h2048 bf16 backward" \
        "h2048 bf16 step" "h2048 bf16 backward" "h2048 bf16 step" \
        "h2048 fp8 backward" "h2048 fp8 step" "h2048 fp8 backward" "h2048 fp8 step" \
        "gpt2 bf16 backward" "gpt2 bf16 step" "gpt2 fp8 backward" "gpt2 fp8 step" \
        "seed bf16 backward" "seed bf16 step"
      ;;
    *) echo "next_gpu_call.sh: unknown part '$part' (tests, attention, norm)" | tee -a "$S" ;;
  esac
done
grep -h "cuda graph: captured" "$W"/run*/*.log 2>/dev/null | sed 's/.*cuda graph/cuda graph/' | sort | uniq -c | tee -a "$S"
