"""Issue 20's table from bench/run_h200_tiers.sh's logs folder: one row per line of the issue,
each filled from the phases whose logs are there ("not run" where a phase's are missing).

Usage: python3 bench/tiers_table.py LOGS [CURVE.csv]   (stdlib only; the driver runs it after
every phase, so a warm machine's calls add up to one table). CURVE.csv gets the tier curve's
points in the form bench/plot_tier_curve.py reads.
"""
import csv
import json
import re
import statistics
import sys
from pathlib import Path

PREDICTION_LINE = 0.15  # the "predicted and measured step time within 15%"
MFU_LINE = 0.35  # the 13B-class run's MFU target
TIMED_STEPS = 5  # ... over at least this many steps after its warm-up
GLOBAL_BATCH_TOKENS = 256 * 1024  # ... with a global batch of at most this many tokens


def gpt2_params(result):
    """Parameters of a GPT-2 shaped bench result: its FLOP count's matmul weights
    ((flops_per_token - 12 L T C) / 6, the blocks' and the head's) plus the biases, layer norms
    and position embeddings that count holds no FLOPs for (13 C a block, T C, 2 C)."""
    L, C, T = result["n_layer"], result["n_embd"], result["n_positions"]
    matmul = (result["flops_per_token"] - 12 * L * result["seq_len"] * C) / 6
    return matmul + 13 * L * C + T * C + 2 * C


def load(path):
    return json.loads(path.read_text()) if path.exists() else None


def ratio(result):
    predicted = (result or {}).get("predicted") or {}
    return predicted.get("measured_over_predicted")


def within_line(result):
    """Whether a bench's measured step is within the issue's 15% of its prediction (None without
    one): every prediction is judged, not only the lines that name it."""
    r = ratio(result)
    return None if r is None else abs(r - 1) <= PREDICTION_LINE


def bench_cell(result):
    text = (f"{result['median_ms'] / 1e3:.2f} s a step, {100 * result['mfu']:.1f}% MFU"
            if result["median_ms"] >= 1e4 else
            f"{result['median_ms']:.1f} ms a step, {100 * result['mfu']:.1f}% MFU")
    r = ratio(result)
    return text + (f", {r:.2f}x predicted" if r else "")


def shape(result):
    return (f"L{result['n_layer']} H{result['n_head']} C{result['n_embd']}, "
            f"{gpt2_params(result) / 1e9:.2f}B, B={result['batch']}")


def big_row(logs):
    steps = [re.match(r"step (\d+): loss ([\d.]+), ([\d.]+) s, .* MFU ([\d.]+)%", line)
             for line in (logs / "mfu-13b.txt").read_text().splitlines()] \
        if (logs / "mfu-13b.txt").exists() else []
    steps = [m for m in steps if m]
    if len(steps) < 2:
        return "not run", None
    timed = steps[1:]  # the first step is the warm-up
    median_s = statistics.median(float(m[3]) for m in timed)
    mfus = [float(m[4]) for m in timed]
    losses = [float(m[2]) for m in steps]
    log = logs / "train-13b.log"  # /usr/bin/time -v's report at its end
    resident = log.exists() and re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                                          log.read_text())
    falling = len(losses) > 2 and min(losses[2:]) < losses[1]  # below the first timed step's
    # The global batch from the run's own header ("batch 32x1024 x4 accumulation"): at most
    # 256 x 1024 tokens a step.
    batch = log.exists() and re.search(r"batch (\d+)x(\d+)(?: x(\d+) accumulation)?",
                                       log.read_text())
    sequences = int(batch[1]) * int(batch[3] or 1) if batch else None
    within_batch = batch and sequences * int(batch[2]) <= GLOBAL_BATCH_TOKENS
    # `layup memory`'s prediction for the run's shape, where the driver calibrated first.
    memory = logs / "memory-13b.txt"
    predicted = memory.exists() and re.search(r"predicted step +([\d.]+) ms", memory.read_text())
    over = median_s / (float(predicted[1]) / 1e3) if predicted else None
    within = over is None or abs(over - 1) <= PREDICTION_LINE
    ok = (len(timed) >= TIMED_STEPS and min(mfus) >= 100 * MFU_LINE and falling and within_batch
          and within)
    return ((f"B={batch[1]} x {batch[3] or 1} ({sequences} x {batch[2]} tokens a step), "
             if batch else "global batch unknown, ")
            + f"{len(timed)} timed steps, median {median_s:.2f} s"
            + (f" ({over:.2f}x predicted)" if over is not None else "")
            + ", "
            f"MFU {statistics.median(mfus):.1f}% (lowest {min(mfus):.1f}%), "
            f"losses {', '.join(f'{x:.2f}' for x in losses)}"
            + (f", peak host {int(resident[1]) / 2**20:.1f} GiB" if resident else ""), ok)


def largest_rows(logs):
    rows = []
    for path in sorted(logs.glob("largest-*.json")):
        result = load(path)
        mode = path.stem.removeprefix("largest-").rsplit("-", 1)[0]  # largest-MODE-L
        note = ""
        for refused in logs.glob(f"largest-{mode}-refused-*.txt"):  # the scan's last refusal
            # Its first sentence: what needs how much of which tier, over what that tier has.
            why = refused.read_text().strip().removeprefix("layup: error: ").split(". ")[0]
            note = f"; L{refused.stem.rsplit('-', 1)[1]} refused: {why}"
        rows.append((f"largest GPT in {mode} mode", f"{shape(result)}: {bench_cell(result)}{note}",
                     within_line(result)))
    return rows or [("largest GPT each mode trains", "not run", None)]


