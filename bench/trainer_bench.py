#!/usr/bin/env python3
"""Times Boulder's trainer run standalone and writes one benchmark row (a JSON list).

    trainer_bench.py --workload NAME --batch B --seq T [--warmup 2] --json OUT -- \
        build/bin/boulder-trainer --spec examples/minigpt-cpu.yaml --threads 2 ...

Runs the command after `--`, echoing its output, and reads the step reports it prints, one a
line, e.g. "step   10/200  loss 2.3456 ... 41.2 ms": the step number, and the last "<x> ms"
on the line is that step's time. ms_per_step is the median over the steps after the first
--warmup; tokens_per_s is batch * seq / ms_per_step, computed as pytorch_reference.py does.
peak_memory_bytes is the trainer process's peak resident set (ru_maxrss), the figure
pytorch_reference.py reports on CPU.

Exit status: the trainer's when it fails; 1 when too few step reports were found.
"""

import argparse
import datetime
import json
import os
import re
import resource
import statistics
import subprocess
import sys

from pytorch_reference import cpu_model, git_commit, write_rows

STEP_RE = re.compile(r"^\s*step\s+(\d+)\s*/\s*(\d+)\b")
MS_RE = re.compile(r"(\d+(?:\.\d+)?)\s*ms\b")


def parse_json_line(line):
    """(step, ms, peak_bytes, cuda_graph) for a TrainerMessage JSON line with a step report,
    else None; cuda_graph: the step was replayed from a CUDA graph (training.cuda_graph)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    step = msg.get("step") if isinstance(msg, dict) else None
    if not step:
        return None
    peak = int(step.get("memory", {}).get("peak_bytes", 0))
    return (int(step["step"]), float(step.get("step_time_seconds", 0.0)) * 1e3, peak,
            bool(step.get("cuda_graph", False)))


def parse_step_line(line):
    """(step, ms) for a step-report line, else None."""
    m = STEP_RE.match(line)
    if not m:
        return None
    times = MS_RE.findall(line)
    if not times:
        return None
    return int(m.group(1)), float(times[-1])


def main(argv):
    if "--" not in argv:
        sys.exit("trainer_bench: usage: trainer_bench.py [flags] -- TRAINER ARGS...")
    split = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--implementation", default="boulder-cpu")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--gpu", help="device name for the row (default: 'cpu: <model name>')")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-timed", type=int, default=10,
                   help="fail unless at least this many steps are timed")
    p.add_argument("--log", help="also write the trainer's output here")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--json-reports", action="store_true",
                   help="the trainer prints TrainerMessage JSON lines (--report-fd 1 --quiet); "
                        "peak memory then comes from the step reports (device memory)")
    a = p.parse_args(argv[:split])
    cmd = argv[split + 1:]
    if not cmd:
        sys.exit("trainer_bench: no trainer command after --")

    times = {}
    graphed = set()  # steps replayed from a CUDA graph (JSON reports only)
    device_peak = 0
    log = open(a.log, "w") if a.log else None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
    except OSError as e:
        sys.exit(f"trainer_bench: cannot run {cmd[0]}: {e}")
    for line in proc.stdout:
        sys.stdout.write(line)
        if log:
            log.write(line)
        if a.json_reports:
            parsed = parse_json_line(line)
            if parsed:
                times[parsed[0]] = parsed[1]
                device_peak = max(device_peak, parsed[2])
                if parsed[3]:
                    graphed.add(parsed[0])
            continue
        parsed = parse_step_line(line)
        if parsed:
            times[parsed[0]] = parsed[1]
    rc = proc.wait()
    if log:
        log.close()
    if rc != 0:
        print(f"trainer_bench: the trainer exited with status {rc}", file=sys.stderr)
        return rc
    timed = [ms for step, ms in sorted(times.items()) if step > a.warmup]
    if len(timed) < a.min_timed:
        print(f"trainer_bench: found {len(times)} step reports ({len(timed)} after "
              f"{a.warmup} warm-up steps), need {a.min_timed} timed; does the trainer print "
              f"every step (training.log_every_steps=1)?", file=sys.stderr)
        return 1

    ms = statistics.median(timed)
    # The only child waited for so far is the trainer, so this is its peak RSS (KiB on Linux).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if a.json_reports:
        peak = device_peak
    row = {
        "workload": a.workload,
        "implementation": a.implementation,
        "precision": a.precision,
        "gpu": a.gpu or "cpu: " + cpu_model(),
        "ms_per_step": round(ms, 3),
        "tokens_per_s": round(a.batch * a.seq / (ms / 1e3), 1),
        "peak_memory_bytes": int(peak),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timed_steps": len(timed),
    }
    if a.json_reports:
        row["cuda_graph_steps"] = sum(1 for step in times if step > a.warmup and step in graphed)
    print(f"{a.implementation} {a.precision} [{a.workload}]: {ms:.2f} ms/step (median of "
          f"{len(timed)}, min {min(timed):.2f}, max {max(timed):.2f}), "
          f"{row['tokens_per_s']:,.0f} tokens/s, peak {peak / 2**20:,.0f} MiB", flush=True)
    if a.json:
        write_rows(a.json, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
