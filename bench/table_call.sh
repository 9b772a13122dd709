#!/usr/bin/env bash
# The issue table's call (issues 3 and 4): bench/gpu_bench.sh on the three workloads, Boulder
# BF16 and FP8 against PyTorch eager and reduce-overhead, from a bundle made as
# bench/next_gpu_call.sh's header says (boulder-trainer is all it needs). About 7 minutes.
#   BOULDER_COMMIT=<commit> bash bench/table_call.sh   (on the device machine; OUT is set)
# Brings back gpu-bench.md, gpu-bench.json and the tail of each run's log (the device tool
# returns at most 8 files). Environment settings (BOULDER_FP8_GEMM_GELU, ...) pass through to
# the trainer; the table's note must name any that differ from the commit's defaults.
# TABLE_WORKLOADS picks and orders the workloads (default "seed gpt2 h2048"; the table is
# written after each, so a run cut short keeps the ones done).
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz && ! -d .gpu ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
export NCCL_NVLS_ENABLE=0
export BOULDER_COMMIT=${BOULDER_COMMIT:-unknown} BOULDER_TRAINER=$PWD/.gpu/bin/boulder-trainer
W=/tmp/table-call
rm -rf "$W"
timeout "${TABLE_TIMEOUT:-560}" bench/gpu_bench.sh "$W" --modes "eager reduce-overhead" \
  --workloads "${TABLE_WORKLOADS:-seed gpt2 h2048}" \
  > "$OUT/gpu_bench.log" 2>&1
echo "gpu_bench rc=$?"
cp "$W/gpu-bench.md" "$W/gpu-bench.json" "$OUT/" 2>/dev/null
for f in "$W"/*.log; do echo "== $f"; tail -n 4 "$f"; done > "$OUT/run-logs-tails.txt" 2>&1
cat "$OUT/gpu-bench.md" 2>/dev/null || tail -n 20 "$OUT/gpu_bench.log"
