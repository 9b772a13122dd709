#!/usr/bin/env python3
"""Merges benchmark rows (JSON lists from pytorch_reference.py and trainer_bench.py) into one
results file and a Markdown table.

    report.py --title "CPU step time" --baseline pytorch-eager \
        --target boulder-cpu=1.3 --md bench/cpu-DATE.md --json bench/results/cpu-DATE-COMMIT.json \
        ROWS.json...

The speedup column is baseline ms/step / row ms/step within the same workload (> 1: faster
than the baseline). A --target IMPL=X line says whether IMPL reached X on every workload, and
by how much it missed where it did not.
"""

import argparse
import json
import os
import sys

from pytorch_reference import cpu_model


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", nargs="+", help="JSON files, each a list of row objects")
    p.add_argument("--title", default="Benchmark")
    p.add_argument("--baseline", default="pytorch-eager",
                   help="implementation the speedups are relative to")
    p.add_argument("--target", action="append", default=[], metavar="IMPL=RATIO")
    p.add_argument("--note", action="append", default=[], help="a line under the table")
    p.add_argument("--md", required=True)
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)

    rows = []
    for path in a.rows:
        with open(path) as f:
            rows.extend(json.load(f))
    if not rows:
        sys.exit("report: no rows")
    targets = {}
    for t in a.target:
        impl, _, ratio = t.partition("=")
        try:
            targets[impl] = float(ratio)
        except ValueError:
            sys.exit(f"report: --target {t}: expected IMPL=RATIO")

    base = {r["workload"]: r["ms_per_step"] for r in rows if r["implementation"] == a.baseline}
    first = rows[0]
    lines = [f"# {a.title}", ""]
    lines.append(f"- date: {first['date']}")
    lines.append(f"- commit: {first['commit']}")
    if first["gpu"].startswith("cpu:"):
        lines.append(f"- machine: {len(os.sched_getaffinity(0))} CPUs (nproc), {cpu_model()}")
    else:
        lines.append(f"- machine: {first['gpu']}")
    for key in ("framework", "blas", "threads"):
        vals = sorted({str(r[key]) for r in rows if key in r})
        if vals:
            lines.append(f"- PyTorch {key}: {', '.join(vals)}")
    lines += ["", "| workload | implementation | precision | ms/step | tokens/s | peak memory "
              f"| speedup vs {a.baseline} | timed steps |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    verdicts = []
    for r in rows:
        b = base.get(r["workload"])
        speedup = b / r["ms_per_step"] if b else None
        lines.append(f"| {r['workload']} | {r['implementation']} | {r['precision']} "
                     f"| {r['ms_per_step']:.1f} | {r['tokens_per_s']:,.0f} "
                     f"| {human_bytes(r['peak_memory_bytes'])} "
                     f"| {'%.2fx' % speedup if speedup else 'n/a'} "
                     f"| {r.get('timed_steps', '')} |")
        want = targets.get(r["implementation"])
        if want is not None and speedup is not None:
            if speedup >= want:
                verdicts.append(f"- {r['implementation']} on {r['workload']}: {speedup:.2f}x "
                                f"(target {want:.2f}x): met")
            else:
                verdicts.append(f"- {r['implementation']} on {r['workload']}: {speedup:.2f}x "
                                f"(target {want:.2f}x): MISSED by "
                                f"{(1 - speedup / want) * 100:.0f}% ({b / want:.1f} ms/step "
                                f"needed, {r['ms_per_step']:.1f} measured)")
    for impl in targets:
        if not any(v.startswith(f"- {impl} ") for v in verdicts):
            verdicts.append(f"- {impl}: no row to compare with {a.baseline}")
    if verdicts:
        lines += ["", "Targets:", ""] + verdicts
    if a.note:
        lines += [""] + a.note
    for path, text in ((a.md, "\n".join(lines) + "\n"), (a.json, json.dumps(rows, indent=2) + "\n")):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    print("\n".join(lines))
    print(f"\nwrote {a.md} and {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
