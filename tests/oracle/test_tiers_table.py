"""bench/tiers_table.py reads run_h200_tiers.sh's logs into issue 20's table: each line's figure
from its phase's logs, "not run" where they are missing, and the issue's lines (35% MFU, falling
loss, prediction within 15%, resumed loss equal) judged from the numbers, not assumed.
"""
import csv
import json
import subprocess
import sys

from paths import REPO

SCRIPT = REPO / "bench" / "tiers_table.py"


def bench_result(L, C, median_ms, mfu, predicted_ms=None, device_bytes=0, peak_bytes=0):
    """The fields of a `layup bench --json` result the table reads, for a GPT-2 of L blocks and
    width C (vocabulary 50257, T = 1024)."""
    T = 1024
    matmul = 12 * L * C * C + 50257 * C
    result = {"n_layer": L, "n_head": C // 128, "n_embd": C, "n_positions": T, "seq_len": T,
              "batch": 4, "flops_per_token": 6 * matmul + 12 * L * T * C, "median_ms": median_ms,
              "mfu": mfu, "memory_peak_bytes": peak_bytes,
              "memory": {"plan": {"device_side_bytes": device_bytes}}}
    if predicted_ms:
        result["predicted"] = {"predicted_ms": predicted_ms,
                               "measured_over_predicted": median_ms / predicted_ms}
    return result