def curve_points(logs):
    points = []
    for path in sorted(logs.glob("curve-*.json"), key=lambda p: (p.stem == "curve-gpu", p.stem)):
        result = load(path)
        blocks = path.stem.split("-")[1]
        plan = result["memory"]["plan"]
        points.append({
            "mode": "gpu" if blocks == "gpu" else "layup",
            "device_blocks": "" if blocks == "gpu" else int(blocks),
            "plan_device_gib":
                "" if blocks == "gpu" else f"{plan['device_side_bytes'] / 2**30:.2f}",
            "measured_peak_gib": f"{result['memory_peak_bytes'] / 2**30:.2f}",
            "measured_ms": f"{result['median_ms']:.2f}",
            "predicted_ms": f"{result['predicted']['predicted_ms']:.2f}"
            if blocks != "gpu" and result.get("predicted") else "",
        })
    points.sort(key=lambda p: (p["mode"] == "gpu", p["device_blocks"] or 0))
    return points


def checkpoint_rows(logs):
    def written(log, rss):
        """The write's size, time and rate, and the resident memory it added: the driver stamps each
        line with the time and samples the process's resident set every 0.5 s into `rss`."""
        path = logs / log
        text = path.read_text() if path.exists() else ""
        done = re.search(r"^([\d.]+) checkpoint \S+: ([\d.]+) GB in ([\d.]+) s \(([\d.]+) GB/s\)",
                         text, re.M)
        if not done:
            return "not run"
        cell = f"{done[2]} GB in {done[3]} s ({done[4]} GB/s)"
        samples = [tuple(map(float, line.split())) for line in (logs / rss).read_text().splitlines()
                   if len(line.split()) == 2] if (logs / rss).exists() else []
        start = float(done[1]) - float(done[3])
        before = [kib for t, kib in samples if t < start]
        during = [kib for t, kib in samples if start <= t <= float(done[1])]
        if before and during:
            cell += (f", resident {max(during) / 2**20:.1f} GiB at the peak of the write "
                     f"(+{(max(during) - before[-1]) / 2**20:.1f} GiB)")
        return cell

    def second_loss(log):
        path = logs / log
        m = path.exists() and re.search(r"step 2/\d+ \| loss ([\d.]+)", path.read_text())
        return m[1] if m else None

    def second_row(jsonl):
        """Step 2 of a run's log.jsonl, every digit: loss and gradient norm as the run wrote them."""
        path = logs / jsonl
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return next(((row["loss"], row["grad_norm"]) for row in rows if row.get("step") == 2), None)

    straight = second_loss("train-3.9b-straight.log")
    resumed = second_loss("train-3.9b-resumed.log")
    resume = ("not run" if straight is None or resumed is None else
              f"step-2 loss {resumed} resumed, {straight} uninterrupted")
    exact_straight = second_row("train-3.9b-straight.jsonl")
    exact_resumed = second_row("train-3.9b-resumed.jsonl")
    if resumed is not None and straight is not None:
        if exact_straight and exact_resumed:  # the driver keeps the logs: compare every digit
            resume += (", every digit of the loss and the gradient norm "
                       + ("equal" if exact_straight == exact_resumed else
                          f"compared: {exact_resumed} against {exact_straight}"))
            resumed, straight = exact_resumed, exact_straight
        else:
            resume += " (to the log's 4 decimals)"
    return [("13B weights, sharded safetensors",
             written("train-13b.log", "rss-13b.txt"), None),
            ("3.88B full state written", written("train-3.9b-first.log", "rss-3.9b.txt"), None),
            ("3.88B resumed", resume, None if resumed is None else resumed == straight)]


def main(logs, curve_csv=None):
    logs = Path(logs)
    rows = [("13B-class layup train (L40 H40 C5120)", *big_row(logs))]
    for b in (1, 2):
        result = load(logs / f"gpu-6.65b-b{b}.json")
        rows.append((f"gpu mode at 6.65B, B={b}",
                     bench_cell(result) if result else "not run", within_line(result)))
    rows += largest_rows(logs)
    disk = load(logs / "bench-disk.json")
    rows.append(("largest GPT with the disk tier",
                 f"{shape(disk)}: {bench_cell(disk)}" if disk else "not run",
                 within_line(disk)))
    points = curve_points(logs)
    layup = [p for p in points if p["mode"] == "layup" and p["predicted_ms"]]
    ratios = [float(p["measured_ms"]) / float(p["predicted_ms"]) for p in layup]
    rows.append(("gpt2-xl B=4 tier curve, measured / predicted",
                 ", ".join(f"device:{p['device_blocks']} {r:.2f}x" for p, r in zip(layup, ratios))
                 or "not run",
                 all(abs(r - 1) <= PREDICTION_LINE for r in ratios) if ratios else None))
    rows += checkpoint_rows(logs)

    print("| line | measured | holds |\n|---|---|---|")
    for what, measured, ok in rows:
        print(f"| {what} | {measured} | {'' if ok is None else ('yes' if ok else '**no**')} |")
    if curve_csv and points:
        with open(curve_csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(points[0]))
            writer.writeheader()
            writer.writerows(points)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
