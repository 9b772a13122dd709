#!/usr/bin/env python3
"""Data-parallel communication cost on this machine (issue 5): per workload, how much of the
gradient all-reduce is NOT hidden behind the backward pass.

Starts a coordinator and WORKERS CPU workers (Gloo, 127.0.0.1, one thread each) from BUILD_DIR,
submits each workload as a WORKERS-worker job with the CLI, and reads the step reports from
the coordinator's store. Each trainer reports `comm_exposed_seconds`: the time it waited after
its backward for the bucketed all-reduce (issued layer by layer during the backward) to finish.
Also runs the same global batch on 1 worker for the step-time comparison.

    bench/dp_comm_bench.py [--build-dir build] [--steps 12] [--workers 2] [--out bench/FILE.md]

Steps 1-2 are warm-up and left out; the table shows medians over the rest, per rank. Writes
bench/dp-cpu-DATE.md (date and commit in it). Run it on a quiet machine: other load on the
cores moves every number.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
from harness import Cluster, decode, job_events  # noqa: E402
import struct  # noqa: E402

WARMUP = 2
# (name, --set overrides, global batch). The seed model itself and a quarter-width variant:
# same layer count (buckets), ~9x fewer gradient bytes.
WORKLOADS = [
    ("seed mini-GPT (hidden 768, 4 layers, 28.7M params), 8 x 64",
     ["model.preset=minigpt", "training.seq_len=64"], 8),
    ("mini-GPT hidden 256, 4 layers (3.3M params), 8 x 64",
     ["model.hidden=256", "model.heads=4", "model.ffn=1024", "training.seq_len=64"], 8),
]


def reports(db, job_id):
    """{rank: [(step, step_time, comm_exposed)]}."""
    out = {}
    for e in job_events(db, job_id):
        if 5 not in e:
            continue
        r = decode(e[5][0])
        d = lambda f: struct.unpack("<d", r[f][0])[0] if f in r else 0.0  # noqa: E731
        out.setdefault(r.get(2, [0])[0], []).append((r.get(4, [0])[0], d(10), d(40)))
    return out


def run(cluster, spec, sets, workers, batch, steps):
    args = ["submit", spec, "-q", "--set", f"resources.workers={workers}",
            "--set", f"training.batch_size={batch // workers}", "--set", f"training.steps={steps}",
            "--set", "training.log_every_steps=1", "--set", "generation.tokens=0",
            "--set", "resources.collective_timeout_seconds=300"]
    for s in sets:
        args += ["--set", s]
    job_id = int(cluster.cli(*args).stdout.strip())
    job = cluster.wait_state(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, 3600)
    if job["state"] != "SUCCEEDED":
        raise SystemExit(f"job {job_id}: {job['state']}: {job.get('message')}")
    return job_id


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    date = datetime.date.today().isoformat()
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    out = a.out or os.path.join(HERE, f"dp-cpu-{date}.md")
    spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
    rows = []
    cluster = Cluster(os.path.join(a.build_dir, "bin"), workers=a.workers)
    try:
        jobs = [(run(cluster, spec, sets, 1, batch, a.steps),
                 run(cluster, spec, sets, a.workers, batch, a.steps)) for _, sets, batch in WORKLOADS]
        # The coordinator keeps its database locked while it runs: read it after.
        cluster.coordinator.stop()
        for (name, _, _), (single_id, multi_id) in zip(WORKLOADS, jobs):
            single, multi = reports(cluster.db, single_id), reports(cluster.db, multi_id)
            one = statistics.median(t for s, t, _ in single[0] if s > WARMUP)
            for rank in sorted(multi):
                timed = [(t, c) for s, t, c in multi[rank] if s > WARMUP]
                step = statistics.median(t for t, _ in timed)
                exposed = statistics.median(c for _, c in timed)
                rows.append((name, rank, one, step, exposed))
                print(f"{name} rank {rank}: step {step * 1e3:.1f} ms, exposed comm "
                      f"{exposed * 1e3:.2f} ms (1 worker: {one * 1e3:.1f} ms)", flush=True)
    finally:
        cluster.close()
    with open(out, "w") as f:
        f.write(f"# Data-parallel communication on CPU ({a.workers} workers, Gloo, 127.0.0.1)\n\n")
        f.write(f"Date {date}, commit {commit}{' (uncommitted changes)' if dirty else ''}, "
                f"`bench/dp_comm_bench.py --steps {a.steps} --workers {a.workers}`; "
                f"{os.cpu_count()} cores, one trainer thread per worker, FP32. Medians over steps "
                f"{WARMUP + 1}..{a.steps}. *Exposed comm*: the time a rank waited after its "
                "backward for the bucketed gradient all-reduce to finish (the part of "
                "communication not hidden behind the backward).\n\n")
        f.write("| workload | rank | 1 worker, ms/step | "
                f"{a.workers} workers, ms/step | exposed comm, ms/step | exposed / step |\n")
        f.write("|---|---:|---:|---:|---:|---:|\n")
        for name, rank, one, step, exposed in rows:
            f.write(f"| {name} | {rank} | {one * 1e3:.1f} | {step * 1e3:.1f} | "
                    f"{exposed * 1e3:.2f} | {100 * exposed / step:.1f}% |\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
