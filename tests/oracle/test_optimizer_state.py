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
            return [state.get_tensor("adamw.coded")]  # the coded moments, as the run keeps them

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


@pytest.mark.parametrize("kind, then, shard_mb", [
    ("8bit", "layup", "1"),        # resumed in another mode, its state sharded
    ("bf16", "offload", "5000"),   # one file
])
def test_resume_carries_the_coded_state_bit_for_bit(tmp_path, kind, then, shard_mb):
    """A checkpoint keeps the moments as the run codes them (U8 tensors, the kind in the
    metadata): 4 steps, a stop and 4 more steps equal 8 straight, in the same kind."""
    shards = tiny_shards(tmp_path / "data")
    common = [binary("layup"), "train", *RUN, "--steps", "8", "--data", shards,
              "--optimizer-state", kind, "--checkpoint-shard-mb", shard_mb]
    run([*common, "--mode", "gpu", "--out", tmp_path / "straight"])
    run([*common, "--mode", "gpu", "--until-step", "4", "--out", tmp_path / "split"])
    run([binary("layup"), "train", "--resume", tmp_path / "split", "--mode", then])
    assert losses(tmp_path / "straight") == losses(tmp_path / "split")

    def state(run_dir):
        step = run_dir / "step-00000008"
        files = sorted(step.glob("optimizer-*.safetensors")) or [step / "training_state.safetensors"]
        tensors, metadata = {}, {}
        for file in files:
            with safe_open(str(file), "np") as f:
                metadata.update(f.metadata() or {})
                tensors.update({name: f.get_tensor(name) for name in f.keys()})
        return tensors, metadata

    (straight, meta), (split, _) = state(tmp_path / "straight"), state(tmp_path / "split")
    for model in (tmp_path / "straight" / "step-00000008").glob("model*.safetensors"):
        assert model.read_bytes() == \
            (tmp_path / "split" / "step-00000008" / model.name).read_bytes(), model.name
    assert straight.keys() == split.keys() and all(n.startswith("adamw.coded") for n in straight)
    assert all(straight[n].dtype.name == "uint8" and (straight[n] == split[n]).all()
               for n in straight)
    if shard_mb == "5000":
        assert meta["optimizer_state"] == kind


def test_resume_with_another_kind_is_refused_naming_both(tmp_path):
    shards = tiny_shards(tmp_path / "data")
    run([binary("layup"), "train", *RUN, "--steps", "4", "--until-step", "2", "--data", shards,
         "--optimizer-state", "8bit", "--out", tmp_path / "run"])
    result = run([binary("layup"), "train", "--resume", tmp_path / "run", "--optimizer-state",
                  "fp32"], check=False)
    assert result.returncode != 0
    assert "--optimizer-state" in result.stderr and "8bit" in result.stderr \
        and "fp32" in result.stderr, result.stderr


def test_a_state_saved_before_kinds_resumes_as_fp32_or_coded_when_asked(tmp_path):
    """A training state without "optimizer_state" (layup before the flag) holds fp32 moments: it
    resumes as fp32, or coded into 8bit where --optimizer-state asks for it."""
    from safetensors.numpy import save_file
    shards = tiny_shards(tmp_path / "data")
    run([binary("layup"), "train", *RUN, "--steps", "4", "--until-step", "2", "--data", shards,
         "--out", tmp_path / "old"])
    path = tmp_path / "old" / "step-00000002" / "training_state.safetensors"
    with safe_open(str(path), "np") as f:
        metadata = dict(f.metadata())
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    del metadata["optimizer_state"]
    options = json.loads(metadata["options"])
    del options["optimizer_state"]
    metadata["options"] = json.dumps(options)
    save_file(tensors, str(path), metadata=metadata)
    import shutil
    shutil.copytree(tmp_path / "old", tmp_path / "coded")
    resumed = run([binary("layup"), "train", "--resume", tmp_path / "old"])
    assert "optimizer state: fp32" in resumed.stderr
    coded = run([binary("layup"), "train", "--resume", tmp_path / "coded", "--optimizer-state",
                 "8bit"])
    assert LOSSY["8bit"] in coded.stderr
    assert len(losses(tmp_path / "coded")) == 4
