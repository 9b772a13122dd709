#!/usr/bin/env bash
# GPU benchmark (issues 3 and 4): Boulder's trainer against the PyTorch reference on the same
# card, in one run, on the three workloads of issue 3:
#   seed   mini-GPT (vocab 96, 768 hidden, 12 heads, 4 layers, FFN 3072), batch 32 x 256
#   gpt2   GPT-2 124M (vocab 50257 -> 50304, 12 x 768, context 1024, untied head), 16 x 1024
#   h2048  hidden 2048, 16 heads, 8 layers, FFN 8192, vocab 96, batch 8 x 1024
#
#   bench/gpu_bench.sh OUTDIR [--quick] [--profile | --profile-only] [--workloads "seed gpt2 h2048"]
#                             [--precisions "bf16 fp8"] [--modes "eager compile reduce-overhead"]
#                             [--cuda-graph "auto off"] [--deterministic] [--set "KEY=VALUE ..."]
#
# Boulder runs once per precision (bf16, and fp8: delayed scaling, needs compute capability
# 8.9+; each row's precision column says which); PyTorch runs in BF16 autocast.
# --cuda-graph picks Boulder's training.cuda_graph settings, one run each (default "auto": the
# steady-state step replayed from a CUDA graph; "off" runs every step op by op, as row
# implementation "boulder-eager"; each row's cuda_graph_steps counts its timed steps replayed).
# --deterministic also times each Boulder precision with training.deterministic: true (GEMM
# algorithms the heuristic's first pick instead of autotuned; attention on sm_80 without
# atomics), as implementation "boulder-deterministic": what bit-reproducible runs cost.
# --set adds spec settings to every Boulder run (e.g. "training.activation_checkpointing=gelu",
# for A/B runs against another setting than the default; the rows do not record them).
# --modes picks the PyTorch modes (default all three); --quick times PyTorch eager only (no torch.compile: minutes of compilation). --profile first
# runs each workload's trainer for 12 steps with BOULDER_PROFILE_KERNELS=1 and keeps its
# per-op device-time table in OUTDIR/profile-WORKLOAD-PRECISION.log (where the time goes);
# --profile-only runs those and nothing else (no timed rows, no PyTorch, no table). Writes
# OUTDIR/gpu-bench.md (the table) and OUTDIR/gpu-bench.json (the rows), plus one log per run.
# Environment: BOULDER_COMMIT (the commit measured, recorded in every row; the GPU machine's copy
# of the tree has no .git), BOULDER_TRAINER (default: boulder-trainer on PATH, e.g. from a gpu-bundle),
# PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu_bench.sh OUTDIR [--quick] [--workloads LIST]}; shift
QUICK=0
PROFILE=0
PROFILE_ONLY=0
WORKLOADS="seed gpt2 h2048"
PRECISIONS="bf16 fp8"
MODES="eager compile reduce-overhead"
GRAPHS="auto"
DETERMINISTIC=0
EXTRA=()
while (($#)); do
  case "$1" in
    --deterministic) DETERMINISTIC=1; shift ;;
    --cuda-graph) GRAPHS=$2; shift 2 ;;
    --precisions) PRECISIONS=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --set) for kv in $2; do EXTRA+=(--set "$kv"); done; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --profile) PROFILE=1; shift ;;
    --profile-only) PROFILE=1; PROFILE_ONLY=1; shift ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    *) echo "gpu_bench: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
TRAINER=${BOULDER_TRAINER:-$(command -v boulder-trainer)}
PYTHON=${PYTHON:-python3}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
STEPS=40
WARMUP=10

rows=()
report() {
  "$PYTHON" bench/report.py --title "GPU benchmark: Boulder ${PRECISIONS// //} vs PyTorch BF16 ($GPU)" \
      --md "$OUT/gpu-bench.md" --json "$OUT/gpu-bench.json" "${rows[@]}" > /dev/null
}
for w in $WORKLOADS; do
  case $w in
    seed)  B=32; T=256; model=(--set model.preset=minigpt); pt=(--preset minigpt) ;;
    gpt2)  B=16; T=1024; model=(--set model.preset=gpt2 --set model.tie_embeddings=false); pt=(--preset gpt2) ;;
    h2048) B=8; T=1024
           model=(--set model.hidden=2048 --set model.heads=16 --set model.layers=8 --set model.ffn=8192 --set model.context=1024)
           pt=(--preset minigpt --hidden 2048 --heads 16 --layers 8 --ffn 8192 --context 1024) ;;
    *) echo "gpu_bench: unknown workload $w" >&2; exit 2 ;;
  esac
  name="$w b${B}x${T}"
  echo "== $name"
  for p in $PRECISIONS; do
    common=(--spec examples/minigpt.yaml "${model[@]}" --set training.batch_size=$B
            --set training.seq_len=$T --set training.log_every_steps=1 --set generation.tokens=0
            --set precision=$p --backend cuda "${EXTRA[@]}")
    if ((PROFILE)); then
      BOULDER_PROFILE_KERNELS=1 "$TRAINER" "${common[@]}" --set training.steps=12 \
          > "$OUT/profile-$w-$p.log" 2>&1
      sed -n '/device time per op/,$p' "$OUT/profile-$w-$p.log"
    fi
    ((PROFILE_ONLY)) && continue
    for g in $GRAPHS; do
      impl=boulder
      [[ $g == off ]] && impl=boulder-eager
      [[ $g != off && $g != auto ]] && impl=boulder-graph-$g
      run="$w-$impl-$p"
      "$PYTHON" bench/trainer_bench.py --workload "$name" --implementation $impl --precision $p \
          --gpu "$GPU" --batch $B --seq $T --warmup $WARMUP --json-reports \
          --json "$OUT/$run.json" --log "$OUT/$run.log" -- \
          "$TRAINER" "${common[@]}" --set training.steps=$STEPS --set training.cuda_graph=$g \
          --report-fd 1 --quiet > "$OUT/$run.out" 2>&1 && rows+=("$OUT/$run.json")
      tail -1 "$OUT/$run.out"
    done
    if ((DETERMINISTIC)); then
      run="$w-boulder-deterministic-$p"
      "$PYTHON" bench/trainer_bench.py --workload "$name" --implementation boulder-deterministic \
          --precision $p --gpu "$GPU" --batch $B --seq $T --warmup $WARMUP --json-reports \
          --json "$OUT/$run.json" --log "$OUT/$run.log" -- \
          "$TRAINER" "${common[@]}" --set training.steps=$STEPS --set training.deterministic=true \
          --report-fd 1 --quiet > "$OUT/$run.out" 2>&1 && rows+=("$OUT/$run.json")
      tail -1 "$OUT/$run.out"
    fi
  done
  ((PROFILE_ONLY)) && continue
  modes=$MODES
  ((QUICK)) && modes="eager"
  for m in $modes; do
    "$PYTHON" bench/pytorch_reference.py --device cuda "${pt[@]}" --batch $B --seq $T \
        --precision bf16 --mode $m --steps $STEPS --warmup $WARMUP --workload "$name" \
        --json "$OUT/$w-pytorch-$m.json" > "$OUT/$w-pytorch-$m.log" 2>&1 \
        && rows+=("$OUT/$w-pytorch-$m.json")
    tail -1 "$OUT/$w-pytorch-$m.log"
  done
  report  # after every workload, so a run cut short still leaves its table
done
((PROFILE_ONLY)) || cat "$OUT/gpu-bench.md"
