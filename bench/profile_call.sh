#!/usr/bin/env bash
# Where the step's time goes (issues 3 and 4: the note for a missed target): each workload's
# trainer for 12 steps with BOULDER_PROFILE_KERNELS=1 (CUDA events around every op, steps 2-12,
# not graphed), BF16 and FP8, from a bundle made as bench/next_gpu_call.sh's header says
# (boulder-trainer is all it needs). About 2 minutes.
#   BOULDER_COMMIT=<commit> bash bench/profile_call.sh   (on the device machine; OUT is set)
# PROFILE_WORKLOADS picks the workloads (default "h2048 gpt2 seed"), PROFILE_PRECISIONS the
# precisions (default "bf16 fp8"). Writes OUT/profile-WORKLOAD-PRECISION.txt (the per-op table)
# and prints the top rows of each.
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz && ! -d .gpu ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
TRAINER=$PWD/.gpu/bin/boulder-trainer
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for w in ${PROFILE_WORKLOADS:-h2048 gpt2 seed}; do
  case $w in
    seed)  B=32; T=256; model=(--set model.preset=minigpt) ;;
    gpt2)  B=16; T=1024; model=(--set model.preset=gpt2 --set model.tie_embeddings=false) ;;
    h2048) B=8; T=1024
           model=(--set model.hidden=2048 --set model.heads=16 --set model.layers=8
                  --set model.ffn=8192 --set model.context=1024) ;;
    *) echo "profile_call: unknown workload $w" >&2; exit 2 ;;
  esac
  for p in ${PROFILE_PRECISIONS:-bf16 fp8}; do
    log=/tmp/profile-$w-$p.log
    BOULDER_PROFILE_KERNELS=1 timeout 120 "$TRAINER" --spec examples/minigpt.yaml "${model[@]}" \
        --set training.batch_size=$B --set training.seq_len=$T --set training.log_every_steps=1 \
        --set generation.tokens=0 --set precision=$p --backend cuda --set training.steps=12 \
        > "$log" 2>&1
    echo "== $w $p rc=$? (${BOULDER_COMMIT:-unknown})"
    sed -n '/device time per op/,$p' "$log" > "$OUT/profile-$w-$p.txt"
    [[ -s $OUT/profile-$w-$p.txt ]] || tail -n 20 "$log" > "$OUT/profile-$w-$p.txt"
    head -n 24 "$OUT/profile-$w-$p.txt"
  done
done
