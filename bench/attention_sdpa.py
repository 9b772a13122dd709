#!/usr/bin/env python3
"""PyTorch's causal scaled_dot_product_attention on attention_bench's shapes, in its format.

Run right after build/bin/attention_bench on the same GPU to compare the two in one call:

    build/bin/attention_bench && python3 bench/attention_sdpa.py

Forward is timed alone; backward as (forward + backward) minus forward, both medians of CUDA
event timings over fresh random BF16 inputs rotated among three sets. TFLOP/s counts the same
nominal causal FLOPs as attention_bench (forward 2*B*NH*T^2*HS, backward 2.5x that).
"""
import argparse
import sys

SHAPES = {  # name: (B, T, NH, HS, layers), as in kernels/cuda/attention_bench.cc
    "seed": (32, 256, 12, 64, 4),
    "gpt2": (16, 1024, 12, 64, 12),
    "h2048": (8, 1024, 16, 128, 8),
}


def median_ms(torch, fn, warmup, iters):
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for i, (a, b) in enumerate(events):
        a.record()
        fn(i)
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in events)
    return ms[iters // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["all"] + list(SHAPES), default="all")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        sys.exit("attention_sdpa.py: no CUDA device")
    print(f"# {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__} SDPA; median of "
          f"{args.iters} calls after {args.warmup} warm-up; ms/step = ms/call x layers")
    print(f"{'shape':<32} {'pass':<24} {'ms/call':>9} {'ms/step':>12} {'TFLOP/s':>9}")
    for name, (B, T, NH, HS, layers) in SHAPES.items():
        if args.shape not in ("all", name):
            continue
        sets = []
        for _ in range(3):
            q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            sets.append((q, k, v, torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)))

        def fwd(i):
            q, k, v, _ = sets[i % 3]
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd(i):
            q, k, v, do = sets[i % 3]
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(do)

        f = median_ms(torch, fwd, args.warmup, args.iters)
        fb = median_ms(torch, fwd_bwd, args.warmup, args.iters)
        flop = 2.0 * B * NH * T * T * HS
        shape = f"{name} B={B} T={T} NH={NH} HS={HS}"
        for pass_, ms, fl in (("sdpa forward", f, flop), ("sdpa backward", fb - f, 2.5 * flop)):
            print(f"{shape:<32} {pass_:<24} {ms:9.3f} {ms * layers:12.2f} "
                  f"{fl / (ms * 1e-3) / 1e12:9.1f}")
        print(f"{shape:<32} {'sdpa fwd + bwd':<24} {fb:9.3f} {fb * layers:12.2f}")


if __name__ == "__main__":
    main()
