"""Step time against device memory from a tier-curve CSV (bench/run_h200_tiers.sh PHASE=curve).

Usage: python bench/plot_tier_curve.py RUN.csv OUT.png  (needs matplotlib)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path: str, png_path: str) -> None:
    with open(csv_path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    layup = [r for r in rows if r["mode"] == "layup"]
    gpu = [r for r in rows if r["mode"] == "gpu"]
    x = [float(r["measured_peak_gib"]) for r in layup]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=150)
    ax.plot(x, [float(r["measured_ms"]) for r in layup], "o-", label="layup, measured")
    ax.plot(x, [float(r["predicted_ms"]) for r in layup], "s--", label="layup, predicted")
    for r, xi in zip(layup, x):
        ax.annotate(f"device:{r['device_blocks']}", (xi, float(r["measured_ms"])),
                    textcoords="offset points", xytext=(6, 6), fontsize=8)
    for r in gpu:
        ax.plot(float(r["measured_peak_gib"]), float(r["measured_ms"]), "k^", markersize=9,
                label="gpu mode, measured")
    ax.set_xlabel("GPU memory at the peak (GiB, measured)")
    ax.set_ylabel("step time (ms, median)")
    ax.set_title("gpt2-xl B=4 on one H200: blocks' optimizer state on the GPU vs step time")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
