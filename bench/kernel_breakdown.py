#!/usr/bin/env python3
"""Where one training step's GPU time goes, kernel by kernel.

Runs `layup bench` for one step under Nsight Compute (ncu), reading only each kernel's duration
(gpu__time_duration.sum; ncu runs kernels one at a time, so this is each kernel's time alone,
without overlap), and prints the kernels grouped by name: count, total ms, share of the step.

  python3 bench/kernel_breakdown.py --layup build/layup -- --model gpt2 --batch 32
  (arguments after -- go to `layup bench`; --csv FILE keeps ncu's raw output)

ncu needs a machine whose runtime exposes the profiler (the H200 device notes say which).
"""
import argparse
import collections
import csv
import io
import re
import shutil
import subprocess
import sys


def short_name(kernel):
    # Template arguments and parameter lists make cuBLAS/cuDNN names unreadable; keep the stem.
    name = kernel.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = name.removeprefix("void ")
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    return name.split("::")[-1][:70]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layup", default="build/layup")
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--csv", help="also write ncu's raw CSV here")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    if shutil.which(args.ncu) is None:
        sys.exit(f"{args.ncu} (Nsight Compute) is not on PATH: this tool needs it and a GPU; "
                 "give its path with --ncu")
    command = [args.ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
               "--csv", "--print-units", "base", args.layup, "bench", "--warmup", "0",
               "--steps", "1"] + bench_args
    print("running:", " ".join(command), file=sys.stderr)
    done = subprocess.run(command, capture_output=True, text=True)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(done.stdout)
    lines = done.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if done.returncode != 0 or start is None:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        sys.exit(f"ncu failed (exit {done.returncode})")
    totals = collections.defaultdict(lambda: [0, 0.0])
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        entry = totals[short_name(row["Kernel Name"])]
        entry[0] += 1
        entry[1] += float(row["Metric Value"].replace(",", "")) / 1e6  # ns -> ms
    step_ms = sum(ms for _, ms in totals.values())
    print(f"| kernel | launches | ms | share |\n|---|---|---|---|")
    for name, (count, ms) in sorted(totals.items(), key=lambda item: -item[1][1]):
        print(f"| {name} | {count} | {ms:.2f} | {100 * ms / step_ms:.1f}% |")
    print(f"| **all kernels, one step** | {sum(c for c, _ in totals.values())} | {step_ms:.2f} | |")


if __name__ == "__main__":
    main()
