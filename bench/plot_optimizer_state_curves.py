"""Validation loss against step for each optimizer state kind: layup's runs (their log.jsonl) and
the PyTorch peer's (bench/pytorch_optimizer_state_peer.py CSVs), on one axis, and a Markdown
table of the final losses with each run's ratio to its engine's fp32 run.

Usage: python bench/plot_optimizer_state_curves.py OUT.png LABEL=FILE ...  (needs matplotlib)
  a FILE ending in .jsonl is a layup log, .csv a peer's; each engine's first run (give its fp32
  run first) is the reference its others are divided by.
"""
import csv
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_curve(path):
    """(steps, validation losses) of a layup log.jsonl or a peer CSV."""
    steps, losses = [], []
    if path.endswith(".jsonl"):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if "val_loss" in record:
                    steps.append(record["step"])
                    losses.append(record["val_loss"])
    else:
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["val_loss"]:
                    steps.append(int(row["step"]))
                    losses.append(float(row["val_loss"]))
    return steps, losses


def main(png_path, runs):
    curves = []
    for run in runs:
        label, path = run.split("=", 1)
        curves.append((label, path.endswith(".jsonl"), *read_curve(path)))
    # One axis for every run, so the compact kinds and the peer's 8-bit AdamW are read against
    # the same fp32 curves: layup's runs solid, the peer's dashed.
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=150)
    for label, is_layup, steps, losses in curves:
        ax.plot(steps[1:], losses[1:], label=label,  # step 0 (~10.9) squashes the axis
                linestyle="-" if is_layup else "--")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)

    print("| run | final validation loss | / its engine's fp32 |")
    print("|---|---|---|")
    for engine_is_layup in (True, False):
        engine = [c for c in curves if c[1] == engine_is_layup]
        if not engine:
            continue
        reference = engine[0][3][-1]
        for label, _, _, losses in engine:
            print(f"| {label} | {losses[-1]:.4f} | {losses[-1] / reference:.4f} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
