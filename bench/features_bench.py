#!/usr/bin/env python3
"""Step time with frozen layers and peak memory with activation checkpointing (issue 10).

Runs boulder-trainer standalone on the same job several times, changing one field:
  training.freeze_layers: []  vs [0, 1] (two of four layers) vs [0, 1] + freeze_embeddings
  training.activation_checkpointing: none vs gelu vs mlp vs full
and reads its step reports (JSON lines on --report-fd): the median step time over the steps
after --warmup, the peak memory the backend reports (the CPU backend counts its allocations;
the CUDA backend reports the device allocator's), and the final loss (activation
checkpointing must not change it).

    python3 bench/features_bench.py --bin build/bin --backend cpu --threads 2
    python3 bench/features_bench.py --bin build/bin --backend cuda --batch 32 --seq 256

Prints a Markdown table; --json appends the rows to a file.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(args, sets):
    spec = os.path.join(args.tmp, "spec.yaml")
    with open(spec, "w") as f:
        f.write("name: features-bench\nmodel: {preset: minigpt}\ngeneration: {tokens: 0}\n")
    r, w = os.pipe()
    cmd = [os.path.join(args.bin, "boulder-trainer"), "--spec", spec, "--backend", args.backend,
           "--report-fd", str(w), "--quiet",
           "--set", f"training.steps={args.steps}", "--set", f"training.batch_size={args.batch}",
           "--set", f"training.seq_len={args.seq}", "--set", "training.log_every_steps=1"]
    if args.backend == "cpu":
        cmd += ["--threads", str(args.threads), "--set", "precision=fp32"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.Popen(cmd, pass_fds=(w,))
    os.close(w)
    with os.fdopen(r) as lines:
        reports = [json.loads(l)["step"] for l in lines if '"step"' in l]
    if p.wait() != 0:
        sys.exit(f"{' '.join(cmd)} failed")
    timed = [x["step_time_seconds"] for x in reports[args.warmup:]]
    return {"ms": 1e3 * statistics.median(timed),
            "peak_mib": int(reports[-1]["memory"]["peak_bytes"]) / 2**20,
            "loss": reports[-1]["loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.tmp = tempfile.mkdtemp(prefix="features-bench-")
    configs = [
        ("baseline", []),
        ("freeze_layers [0, 1]", ["training.freeze_layers=[0, 1]"]),
        ("freeze_layers [0, 1] + embeddings",
         ["training.freeze_layers=[0, 1]", "training.freeze_embeddings=true"]),
        ("activation_checkpointing gelu", ["training.activation_checkpointing=gelu"]),
        ("activation_checkpointing mlp", ["training.activation_checkpointing=mlp"]),
        ("activation_checkpointing full", ["training.activation_checkpointing=full"]),
    ]
    rows = []
    for name, sets in configs:
        res = run(args, sets)
        res["config"] = name
        rows.append(res)
        print(f"{name}: {res}", flush=True)
    base = rows[0]
    print(f"\nminigpt, batch {args.batch} x {args.seq}, backend {args.backend}, "
          f"median of steps {args.warmup + 1}..{args.steps}\n")
    print("| config | ms/step | vs baseline | peak memory | final loss |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['ms']:.1f} | {base['ms'] / r['ms']:.2f}x | "
              f"{r['peak_mib']:.0f} MiB | {r['loss']:.6f} |")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, backend=args.backend, batch=args.batch,
                                        seq=args.seq)) + "\n")


if __name__ == "__main__":
    main()