def table(logs, csv_path=None):
    args = [sys.executable, str(SCRIPT), str(logs)] + ([str(csv_path)] if csv_path else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines()[2:]:  # after the header and its rule
        what, measured, holds = line[2:-2].split(" | ")  # "| what | measured | holds |"
        rows[what] = (measured, holds)
    return rows


def write(logs, name, content):
    (logs / name).write_text(json.dumps(content) if isinstance(content, dict) else content)


def mfu_log(mfus, losses):
    """mfu-13b.txt as the driver writes it: a warm-up step, then one line a timed step."""
    lines = ["step 1: loss 11.7000, 31.00 s, 4,000 tok/s, MFU 33.0%, peak device 1 GiB"]
    lines += [f"step {k}: loss {loss:.4f}, 28.00 s, 4,700 tok/s, MFU {mfu:.1f}%, peak device 1 GiB"
              for k, (mfu, loss) in enumerate(zip(mfus, losses), start=2)]
    return "\n".join(lines)


def test_every_line_not_run_without_its_logs(tmp_path):
    rows = table(tmp_path)
    assert len(rows) == 9
    assert all(measured == "not run" for measured, _ in rows.values()), rows
    assert all(holds == "" for _, holds in rows.values()), rows


def test_lines_judged_from_the_logs(tmp_path):
    write(tmp_path, "mfu-13b.txt", mfu_log([40, 39, 38, 37, 36], [20, 19, 18, 17, 16]))
    write(tmp_path, "train-13b.log", header(32, 4) +
          "200.0 checkpoint /tmp/x/step-00000006: 51.39 GB in 64.6 s (0.80 GB/s)\n"
          "201.0 \tMaximum resident set size (kbytes): 104857600\n")
    write(tmp_path, "gpu-6.65b-b1.json", bench_result(32, 4096, 126.0, 0.341, 121.0))
    write(tmp_path, "largest-layup-42.json", bench_result(42, 5120, 3695.7, 0.374, 3684.2))
    write(tmp_path, "largest-layup-refused-44.txt",
          "layup: error: custom needs 130 GiB of host memory, over 120 GiB. Even --batch 1 ...")
    write(tmp_path, "bench-disk.json", bench_result(58, 5120, 60000.0, 0.033, 50000.0))
    write(tmp_path, "curve-0.json", bench_result(48, 1600, 460.0, 0.09, 500.0, 14 << 30, 15 << 30))
    write(tmp_path, "curve-48.json", bench_result(48, 1600, 95.0, 0.45, 86.0, 36 << 30, 37 << 30))
    write(tmp_path, "curve-gpu.json", bench_result(48, 1600, 94.0, 0.45, None, 0, 36 << 30))
    write(tmp_path, "train-3.9b-first.log", "100.0 step 1/1 | loss 11.6\n"
          "150.0 checkpoint /tmp/x/step-00000001: 46.61 GB in 40.0 s (1.17 GB/s)\n")
    write(tmp_path, "rss-3.9b.txt", "105.0 524288\n120.0 3145728\n155.0 524288\n")
    write(tmp_path, "train-3.9b-straight.log", "step 2/2 | loss 20.2134 | lr 3e-05\n")
    write(tmp_path, "train-3.9b-resumed.log", "step 2/2 | loss 20.2135 | lr 3e-05\n")

    rows = table(tmp_path, tmp_path / "curve.csv")
    measured, holds = rows["13B-class layup train (L40 H40 C5120)"]
    assert measured.startswith("B=32 x 4 (128 x 1024 tokens a step), 5 timed steps, "
                               "median 28.00 s, MFU 38.0% (lowest 36.0%)"), measured
    assert "peak host 100.0 GiB" in measured and holds == "yes"
    assert rows["gpu mode at 6.65B, B=1"] == ("126.0 ms a step, 34.1% MFU, 1.04x predicted", "yes")
    assert rows["gpu mode at 6.65B, B=2"][0] == "not run"
    unpredicted = tmp_path / "unpredicted"  # a bench without a calibration's prediction
    unpredicted.mkdir()
    write(unpredicted, "bench-disk.json", bench_result(58, 5120, 60000.0, 0.033))
    assert table(unpredicted)["largest GPT with the disk tier"] == (
        "L58 H40 C5120, 18.51B, B=4: 60.00 s a step, 3.3% MFU", "")
    measured, holds = rows["largest GPT in layup mode"]
    assert measured.startswith("L42 H40 C5120, 13.48B, B=4: 3695.7 ms a step, 37.4% MFU"), measured
    assert measured.endswith("L44 refused: custom needs 130 GiB of host memory, over 120 GiB")
    assert holds == "yes"
    write(tmp_path, "largest-offload-22.json", bench_result(22, 5120, 2932.5, 0.063, 3790.5))
    assert table(tmp_path)["largest GPT in offload mode"][1] == "**no**"  # 0.77x its prediction
    assert rows["largest GPT with the disk tier"] == (
        "L58 H40 C5120, 18.51B, B=4: 60.00 s a step, 3.3% MFU, 1.20x predicted", "**no**")
    assert rows["gpt2-xl B=4 tier curve, measured / predicted"] == (
        "device:0 0.92x, device:48 1.10x", "yes")
    assert rows["13B weights, sharded safetensors"][0] == "51.39 GB in 64.6 s (0.80 GB/s)"
    measured, _ = rows["3.88B full state written"]
    assert measured == ("46.61 GB in 40.0 s (1.17 GB/s), resident 3.0 GiB at the peak of the "
                        "write (+2.5 GiB)"), measured
    assert rows["3.88B resumed"] == (
        "step-2 loss 20.2135 resumed, 20.2134 uninterrupted (to the log's 4 decimals)", "**no**")

    with open(tmp_path / "curve.csv") as f:
        points = list(csv.DictReader(f))
    assert [(p["mode"], p["device_blocks"]) for p in points] == [
        ("layup", "0"), ("layup", "48"), ("gpu", "")]
    assert points[0]["plan_device_gib"] == "14.00" and points[0]["measured_peak_gib"] == "15.00"
    assert points[1]["measured_ms"] == "95.00" and points[1]["predicted_ms"] == "86.00"
    assert points[2]["predicted_ms"] == ""


def header(batch, accumulation):
    """The line of train-13b.log that names the run's global batch."""
    return (f"100.0 layup train: custom (40 layers, 40 heads, width 5120, 12848.1M parameters), "
            f"batch {batch}x1024 x{accumulation} accumulation, 6 steps, mode layup on cuda\n")


def test_13b_line_holds_only_at_35_percent_with_falling_loss_over_5_steps(tmp_path):
    line = "13B-class layup train (L40 H40 C5120)"
    falling = [20, 19, 18, 17, 16]
    write(tmp_path, "train-13b.log", header(16, 8))
    write(tmp_path, "mfu-13b.txt", mfu_log([38, 37, 36, 35, 35], falling))
    assert table(tmp_path)[line][1] == "yes"
    write(tmp_path, "mfu-13b.txt", mfu_log([38, 37, 36, 34.9, 38], falling))
    assert table(tmp_path)[line][1] == "**no**"
    write(tmp_path, "mfu-13b.txt", mfu_log([38, 37, 36, 35, 35], [20, 21, 22, 23, 24]))
    assert table(tmp_path)[line][1] == "**no**"
    write(tmp_path, "mfu-13b.txt", mfu_log([38, 37, 36, 35], falling[:4]))
    assert table(tmp_path)[line][1] == "**no**"


def test_13b_line_holds_only_within_256_x_1024_tokens_a_step(tmp_path):
    line = "13B-class layup train (L40 H40 C5120)"
    write(tmp_path, "mfu-13b.txt", mfu_log([38, 37, 36, 35, 35], [20, 19, 18, 17, 16]))
    write(tmp_path, "train-13b.log", header(32, 8))
    assert table(tmp_path)[line] == (
        "B=32 x 8 (256 x 1024 tokens a step), 5 timed steps, median 28.00 s, MFU 36.0% "
        "(lowest 35.0%), losses 11.70, 20.00, 19.00, 18.00, 17.00, 16.00", "yes")
    write(tmp_path, "train-13b.log", header(32, 9))
    assert table(tmp_path)[line][1] == "**no**"
    (tmp_path / "train-13b.log").unlink()  # a batch the table cannot read is not assumed
    measured, holds = table(tmp_path)[line]
    assert measured.startswith("global batch unknown") and holds == "**no**"


def test_resume_compares_every_digit_where_the_driver_kept_the_logs(tmp_path):
    write(tmp_path, "train-3.9b-straight.log", "step 2/2 | loss 20.2141 | lr 3e-05\n")
    write(tmp_path, "train-3.9b-resumed.log", "step 2/2 | loss 20.2141 | lr 3e-05\n")
    step1 = json.dumps({"step": 1, "loss": 11.652, "grad_norm": 3.5})

    def jsonl(loss, norm):
        return step1 + "\n" + json.dumps({"step": 2, "loss": loss, "grad_norm": norm}) + "\n"

    write(tmp_path, "train-3.9b-straight.jsonl", jsonl(20.214111328125, 41.25))
    write(tmp_path, "train-3.9b-resumed.jsonl", jsonl(20.214111328125, 41.25))
    assert table(tmp_path)["3.88B resumed"] == (
        "step-2 loss 20.2141 resumed, 20.2141 uninterrupted, every digit of the loss and the "
        "gradient norm equal", "yes")
    # Equal to the printed decimals, apart in the last bits: not equal.
    write(tmp_path, "train-3.9b-resumed.jsonl", jsonl(20.214113235473633, 41.25))
    measured, holds = table(tmp_path)["3.88B resumed"]
    assert "compared: (20.214113235473633, 41.25) against (20.214111328125, 41.25)" in measured
    assert holds == "**no**"


def test_13b_line_shows_and_judges_the_prediction_where_the_driver_calibrated_first(tmp_path):
    line = "13B-class layup train (L40 H40 C5120)"
    write(tmp_path, "mfu-13b.txt", mfu_log([38, 37, 36, 35, 35], [20, 19, 18, 17, 16]))
    assert "predicted" not in table(tmp_path)[line][0]
    write(tmp_path, "memory-13b.txt", "predicted step time (calibration ...)\n"
          "  predicted step     22400.0 ms (bound by GPU)\n")
    write(tmp_path, "train-13b.log", header(32, 4))
    assert table(tmp_path)[line] == (
        "B=32 x 4 (128 x 1024 tokens a step), 5 timed steps, median 28.00 s (1.25x predicted), "
        "MFU 36.0% (lowest 35.0%), losses 11.70, 20.00, 19.00, 18.00, 17.00, 16.00", "**no**")
    write(tmp_path, "memory-13b.txt", "  predicted step     27000.0 ms (bound by GPU)\n")
    assert table(tmp_path)[line][1] == "yes"  # 1.04x: within the 15%
