#!/usr/bin/env python3
"""Where cuBLASLt's FP8 GEMMs lose time on the benchmark workloads' shapes: a probe for the
decision whether Boulder needs an FP8 GEMM of its own (bench/gpu-2026-12-04.md, run 15).

For each FP8 forward/data-gradient shape of GPT-2 and hidden-2048 (M tokens x N outputs, K
inner; TN, E4M3 x E4M3, fast accumulation, as the trainer's forward runs them) it times
torch._scaled_mm (cuBLASLt underneath, as in Boulder) with a BF16 output, with an E4M3 output
(half the output bytes) and with a BF16 output on twice the rows (twice the tiles per call),
and prints each against two floors: the FLOPs at the card's measured FP8 ceiling (the best
TFLOP/s of the run's large-K shapes) and the bytes (A, B, D once each) at its measured copy
bandwidth. A shape whose time is near the sum of the two floors rather than their maximum is
not overlapping its epilogue with its products; one that speeds up with an FP8 output is
spending its time writing D.

    python3 bench/fp8_gemm_probe.py [--iters 50] [--warmup 10]

Medians of CUDA event timings over three rotated input sets (fresh N(0, 1) values cast to
E4M3), after a warm-up; the copy bandwidth is a 2 GiB device-to-device copy (bytes read +
written).
"""
import argparse
import sys

from attention_sdpa import median_ms  # CUDA-event median, the same timing as attention_bench

# name: (M, N, K); M = the micro-batch's tokens.
SHAPES = [
    ("gpt2 fc1 fwd / fc2 dgrad", 16384, 3072, 768),
    ("gpt2 qkv fwd", 16384, 2304, 768),
    ("gpt2 proj fwd / dgrad", 16384, 768, 768),
    ("gpt2 fc2 fwd / fc1 dgrad", 16384, 768, 3072),
    ("gpt2 qkv dgrad", 16384, 768, 2304),
    ("h2048 fc1 fwd / fc2 dgrad", 8192, 8192, 2048),
    ("h2048 fc2 fwd / fc1 dgrad", 8192, 2048, 8192),
    ("h2048 qkv fwd", 8192, 6144, 2048),
    ("h2048 proj fwd / dgrad", 8192, 2048, 2048),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("fp8_gemm_probe.py: no CUDA device")
    e4m3 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda", dtype=torch.float32)

    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_ms(torch, lambda i: dst.copy_(src), args.warmup, args.iters)
    copy_tbs = 2 * src.numel() / (copy_ms * 1e-3) / 1e12
    del src, dst

    def run(M, N, K, out_dtype):
        sets = []
        for _ in range(3):
            a = torch.randn(M, K, device="cuda").to(e4m3)
            w = torch.randn(N, K, device="cuda").to(e4m3)  # row-major [N, K]: K-major, as TN
            sets.append((a, w))
        kw = {"out_dtype": out_dtype, "use_fast_accum": True}
        if out_dtype == e4m3:
            kw["scale_result"] = one

        def call(i):
            a, w = sets[i % 3]
            torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, **kw)

        ms = median_ms(torch, call, args.warmup, args.iters)
        del sets
        return ms

    rows = []
    for name, M, N, K in SHAPES:
        try:
            f8 = run(M, N, K, e4m3)
        except RuntimeError as e:  # an FP8 output this PyTorch/cuBLASLt does not offer
            print(f"# {name}: E4M3 output failed: {str(e).splitlines()[0]}")
            f8 = float("nan")
        rows.append((name, M, N, K, run(M, N, K, torch.bfloat16), f8,
                     run(2 * M, N, K, torch.bfloat16)))
    peak = max(2.0 * M * N * K / (bf * 1e-3) / 1e12 for _, M, N, K, bf, _, _ in rows)

    print(f"# {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__} torch._scaled_mm; "
          f"median of {args.iters} after {args.warmup} warm-up")
    print(f"# copy bandwidth {copy_tbs:.2f} TB/s (read + write); FP8 ceiling taken as the best "
          f"shape's {peak:.0f} TFLOP/s")
    print(f"{'shape':<28} {'M':>6} {'N':>5} {'K':>5} {'bf16 D ms':>10} {'TFLOP/s':>8} "
          f"{'e4m3 D ms':>10} {'2M bf16 ms/2':>13} {'flop floor':>10} {'byte floor':>10}")
    for name, M, N, K, bf, f8, bf2 in rows:
        flop_floor = 2.0 * M * N * K / (peak * 1e12) * 1e3
        byte_floor = (M * K + N * K + 2 * M * N) / (copy_tbs * 1e12) * 1e3
        print(f"{name:<28} {M:>6} {N:>5} {K:>5} {bf:>10.4f} "
              f"{2.0 * M * N * K / (bf * 1e-3) / 1e12:>8.0f} {f8:>10.4f} {bf2 / 2:>13.4f} "
              f"{flop_floor:>10.4f} {byte_floor:>10.4f}")


if __name__ == "__main__":
    main()
