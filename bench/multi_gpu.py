#!/usr/bin/env python3
"""Multi-GPU data-parallel scaling run (issue 9): one worker agent per GPU on one host.

For each (workload, precision, N) it starts a coordinator and N worker agents on 127.0.0.1
(agent i sees only GPU i through CUDA_VISIBLE_DEVICES; NCCL_NVLS_ENABLE=0 in every process),
submits the job with the `boulder` CLI as a user would (resources.workers=N, the same
micro-batch per GPU: weak scaling), waits for SUCCEEDED with a deadline, and reads the step
reports from the coordinator's SQLite store (it stops the coordinator first: the store is held
in exclusive locking mode). Measured per row:

  ms/step        median over the steps after --warmup of the slowest rank's step time
  mean ms/step   their mean: it also counts the steps that compare the replicas' checksums
  tokens/s/GPU   micro-batch x seq_len x grad_accum / (ms/step)
  efficiency     tokens/s/GPU at N / tokens/s/GPU at N=1 (same workload and precision)
  comm exposed   median over those steps of the ranks' mean comm_exposed_seconds (the time
                 a rank waited after its backward for the gradient all-reduce)
  loss max diff  strong-scaling pair: N workers of batch B against 1 worker of batch N*B (the
                 same global batch, the same sequences), both with training.deterministic,
                 max |loss difference| over all steps, against LOSS_TOLERANCE[precision]

Then a kill test: an N>=2 job, one trainer SIGKILLed mid-run; the job must leave RUNNING
(FAILED with max_restarts 0, else RESTARTING) within the collective timeout + KILL_MARGIN
seconds, and no trainer process of the killed attempt may be left.

Writes OUT/multi-gpu.md and OUT/multi-gpu.json and prints the table. Python 3 standard
library only (the GPU machine has python3 without extra packages).

  bench/multi_gpu.py --bin .gpu/bin --out $OUT                    # cuda, 1 2 4 8, gpt2 h2048
  bench/multi_gpu.py --bin build/bin --backend cpu --workloads cpu-small --gpus "1 2" --out /tmp/mg
"""
import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
from harness import Proc, decode, job_events, trainers_of, wait_until  # noqa: E402

BINARIES = ("boulder-coordinator", "boulder-worker", "boulder-trainer", "boulder")

# The models of bench/gpu_bench.sh (batch = micro-batch per GPU), plus a tiny CPU model that
# checks the mechanics in seconds per job.
WORKLOADS = {
    "gpt2": dict(spec="examples/minigpt.yaml", batch=16, seq=1024,
                 model=["model.preset=gpt2", "model.tie_embeddings=false"]),
    "h2048": dict(spec="examples/minigpt.yaml", batch=8, seq=1024,
                  model=["model.hidden=2048", "model.heads=16", "model.layers=8",
                         "model.ffn=8192", "model.context=1024"]),
    "cpu-small": dict(spec="examples/minigpt-cpu.yaml", batch=4, seq=32,
                      model=["model.hidden=64", "model.heads=2", "model.layers=2",
                             "model.ffn=128", "model.context=32", "training.lr=0.003"]),
}

# Issue 9's targets: scaling efficiency at 8 GPUs for GPT-2 124M.
TARGETS = {("gpt2", "bf16", 8): 0.95, ("gpt2", "fp8", 8): 0.90}

# Max |loss(N workers) - loss(1 worker)| allowed per step with the same global batch and the
# same sequences, where only the order of the gradient summation differs (per-rank partial
# sums, then the all-reduce). fp32: ~4e-8 measured on CPU over 12 steps (tests/
# data_parallel_test.py allows 1e-5). bf16/fp8: the gradients are summed in a different order
# and rounded to bf16/fp8 in the next step's GEMMs, so differences grow with the steps; 2e-2
# over a short run is a stated bound, not yet validated on a multi-GPU machine. A wrong data
# slice or a missing average moves the loss by far more.
LOSS_TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2, "fp8": 2e-2}

# The kill test: the job must leave RUNNING within collective timeout + this many seconds
# (the agent sees its trainer die at once; the survivors see the broken connection or time
# out; then heartbeats).
KILL_MARGIN = 30

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


STATES = {1: "QUEUED", 2: "SCHEDULED", 3: "RUNNING", 4: "SUCCEEDED", 5: "FAILED",
          6: "CANCELLED", 7: "RESTARTING"}  # proto/boulder/v1/job.proto JobState


