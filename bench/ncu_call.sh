#!/usr/bin/env bash
# A profiling call (Nsight Compute, hardware counters; the device tool's Firecracker machines):
# where the fused GELU-cast GEMM epilogue and the attention backward spend their time. For each
# kernel: speed of light, occupancy, warp states (with the stall reasons), and the 25 SASS lines
# with the most stall samples. Bundle fp8_gemm_bench and attention_bench as next_gpu_call.sh's
# header says. Run once at 3628ed5 (bench/attention-notes.md, 2026-12-05): that run's source
# page parse failed (fixed since, not rerun) and its details lacked the stall breakdown
# (--print-details all since, not rerun).
#   bash bench/ncu_call.sh   (on the device machine; OUT is set)
set -u
cd "$(dirname "$0")/.."
: "${OUT:?run on the device machine, where OUT is set}"
if [[ -f .gpuz/gpu.tar.xz ]]; then tar -xJf .gpuz/gpu.tar.xz; fi
. .gpu/env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
W=/tmp/ncu-call
mkdir -p "$W"
top_stalls() {  # REPORT: the SASS lines with the most warp stall samples
  "$NCU" --import "$1" --page source --csv --print-source sass 2>/dev/null > "$1.csv"
  python3 - "$1.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
# The page starts with the kernel's name; the column header is the row that names the samples.
at = next((k for k, r in enumerate(rows)
           if any(h.startswith("Warp Stall Sampling (All") for h in r)), None)
if at is None:
    print("no stall samples on the source page; its first rows:", rows[:3]); sys.exit()
head, rows = rows[at], rows[at:]
col = next(i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All"))
src = next((i for i, h in enumerate(head) if h == "Source"), 1)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[1:] if len(r) > col]
total = sum(num(r[col]) for r in body) or 1
print(f"total stall samples {total:.0f}; top lines (share, samples, sass):")
for r in sorted(body, key=lambda r: -num(r[col]))[:25]:
    print(f"{num(r[col]) / total:6.1%} {num(r[col]):8.0f}  {r[src][:110]}")
PY
}
profile() {  # NAME REGEX COMMAND...
  local name=$1 regex=$2; shift 2
  timeout 150 "$NCU" --clock-control none --kernel-name-base mangled --kernel-name "regex:$regex" \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --import-source no -f -o "$W/$name" "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$?"
  {
    "$NCU" --import "$W/$name.ncu-rep" --page details --print-details all 2>&1
    top_stalls "$W/$name.ncu-rep"
  } > "$OUT/$name.txt" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Issued Ipc|No Eligible" "$OUT/$name.txt" | head -8
  tail -n 26 "$OUT/$name.txt" | head -8
}
G=.gpu/bin/fp8_gemm_bench
profile gemm-fused 'Fp8GemmSm90KernelILi(128|256)ELb1ELb1ELb1ELb1E' $G --workloads gpt2 --reps 1
profile gemm-plain 'Fp8GemmSm90KernelILi256ELb1ELb1ELb1ELb0E' $G --workloads gpt2 --reps 1
profile gemm-fused-pingpong 'Fp8GemmSm90PingPongKernelILb1ELb1ELb1E' $G --workloads gpt2 --reps 1
A=.gpu/bin/attention_bench
profile attn-bwd-kv 'FlashBackwardKVSm90Kernel' $A --shape gpt2 --iters 1 --warmup 0
profile attn-bwd-q 'FlashBackwardQSm90Kernel' $A --shape gpt2 --iters 1 --warmup 0
profile attn-bwd-kv-h2048 'FlashBackwardKVSm90Kernel' $A --shape h2048 --iters 1 --warmup 0
