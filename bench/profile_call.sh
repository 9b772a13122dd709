#!/usr/bin/env bash
# Where the step's time goes (issues 3 and 4: the note for a missed target): bench/gpu_bench.sh
# --profile-only, each workload's trainer for 12 steps with BOULDER_PROFILE_KERNELS=1 (CUDA
# events around every op, steps 2-12, not graphed), BF16 and FP8, from a bundle made as
# bench/next_gpu_call.sh's header says (boulder-trainer is all it needs). About 2 minutes.
#   BOULDER_COMMIT=<commit> bash bench/profile_call.sh   (on the device machine; OUT is set)
# PROFILE_WORKLOADS picks the workloads (default "h2048 gpt2 seed"), PROFILE_PRECISIONS the
# precisions (default "bf16 fp8"). Writes OUT/profile-WORKLOAD-PRECISION.txt (the per-op table,
# or the log's tail where the run failed) and prints the top rows of each.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz && ! -d .gpu ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
export BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
W=/tmp/profile-call
rm -rf "$W"
bench/gpu_bench.sh "$W" --profile-only --workloads "${PROFILE_WORKLOADS:-h2048 gpt2 seed}" \
  --precisions "${PROFILE_PRECISIONS:-bf16 fp8}" > "$OUT/gpu_bench.log" 2>&1
echo "gpu_bench rc=$? (${BOULDER_COMMIT:-unknown})"
for log in "$W"/profile-*.log; do
  txt=$OUT/$(basename "$log" .log).txt
  sed -n '/device time per op/,$p' "$log" > "$txt"
  [[ -s $txt ]] || tail -n 20 "$log" > "$txt"
  echo "== $(basename "$txt")"
  head -n 24 "$txt"
done