class JobFailed(Exception):
    pass


# ---- protobuf wire format (no protobuf package needed) -----------------------------------

def _double(fields, number):
    return struct.unpack("<d", fields[number][0])[0] if number in fields else 0.0


def read_events(db, job_id):
    """(step reports {rank: {step: dict}}, text lines of state changes and logs)."""
    reports, text = {}, []
    for event in job_events(db, job_id):
        if 5 in event:  # JobEvent.step: StepReport
            r = decode(event[5][0])
            rank, step = r.get(2, [0])[0], r.get(4, [0])[0]
            reports.setdefault(rank, {})[step] = dict(
                attempt=r.get(3, [0])[0], loss=_double(r, 6),
                tokens_per_second=_double(r, 9), step_time=_double(r, 10),
                comm_exposed=_double(r, 40), cuda_graph=bool(r.get(220, [0])[0]),
                # FP8: the largest saturated and flushed-to-zero fractions over the tensors'
                # casts of this step (Fp8TensorStats 8 and 9).
                fp8_saturated=max((_double(decode(t), 8) for t in r.get(12, [])), default=0.0),
                fp8_underflow=max((_double(decode(t), 9) for t in r.get(12, [])), default=0.0))
        elif 4 in event:  # JobStateChange {state, message}
            s = decode(event[4][0])
            msg = s.get(2, [b""])[0].decode(errors="replace")
            state = s.get(1, [0])[0]
            text.append(f"{STATES.get(state, state)}: {msg}")
        elif 6 in event:  # LogLine {rank, text}
            s = decode(event[6][0])
            text.append(f"[rank {s.get(1, [0])[0]}] " + s.get(2, [b""])[0].decode(errors="replace"))
    return reports, text


# ---- processes ---------------------------------------------------------------------------

def cli_text(r):
    """The CLI's output without its --insecure warning."""
    return "\n".join(l for l in (r.stdout + r.stderr).splitlines()
                     if not l.startswith("boulder: WARNING: --insecure")).strip()


def child_env(gpu=None):
    env = dict(os.environ)
    env.update(NCCL_ENV)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


