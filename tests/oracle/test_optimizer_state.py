"""--optimizer-state (docs/optimizer_state.md): bf16 and 8-bit AdamW moments are the user's choice,
named in the run's log as lossy; they train like fp32 moments, not bit for bit, and every mode
takes the same steps with them."""
import json

import pytest
from safetensors import safe_open

from oracle_util import TINY_MODEL, binary, read_log, run, tiny_shards

# No evaluation and no sample: the tests compare the steps' losses.
RUN = [*TINY_MODEL, "--seq-len", "32", "--batch", "4", "--eval-every", "0", "--sample-tokens", "0",
       "--warmup", "2", "--lr", "1e-3", "--min-lr", "1e-4", "--device", "cpu"]

LOSSY = {
    "bf16": "optimizer state: bf16 (moments rounded to bfloat16, lossy; docs/optimizer_state.md)",
    "8bit": "optimizer state: 8bit (blockwise 8-bit moments, lossy; docs/optimizer_state.md)",
}


def losses(run_dir):
    return [r["loss"] for r in read_log(run_dir) if "loss" in r]


def test_compact_state_is_named_in_the_log_and_trains_like_fp32(tmp_path):
    shards = tiny_shards(tmp_path / "data")
    common = [binary("layup"), "train", *RUN, "--steps", "8", "--mode", "gpu", "--data", shards,
              "--no-checkpoints"]
    exact = run([*common, "--out", tmp_path / "fp32"])
    assert "optimizer state: fp32" in exact.stderr
    reference = losses(tmp_path / "fp32")
    for kind, line in LOSSY.items():
        result = run([*common, "--optimizer-state", kind, "--out", tmp_path / kind])
        assert line in result.stderr, result.stderr
        got = losses(tmp_path / kind)
        assert len(got) == len(reference) == 8
        assert got[0] == reference[0]  # the first step's loss comes before any update
        assert got != reference, f"{kind} moments trained bit for bit like fp32's"
        assert abs(got[-1] - reference[-1]) < 0.02 * reference[-1], (kind, got, reference)


def test_bench_reports_the_state_kind(tmp_path):
    out = tmp_path / "bench.json"
    run([binary("layup"), "bench", *["--layers", "2", "--heads", "2", "--dim", "32"],
         "--batch", "2", "--seq-len", "16", "--steps", "2", "--warmup", "1", "--device", "cpu",
         "--mode", "gpu", "--optimizer-state", "8bit", "--json", out])
    assert LOSSY["8bit"] in json.loads(out.read_text())["schedule"]


@pytest.mark.parametrize("kind", ["bf16", "8bit"])
def test_every_mode_and_the_disk_tier_train_alike_with_compact_state(tmp_path, kind):
    """On the CPU backend the modes take the same steps with compact moments too: the same losses
    and the same checkpoint, layup with a block's state on disk included."""
    shards = tiny_shards(tmp_path / "data")
    common = [binary("layup"), "train", *RUN, "--steps", "4", "--data", shards,
              "--optimizer-state", kind]
    runs = {"gpu": ["--mode", "gpu"], "offload": ["--mode", "offload"],
            "layup": ["--mode", "layup"],
            "layup-disk": ["--mode", "layup", "--layup-clip", "deferred",
                           "--optimizer-placement", "disk:1", "--offload-dir", tmp_path]}
    for name, flags in runs.items():
        result = run([*common, *flags, "--out", tmp_path / name])
        assert LOSSY[kind] in result.stderr, result.stderr
    def moments(name):
        with safe_open(str(tmp_path / name / "step-00000004" / "training_state.safetensors"),
                       "np") as state:
            return [state.get_tensor(tensor) for tensor in ("adamw.m", "adamw.v")]

    for name in runs:
        assert losses(tmp_path / name) == losses(tmp_path / "gpu"), name
        assert (tmp_path / name / "step-00000004" / "model.safetensors").read_bytes() == \
            (tmp_path / "gpu" / "step-00000004" / "model.safetensors").read_bytes(), name
        for got, expected in zip(moments(name), moments("gpu")):
            assert (got == expected).all(), name


def test_an_unknown_kind_is_refused_naming_the_kinds(tmp_path):
    result = run([binary("layup"), "train", "--optimizer-state", "4bit"], check=False)
    assert result.returncode != 0
    assert "fp32, bf16, 8bit" in result.stderr and "4bit" in result.stderr


def test_zero1_ranks_keep_their_parts_in_the_kind_and_train_like_one_process(tmp_path):
    """ZeRO-1 over three ranks cuts the embeddings' span inside it, at an 8-bit block's start: the
    ranks' 8-bit moments are one process's, so the run's losses and checkpoint are too."""
    from test_data_parallel import COMMON, mpi_missing, ranks
    if mpi_missing() is not None:
        pytest.skip(mpi_missing())
    shards = tiny_shards(tmp_path / "data")
    args = ["train", *COMMON, "--mode", "gpu", "--optimizer-state", "8bit", "--steps", "3",
            "--grad-accum", "3", "--data", shards]
    run([binary("layup"), *args, "--out", tmp_path / "one"])
    three = ranks(3, [*args, "--out", tmp_path / "three"])
    assert "this rank's shard of 3 (ZeRO-1)" in three.stderr and LOSSY["8bit"] in three.stderr
    assert losses(tmp_path / "one") == losses(tmp_path / "three")
    for name in ("model.safetensors", "training_state.safetensors"):
        assert (tmp_path / "one" / "step-00000003" / name).read_bytes() == \
            (tmp_path / "three" / "step-00000003" / name).read_bytes(), name


def test_layup_memory_counts_the_kinds_bytes_and_names_the_kind():
    """`layup memory --optimizer-state 8bit` plans the smaller state: gpu mode's moments on the
    device take about a quarter of fp32's."""
    def moments_mib(kind):
        out = run([binary("layup"), "memory", "--model", "gpt2", "--device", "cuda",
                   "--optimizer-state", kind]).stdout
        assert ("optimizer state: " + kind) in out.splitlines()[1], out
        row = next(line for line in out.splitlines() if line.strip().startswith("optimizer moments"))
        value, unit = row.split()[2:4]  # the gpu column
        return float(value) * {"MiB": 1, "GiB": 1024}[unit]

    fp32, bf16, blockwise = moments_mib("fp32"), moments_mib("bf16"), moments_mib("8bit")
    assert bf16 == pytest.approx(fp32 / 2, rel=1e-3)
    assert blockwise == pytest.approx(fp32 * 2.03125 / 8, rel=1e-3)
