"""Resume is exact: 20 steps straight == 10 steps, stop, resume, 10 steps (bit for bit), also when
the resumed run uses another mode."""
import json

import pytest
from safetensors import safe_open

from oracle_util import TINY_RUN, TINY_TRAINING, binary, read_log, run, tiny_shards


# bf16 saves: the weights a user hands on are rounded, the resume reads the fp32 master weights
# saved beside them.
@pytest.mark.parametrize("save_dtype", ["fp32", "bf16"])
def test_resume_is_bitwise_identical_to_a_straight_run(tmp_path, save_dtype):
    shards = tiny_shards(tmp_path / "data")
    common = [binary("layup"), "train", *TINY_RUN, "--steps", "20", "--data", shards,
              "--save-dtype", save_dtype]
    run([*common, "--out", tmp_path / "straight"])
    run([*common, "--until-step", "10", "--out", tmp_path / "split"])
    assert (tmp_path / "split" / "step-00000010").is_dir()
    assert not (tmp_path / "split" / "step-00000020").exists()
    run([binary("layup"), "train", "--resume", tmp_path / "split", "--steps", "20",
         *TINY_TRAINING, "--data", shards])

    names = ["model.safetensors", "training_state.safetensors"]
    if save_dtype == "bf16":
        names.append("master_weights.safetensors")
    for name in names:
        straight = (tmp_path / "straight" / "step-00000020" / name).read_bytes()
        split = (tmp_path / "split" / "step-00000020" / name).read_bytes()
        assert straight == split, f"{name} differs after resume"

    def losses(run_dir):
        return [(r["step"], r["loss"]) for r in read_log(run_dir) if "loss" in r]

    assert losses(tmp_path / "straight") == losses(tmp_path / "split")
    assert len(losses(tmp_path / "straight")) == 20


@pytest.mark.parametrize("first_mode, then_mode, clip", [
    ("layup", "gpu", "1.0"),      # layup with exact clipping (updates after backward)
    ("offload", "layup", "none"),  # layup with its updates overlapping the backward
])
def test_resume_may_change_the_mode(tmp_path, first_mode, then_mode, clip):
    """Checkpoints do not depend on the mode: 2 steps in one mode, resumed for 2 in another, give
    the same files as 4 steps in gpu mode (the modes agree bitwise on the CPU backend)."""
    shards = tiny_shards(tmp_path / "data")
    common = [binary("layup"), "train", *TINY_RUN, "--steps", "4", "--clip", clip,
              "--device", "cpu", "--data", shards]
    run([*common, "--mode", "gpu", "--out", tmp_path / "straight"])
    run([*common, "--mode", first_mode, "--until-step", "2", "--out", tmp_path / "split"])
    resumed = run([binary("layup"), "train", "--resume", tmp_path / "split", "--steps", "4",
                   *TINY_TRAINING, "--clip", clip, "--device", "cpu", "--data", shards,
                   "--mode", then_mode])
    assert f"mode {then_mode}" in resumed.stderr

    straight = tmp_path / "straight" / "step-00000004"
    split = tmp_path / "split" / "step-00000004"
    assert (straight / "model.safetensors").read_bytes() == \
        (split / "model.safetensors").read_bytes(), f"weights differ after {first_mode} -> {then_mode}"
    # The training state holds the same moments and scalars; its saved settings name the mode
    # each run last used (a resume continues in it), and nothing else differs.
    state = [safe_open(str(d / "training_state.safetensors"), "np") for d in (straight, split)]
    for tensor in ("adamw.m", "adamw.v"):
        assert (state[0].get_tensor(tensor) == state[1].get_tensor(tensor)).all(), tensor
    metadata = [s.metadata() for s in state]
    settings = [json.loads(m.pop("options")) for m in metadata]
    assert metadata[0] == metadata[1]
    assert (settings[0].pop("mode"), settings[1].pop("mode")) == ("gpu", then_mode)
    assert settings[0] == settings[1]

    def losses(run_dir):
        return [(r["step"], r["loss"]) for r in read_log(run_dir) if "loss" in r]

    assert losses(tmp_path / "straight") == losses(tmp_path / "split")
    assert len(losses(tmp_path / "straight")) == 4


@pytest.mark.parametrize("first, then", [
    (["--mode", "gpu"], ["--mode", "layup"]),      # the device's memory -> the host's, by span
    (["--mode", "layup"], ["--mode", "offload"]),
    # streamed weights (--streamed-blocks): the ring holds copies; the state is the host's
    (["--mode", "layup", "--streamed-blocks", "1"], ["--mode", "offload", "--streamed-blocks", "2"]),
])
def test_a_sharded_checkpoint_resumes_into_another_placement(tmp_path, first, then):
    """Checkpoints are written and read span by span, from and into whichever side holds a span's
    state: 2 steps in one mode, resumed for 2 in another, give the files and losses of 4 steps
    straight. 1 MB shards split the weights and the optimizer state into several files each.
    (The CPU backend takes no --optimizer-placement device:K; ScheduleCheckpoint's C++ tests
    resume into device-updated spans.)"""
    shards = tiny_shards(tmp_path / "data")
    common = [binary("layup"), "train", *TINY_RUN, "--steps", "4", "--device", "cpu",
              "--checkpoint-shard-mb", "1", "--data", shards]
    run([*common, *first, "--out", tmp_path / "straight"])
    run([*common, *first, "--until-step", "2", "--out", tmp_path / "split"])
    resumed = run([binary("layup"), "train", "--resume", tmp_path / "split", *then])
    assert "resumed from" in resumed.stderr

    straight = tmp_path / "straight" / "step-00000004"
    split = tmp_path / "split" / "step-00000004"
    names = sorted(p.name for p in straight.iterdir())
    assert names == sorted(p.name for p in split.iterdir())
    assert len([n for n in names if n.startswith("model-")]) > 1, names
    assert len([n for n in names if n.startswith("optimizer-")]) > 1, names
    for name in names:
        if name == "optimizer.safetensors.index.json":
            continue  # its metadata names the run's settings, which differ by the placement flags
        assert (straight / name).read_bytes() == (split / name).read_bytes(), name
    state = [json.loads((d / "optimizer.safetensors.index.json").read_text())
             for d in (straight, split)]
    assert state[0]["weight_map"] == state[1]["weight_map"]
    assert state[0]["metadata"]["step"] == state[1]["metadata"]["step"] == "4"

    def losses(run_dir):
        return [(r["step"], r["loss"]) for r in read_log(run_dir) if "loss" in r]

    assert losses(tmp_path / "straight") == losses(tmp_path / "split")