class Cluster:
    """A coordinator (temp SQLite, port 0) and N worker agents on 127.0.0.1, one GPU each."""

    def __init__(self, args, workers):
        self.args = args
        self.tmp = tempfile.TemporaryDirectory(prefix="boulder-mgpu-")
        self.db = os.path.join(self.tmp.name, "boulder.db")
        self.procs = []
        self.coordinator = Proc([self.bin("boulder-coordinator"), "--listen", "127.0.0.1:0",
                                 "--db", self.db, "--insecure"], env=child_env())
        self.procs.append(self.coordinator)
        self.address = self.coordinator.wait_line(r"listening on (127\.0\.0\.1:\d+)",
                                                  30).group(1)
        threads = 1 if args.backend == "cpu" else max(1, (os.cpu_count() or 1) // workers)
        for i in range(workers):
            wd = tempfile.mkdtemp(dir=self.tmp.name, prefix=f"worker{i}-")
            w = Proc([self.bin("boulder-worker"), "--coordinator", self.address, "--backend",
                      args.backend, "--work-dir", wd, "--threads", str(threads),
                      "--id", f"mgpu-{i}", "--insecure"],
                     env=child_env(i if args.backend == "cuda" else None))
            self.procs.append(w)
        for w in self.procs[1:]:
            w.wait_line(r"registered", 60)

    def bin(self, name):
        return os.path.join(self.args.bin, name)

    def cli(self, *argv, timeout=120, check=True):
        r = subprocess.run([self.bin("boulder"), "--coordinator", self.address, "--insecure",
                            *argv], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, env=child_env())
        if check and r.returncode != 0:
            raise JobFailed(f"`boulder {' '.join(argv)}` exited {r.returncode}: {cli_text(r)}")
        return r

    def job(self, job_id):
        return json.loads(self.cli("get", str(job_id), "-o", "json").stdout)

    def wait_state(self, job_id, states, timeout):
        return wait_until(lambda: (lambda j: j if j.get("state") in states else None)(
            self.job(job_id)), timeout, f"job {job_id} to reach {sorted(states)}", 0.5)

    def stop_coordinator(self):
        self.coordinator.stop()

    def close(self):
        for p in reversed(self.procs):
            p.stop()
        self.tmp.cleanup()


def overrides(args, workload, precision, workers, batch, steps, extra=()):
    w = WORKLOADS[workload]
    sets = list(w["model"]) + [
        f"training.batch_size={batch}", f"training.seq_len={w['seq']}",
        f"training.steps={steps}", "training.log_every_steps=1", "generation.tokens=0",
        f"precision={precision}", f"resources.workers={workers}",
        f"resources.backend={args.backend}",
        f"resources.collective_timeout_seconds={args.collective_timeout}",
        # A benchmark run that fails shows it, rather than mixing attempts' step times.
        "max_restarts=0",
        # No checkpoint writes inside the timed steps (a restart in the kill test starts over).
        "checkpoint.every_steps=0"] + \
        list(args.set) + list(extra)
    if precision == "fp8" and args.backend == "cpu":
        sets.append("fp8.emulate=true")  # the CPU backend's exact FP8 emulation
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def run_job(args, workload, precision, workers, batch, steps, extra=()):
    """Runs one job on a fresh cluster; returns its step reports. Raises JobFailed with the
    job's events when it does not succeed."""
    c = Cluster(args, workers)
    try:
        spec = os.path.join(REPO, WORKLOADS[workload]["spec"])
        r = c.cli("submit", spec, *overrides(args, workload, precision, workers, batch, steps,
                                             extra), "-q", check=False)
        if r.returncode != 0:
            raise JobFailed(f"submit refused: {cli_text(r)}")
        job_id = int(r.stdout.strip())
        try:
            job = c.wait_state(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, args.job_timeout)
            state, message = job.get("state"), job.get("message", "")
        except AssertionError as e:
            state, message = "TIMEOUT", str(e)
            c.cli("cancel", str(job_id), check=False)
        c.stop_coordinator()
        reports, events = read_events(c.db, job_id)
        if state != "SUCCEEDED":
            raise JobFailed(f"job {job_id} ({workload} {precision} N={workers}) ended {state}: "
                            f"{message}\nevents:\n  " + "\n  ".join(events[-60:]))
        if sorted(reports) != list(range(workers)):
            raise JobFailed(f"job {job_id}: step reports from ranks {sorted(reports)}, "
                            f"expected 0..{workers - 1}")
        return reports
    finally:
        c.close()


def measure(reports, args, workload, batch):
    w = WORKLOADS[workload]
    steps = sorted(set.intersection(*(set(r) for r in reports.values())))
    timed = [s for s in steps if s > args.warmup] or steps
    step_s = statistics.median(max(reports[r][s]["step_time"] for r in reports) for s in timed)
    # The mean counts the steps that also compare the replicas' checksums
    # (resources.checksum_every_steps), which the median leaves out.
    mean_s = statistics.mean(max(reports[r][s]["step_time"] for r in reports) for s in timed)
    comm = statistics.median(statistics.mean(reports[r][s]["comm_exposed"] for r in reports)
                             for s in timed)
    out = dict(ms_per_step=step_s * 1e3, mean_ms_per_step=mean_s * 1e3,
               tokens_per_s_per_gpu=batch * w["seq"] / step_s,
               comm_exposed_ms=comm * 1e3, timed_steps=len(timed),
               loss=[reports[0][s]["loss"] for s in steps],
               # steps rank 0 replayed from a CUDA graph (training.cuda_graph)
               replayed_steps=sum(reports[0][s]["cuda_graph"] for s in steps))
    for key in ("fp8_saturated", "fp8_underflow"):  # rank 0's, per step (FP8 jobs only)
        if any(reports[0][s][key] for s in steps):
            out[key] = [reports[0][s][key] for s in steps]
    return out


def kill_test(args, workload, precision, workers):
    """Kills rank 1's trainer mid-run; returns a result dict."""
    c = Cluster(args, workers)
    job_id = None
    try:
        spec = os.path.join(REPO, WORKLOADS[workload]["spec"])
        r = c.cli("submit", spec, *overrides(
            args, workload, precision, workers, WORKLOADS[workload]["batch"], 1000000,
            [f"max_restarts={args.kill_max_restarts}"]), "-q", check=False)
        if r.returncode != 0:
            raise JobFailed(f"submit refused: {cli_text(r)}")
        job_id = int(r.stdout.strip())
        wait_until(lambda: int(c.job(job_id).get("latest_report", {}).get("step", 0)) >= 3,
                   args.job_timeout, f"job {job_id} to report 3 steps", 0.5)
        attempt0 = int(c.job(job_id).get("attempt", 0))
        attempt = trainers_of(job_id)
        victims = [pid for pid, rank in attempt if rank == 1]
        if len(victims) != 1:
            raise JobFailed(f"job {job_id}: expected one rank-1 trainer, found {attempt}")
        killed_at = time.monotonic()
        os.kill(victims[0], signal.SIGKILL)
        deadline = args.collective_timeout + KILL_MARGIN
        want = {"FAILED"} if args.kill_max_restarts == 0 else {"FAILED", "RESTARTING",
                                                               "QUEUED"}
        ended = want | {"SUCCEEDED", "CANCELLED"}

        def left(j):
            # A restart may pass through RESTARTING faster than the poll: a new attempt counts.
            return j if (j.get("state") in ended or int(j.get("attempt", 0)) > attempt0) \
                else None

        try:
            job = wait_until(lambda: left(c.job(job_id)), deadline,
                             f"job {job_id} to leave RUNNING", 0.2)
            left_running = time.monotonic() - killed_at
            state, message = job.get("state"), job.get("message", "")
            if int(job.get("attempt", 0)) > attempt0 and state not in ended:
                state = f"RESTARTING (attempt {job.get('attempt')})"
                want = want | {state}
        except AssertionError:
            left_running, state, message = None, "RUNNING", "still RUNNING at the deadline"
        # No trainer of the killed attempt may be left (a restart starts new ones).
        old = {pid for pid, _ in attempt}
        try:
            wait_until(lambda: not (old & {p for p, _ in trainers_of(job_id)}), 30,
                       "the attempt's trainers to exit")
            leftover = []
        except AssertionError:
            leftover = sorted(old & {p for p, _ in trainers_of(job_id)})
        c.cli("cancel", str(job_id), check=False)
        ok = state in want and left_running is not None and not leftover
        return dict(workload=workload, precision=precision, workers=workers,
                    max_restarts=args.kill_max_restarts, state=state, message=message,
                    seconds=left_running, deadline_s=deadline, leftover_trainers=leftover,
                    ok=ok)
    finally:
        if job_id is not None:
            for pid, _ in trainers_of(job_id):  # cleanup only; reported above
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        c.close()


# ---- the run -----------------------------------------------------------------------------

def gpu_info():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        names = [l.strip() for l in r.stdout.splitlines() if l.strip()] if r.returncode == 0 \
            else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    return names


def commit_of(args):
    if args.commit:
        return args.commit
    if os.environ.get("BOULDER_COMMIT"):
        return os.environ["BOULDER_COMMIT"]
    try:
        r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return r.stdout.strip()
    except OSError:
        pass
    return "unknown (pass --commit or BOULDER_COMMIT)"


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def table(rows):
    lines = ["| workload | precision | N | ms/step | mean ms/step | tokens/s/GPU | efficiency | "
             "target | comm exposed ms | loss max diff (tol) | status |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        target = r.get("target")
        t = "—" if target is None else (
            f"{target:.0%} " + ("met" if r.get("efficiency") is not None and
                                r["efficiency"] >= target else "MISSED"))
        diff = r.get("loss_max_diff")
        d = "—" if diff is None else (
            f"{diff:.2e} ({r['loss_tolerance']:.0e}) " +
            ("ok" if diff <= r["loss_tolerance"] else "OVER"))
        if r.get("loss_error"):
            d = "error: " + r["loss_error"].splitlines()[0][:80]
        status = "ok" if not r.get("error") else "error: " + r["error"].splitlines()[0][:100]
        lines.append(f"| {r['workload']} | {r['precision']} | {r['workers']} | "
                     f"{fmt(r.get('ms_per_step'), '.2f')} | "
                     f"{fmt(r.get('mean_ms_per_step'), '.2f')} | "
                     f"{fmt(r.get('tokens_per_s_per_gpu'), ',.0f')} | "
                     f"{fmt(r.get('efficiency'), '.1%')} | {t} | "
                     f"{fmt(r.get('comm_exposed_ms'), '.2f')} | {d} | {status} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="folder with " + ", ".join(BINARIES))
    p.add_argument("--out", required=True, help="writes multi-gpu.md and multi-gpu.json here")
    p.add_argument("--gpus", default="1 2 4 8", help="worker counts (capped at the GPUs present "
                   "with --backend cuda)")
    p.add_argument("--workloads", default=None,
                   help="of " + " ".join(WORKLOADS) + " (default: gpt2 h2048; cpu-small on cpu)")
    p.add_argument("--precisions", default=None, help="default: bf16 fp8 (cuda), fp32 (cpu)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per timed job")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--loss-steps", type=int, default=None,
                   help="steps of the loss-curve pairs (default: --steps)")
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--collective-timeout", type=int, default=30,
                   help="resources.collective_timeout_seconds of every job")
    p.add_argument("--job-timeout", type=int, default=900, help="deadline per job, seconds")
    p.add_argument("--kill-max-restarts", type=int, default=0,
                   help="max_restarts of the kill-test job (0: it must FAIL)")
    p.add_argument("--no-kill-test", action="store_true")
    p.add_argument("--no-loss-pairs", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="a spec override added to every job (repeatable)")
    p.add_argument("--commit", default=None, help="default: $BOULDER_COMMIT, else git")
    args = p.parse_args()
    # `timeout` sends SIGTERM: unwind, so every cluster's `finally` stops its processes (they
    # run in their own sessions and would outlive the script).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    missing = [b for b in BINARIES if not os.access(os.path.join(args.bin, b), os.X_OK)]
    if missing:
        sys.exit(f"multi_gpu: missing in --bin {args.bin}: {', '.join(missing)} "
                 f"(build them, or gpu-bundle them with /work/shared/tools/gpu-bundle)")
    workloads = (args.workloads or ("cpu-small" if args.backend == "cpu" else "gpt2 h2048")).split()
    for w in workloads:
        if w not in WORKLOADS:
            sys.exit(f"multi_gpu: unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    precisions = (args.precisions or ("fp32" if args.backend == "cpu" else "bf16 fp8")).split()
    for prec in precisions:
        if prec not in LOSS_TOLERANCE:
            sys.exit(f"multi_gpu: unknown precision {prec!r} (known: {', '.join(LOSS_TOLERANCE)})")
        if args.backend == "cpu" and prec == "bf16":
            sys.exit("multi_gpu: bf16 needs --backend cuda (the cpu backend trains in fp32)")
    try:
        counts = sorted({int(n) for n in args.gpus.split()})
    except ValueError:
        sys.exit(f"multi_gpu: --gpus must be integers, got {args.gpus!r}")
    if not counts or counts[0] < 1:
        sys.exit(f"multi_gpu: --gpus must be positive integers, got {args.gpus!r}")
    if args.warmup >= args.steps:
        sys.exit(f"multi_gpu: --warmup {args.warmup} must be below --steps {args.steps}")
    gpus = gpu_info()
    if args.backend == "cuda":
        if not gpus:
            sys.exit("multi_gpu: --backend cuda but nvidia-smi lists no GPU")
        skipped = [n for n in counts if n > len(gpus)]
        counts = [n for n in counts if n <= len(gpus)]
        if skipped:
            print(f"multi_gpu: {len(gpus)} GPU(s) present; skipping N = {skipped}",
                  file=sys.stderr)
        kind = f"{len(gpus)} x {gpus[0]}"
    else:
        kind = f"CPU backend (Gloo), {platform.node()}, {os.cpu_count()} cores, 1 thread/worker"
    os.makedirs(args.out, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    commit = commit_of(args)

    def write_outputs(kill):
        """Writes OUT/multi-gpu.{md,json} from the rows so far (after every row, so a run
        cut short by a time limit still leaves its table); returns the Markdown."""
        md = [f"# Multi-GPU data-parallel scaling (bench/multi_gpu.py)", "",
              f"- kind: {kind}", f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
              f"- commit: {commit}", f"- backend: {args.backend}; steps per job {args.steps}, "
              f"timing = median of the slowest rank's step time over steps > {args.warmup}; weak "
              f"scaling (micro-batch per GPU fixed); efficiency = tokens/s/GPU at N / at N=1",
              f"- loss max diff: N workers of batch B vs 1 worker of batch N*B "
              f"(training.deterministic), max |diff| over all steps and ranks", "",
              table(rows), ""]
        if kill is not None:
            if kill.get("error"):
                md.append(f"Kill test ({kill['workload']} N={kill['workers']}): ERROR "
                          f"{kill['error'].splitlines()[0]}")
            else:
                md.append(f"Kill test ({kill['workload']} {kill['precision']} N={kill['workers']}, "
                          f"max_restarts {kill['max_restarts']}): rank 1's trainer SIGKILLed; job "
                          f"{kill['state']} after {fmt(kill['seconds'], '.1f')} s (deadline "
                          f"{kill['deadline_s']} s), trainers left: "
                          f"{kill['leftover_trainers'] or 'none'} — "
                          f"{'PASS' if kill['ok'] else 'FAIL'}. Message: {kill['message']}")
        text = "\n".join(md) + "\n"
        with open(os.path.join(args.out, "multi-gpu.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "multi-gpu.json"), "w") as f:
            json.dump(dict(kind=kind, gpus=gpus, date=started.isoformat(), commit=commit,
                           backend=args.backend, steps=args.steps, warmup=args.warmup,
                           rows=rows, kill_test=kill), f, indent=2)
        return text

    for workload in workloads:
        B = WORKLOADS[workload]["batch"]
        for prec in precisions:
            base = None
            for n in counts:
                row = dict(workload=workload, precision=prec, workers=n, batch_per_gpu=B,
                           seq_len=WORKLOADS[workload]["seq"], steps=args.steps,
                           target=TARGETS.get((workload, prec, n)))
                print(f"multi_gpu: {workload} {prec} N={n} ...", file=sys.stderr, flush=True)
                t0 = time.monotonic()
                try:
                    reports = run_job(args, workload, prec, n, B, args.steps)
                    row.update(measure(reports, args, workload, B))
                    if n == 1:
                        base = row["tokens_per_s_per_gpu"]
                    row["efficiency"] = (row["tokens_per_s_per_gpu"] / base) if base else None
                except (JobFailed, AssertionError) as e:
                    row["error"] = str(e)
                    print(f"multi_gpu: {workload} {prec} N={n} FAILED:\n{e}", file=sys.stderr)
                if n >= 2 and not args.no_loss_pairs and not row.get("error"):
                    steps = args.loss_steps or args.steps
                    det = ["training.deterministic=true"]
                    try:
                        multi = run_job(args, workload, prec, n, B, steps, det)
                        single = run_job(args, workload, prec, 1, n * B, steps, det)[0]
                        if sorted(single) != list(range(1, steps + 1)) or any(
                                sorted(multi[r]) != sorted(single) for r in multi):
                            raise JobFailed("loss pair: the runs reported different steps")
                        diffs = [abs(multi[r][s]["loss"] - single[s]["loss"])
                                 for r in multi for s in single]
                        row["loss_max_diff"] = max(diffs)
                        row["loss_pair"] = dict(
                            steps=sorted(single),
                            workers=[multi[0][s]["loss"] for s in sorted(single)],
                            one_worker=[single[s]["loss"] for s in sorted(single)],
                            workers_fp8_saturated=[multi[0][s]["fp8_saturated"]
                                                   for s in sorted(single)],
                            one_worker_fp8_saturated=[single[s]["fp8_saturated"]
                                                      for s in sorted(single)])
                        row["loss_tolerance"] = LOSS_TOLERANCE[prec]
                        row["loss_steps"] = steps
                    except (JobFailed, AssertionError) as e:
                        row["loss_error"] = str(e)
                        print(f"multi_gpu: loss pair {workload} {prec} N={n} FAILED:\n{e}",
                              file=sys.stderr)
                row["wall_s"] = round(time.monotonic() - t0, 1)
                rows.append(row)
                write_outputs(None)
                print(table([row]).splitlines()[-1], flush=True)
    kill = None
    multi_counts = [n for n in counts if n >= 2]
    if not args.no_kill_test and multi_counts:
        prec = next((q for q in precisions if q != "fp8"), precisions[0])
        print(f"multi_gpu: kill test ({workloads[0]} {prec} N={multi_counts[-1]}) ...",
              file=sys.stderr, flush=True)
        try:
            kill = kill_test(args, workloads[0], prec, multi_counts[-1])
        except (JobFailed, AssertionError) as e:
            kill = dict(workload=workloads[0], precision=prec, workers=multi_counts[-1],
                        ok=False, error=str(e))
    text = write_outputs(kill)
    print(text)
    bad = [r for r in rows if r.get("error") or r.get("loss_error") or (
        r.get("loss_max_diff") is not None and r["loss_max_diff"] > r["loss_tolerance"])]
    return 1 if bad or (kill is not None and not kill.get("ok")) else 0


if __name__ == "__main__":
    sys.exit(main())
