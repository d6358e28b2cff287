#!/usr/bin/env python3
"""Draws a run's training and validation loss from its log.jsonl (written by `layup train`).

  python3 scripts/plot_training.py RUN/log.jsonl docs/figure.png --title "gpt2, 1000 steps"

Needs matplotlib (pip install matplotlib).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("png")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    train_steps, train_loss, val_steps, val_loss = [], [], [], []
    with open(args.log) as f:
        for line in f:
            record = json.loads(line)
            if "val_loss" in record:
                val_steps.append(record["step"])
                val_loss.append(record["val_loss"])
            elif "loss" in record:
                train_steps.append(record["step"])
                train_loss.append(record["loss"])
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.plot(train_steps, train_loss, color="#9ab", linewidth=0.8, label="training loss (per step)")
    ax.plot(val_steps, val_loss, color="#c33", marker="o", markersize=3, linewidth=1.5,
            label="validation loss")
    if val_loss:
        best = min(range(len(val_loss)), key=val_loss.__getitem__)
        ax.annotate(f"final {val_loss[-1]:.3f}", (val_steps[-1], val_loss[-1]),
                    textcoords="offset points", xytext=(-70, 12))
        ax.annotate(f"lowest {val_loss[best]:.3f} (step {val_steps[best]})",
                    (val_steps[best], val_loss[best]), textcoords="offset points",
                    xytext=(-40, -18))
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
