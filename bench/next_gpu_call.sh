#!/usr/bin/env bash
# The next one-GPU call (session 16): the one-pass attention backward (attention_bwd_fused_sm90.cuh)
# on the GPU. Its GPU tests (the attention ops against the CPU backend in both modes, the
# 200-step seed job, the graphed steps, the recompute modes), attention_bench (one pass against
# the deterministic two kernels), then BF16 steps with BOULDER_ATTENTION_BACKWARD two-kernel /
# one-pass alternating, and a per-op profile of BF16 GPT-2 and hidden-2048 (where the time goes
# now). About 6-7 minutes.
#
# Here (build, then bundle; the bundle must come from the commit being measured):
#   cmake --build build --target boulder-trainer attention_bench cuda_ops_test \
#     engine_step_graph_gpu_test engine_model_gpu_test engine_model_features_gpu_test
#   rm -rf .gpu .gpuz/gpu.tar.xz && mkdir -p .gpuz
#   ../shared/tools/gpu-bundle .gpu build/bin/boulder-trainer build/bin/attention_bench \
#     build/tests/cuda_ops_test build/tests/engine_step_graph_gpu_test \
#     build/tests/engine_model_gpu_test build/tests/engine_model_features_gpu_test
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
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader \
  | tee -a "$S"
test_line() {  # NAME LOG RC SECONDS
  echo "$1 rc=$3 $(grep -E '^\[  (PASSED|FAILED) ' "$2" | tr '\n' ' ')$4s" | tee -a "$S"
}
run_test() {  # NAME [ARGS...]
  local t=$1 s
  shift
  s=$(date +%s)
  timeout 240 ".gpu/bin/$t" "$@" > "$W/$t.log" 2>&1
  test_line "$t $*" "$W/$t.log" $? $(($(date +%s) - s))
}
run_test cuda_ops_test --gtest_filter='*Attention*'
run_test engine_step_graph_gpu_test
run_test engine_model_features_gpu_test
run_test engine_model_gpu_test
grep -h -E "Failure|Expected|Which is|differ|tolerance" "$W"/*.log | head -16 | tee -a "$S"
grep -h -E "loss|stride" "$W/engine_model_gpu_test.log" | tail -4 | tee -a "$S"
timeout 120 .gpu/bin/attention_bench --iters 30 > "$OUT/attention_bench.log" 2>&1
echo "attention_bench rc=$?" | tee -a "$S"
grep -E "bwd|as trained" "$OUT/attention_bench.log" | tee -a "$S"

export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
n=0
# workload, BOULDER_ATTENTION_BACKWARD
for spec in "gpt2 two-kernel" "gpt2 one-pass" "gpt2 two-kernel" "gpt2 one-pass" \
  "h2048 two-kernel" "h2048 one-pass" "h2048 two-kernel" "h2048 one-pass" \
  "seed two-kernel" "seed one-pass"; do
  set -- $spec
  n=$((n + 1))
  BOULDER_ATTENTION_BACKWARD=$2 timeout 150 bench/gpu_bench.sh "$W/run$n" --workloads "$1" \
    --precisions bf16 --modes "" > "$W/run$n.log" 2>&1
  if [[ -f $W/run$n/gpu-bench.json ]]; then
    python3 -c "
import json
r = json.load(open('$W/run$n/gpu-bench.json'))[0]
print('run $n: $1 bf16 $2 ms/step %.3f peak %d' % (r['ms_per_step'], r['peak_memory_bytes']))
" | tee -a "$S"
  else
    echo "run $n: $1 bf16 $2: no result; its log ends:" | tee -a "$S"
    tail -n 3 "$W/run$n.log" | tee -a "$S"
  fi
done
# Where the time goes (op by op, device time), one-pass backward.
for w in gpt2 h2048; do
  case $w in
    gpt2) model=(--set model.preset=gpt2 --set model.tie_embeddings=false --set training.batch_size=16
                 --set training.seq_len=1024) ;;
    h2048) model=(--set model.hidden=2048 --set model.heads=16 --set model.layers=8
                  --set model.ffn=8192 --set model.context=1024 --set training.batch_size=8
                  --set training.seq_len=1024) ;;
  esac
  BOULDER_PROFILE_KERNELS=1 timeout 120 .gpu/bin/boulder-trainer --spec examples/minigpt.yaml \
    "${model[@]}" --set training.log_every_steps=1 --set generation.tokens=0 --set precision=bf16 \
    --backend cuda --set training.steps=12 > "$W/profile-$w.log" 2>&1
  echo "profile $w rc=$?" | tee -a "$S"
  sed -n '/device time per op/,$p' "$W/profile-$w.log" > "$OUT/profile-$w-bf16.txt"
done
head -c 3000 "$OUT/profile-gpt2-bf16.txt"
