"""Bad input gets a clear message, a non-zero exit, and damages no file (through the CLI)."""
import hashlib
import shutil
import struct

import pytest

from oracle_util import DATA_DIR, TINY_RUN, TINY_TRAINING, binary, run, tiny_shards


def snapshot(*roots):
    """sha256 of every file under the roots, to show that a failed command changed nothing."""
    files = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def fails_with(args, *phrases):
    result = run(args, check=False)
    assert result.returncode == 1, \
        f"expected exit 1, got {result.returncode}:\n{result.stdout}\n{result.stderr}"
    message = result.stderr.lower()
    for phrase in phrases:
        assert phrase.lower() in message, f"{phrase!r} not in:\n{result.stderr}"
    assert "terminate called" not in result.stderr and "Sanitizer" not in result.stderr
    return result


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


def train(data, out, *extra):
    return [binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", data, "--out", out,
            *extra]


def damaged_data(tmp_path, shards, damage):
    """A copy of the shards whose train shard was rewritten by `damage(bytes) -> bytes`."""
    data = tmp_path / "damaged"
    shutil.copytree(shards, data)
    shard = data / "train_000000.bin"
    shard.write_bytes(damage(shard.read_bytes()))
    return data


def shard_case(tmp_path, shards, damage, *phrases):
    data = damaged_data(tmp_path, shards, damage)
    before = snapshot(data)
    fails_with(train(data, tmp_path / "run"), "train_000000.bin", *phrases)
    assert snapshot(data) == before
    assert not (tmp_path / "run").exists(), "a failed start must not leave a run folder"


def test_missing_shards(tmp_path):
    fails_with(train(tmp_path / "nowhere", tmp_path / "run"), str(tmp_path / "nowhere"))


def test_empty_shard(tmp_path, shards):
    shard_case(tmp_path, shards, lambda b: b"", "empty")


def test_truncated_shard(tmp_path, shards):
    shard_case(tmp_path, shards, lambda b: b[:len(b) - 100], "truncated")


def test_wrong_magic(tmp_path, shards):
    shard_case(tmp_path, shards, lambda b: struct.pack("<i", 12345) + b[4:], "magic")


def test_token_id_out_of_vocabulary(tmp_path, shards):
    def poison(b):
        return b[:1024 + 20] + struct.pack("<H", 50300) + b[1024 + 22:]
    shard_case(tmp_path, shards, poison, "50300", "vocab")


def test_corrupted_checkpoint_on_resume(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--until-step", "1"))
    weights = tmp_path / "run" / "step-00000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    before = snapshot(tmp_path / "run")
    fails_with([binary("layup"), "train", "--resume", tmp_path / "run", *TINY_TRAINING,
                "--steps", "2", "--data", shards], "model.safetensors")
    assert snapshot(tmp_path / "run") == before


def test_corrupted_tokenizer(tmp_path, shards):
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    ranks = (DATA_DIR / "gpt2-tokenizer" / "gpt2.tiktoken").read_bytes()
    (tokenizer / "gpt2.tiktoken").write_bytes(ranks[:5000] + b"%%%not base64%%% 17\n" + ranks[5000:])
    before = snapshot(tokenizer)
    fails_with(train(shards, tmp_path / "run", "--tokenizer", tokenizer), "gpt2.tiktoken")
    assert snapshot(tokenizer) == before


@pytest.mark.parametrize("flags, phrase", [
    (["--model", "gpt2", "--layers", "2"], "either --model or --layers"),
    (["--model", "gpt2", "--seq-len", "2048"], "above the model's context"),
    (["--batch", "0"], "--batch"),
    (["--min-lr", "1", "--lr", "0.1"], "--min-lr"),
    (["--warmup", "50", "--steps", "10"], "--warmup"),
    (["--until-step", "30", "--steps", "10"], "--until-step"),
    (["--clip", "-1"], "--clip"),
    (["--model", "nonsense"], "unknown model config"),
    (["--layers", "0", "--heads", "2", "--dim", "32"], "--layers must be an integer ≥ 1 (got '0')"),
    (["--layers", "2", "--heads", "2", "--dim", "32", "--context", "0"], "--context must be"),
    (["--context", "16"], "above the model's context"),  # --seq-len 256 by default
    (["--seed", "-1"], "--seed must be 0 .. 2^64-1 (got '-1')"),
    (["--seed", "18446744073709551616"], "--seed must be 0 .. 2^64-1 (got '18446744073709551616', above"),
    (["--eps", "inf"], "--eps must be a finite number > 0 (got 'inf')"),
    (["--lr", "inf"], "--lr must be a finite number > 0 (got 'inf')"),
    (["--lr", "nan"], "--lr must be a finite number > 0 (got 'nan')"),
    (["--beta2", "nan"], "--beta2 must be [0, 1) (got 'nan')"),
    (["--beta2", "0.9999999999"], "(got '0.9999999999', which a 32-bit float holds as 1)"),
    (["--threads", "100000"], "--threads must be 1 .. cores (got '100000', this process may run on"),
    (["--threads", "0"], "--threads must be 1 .. cores (got '0'"),
    (["--cpu-workers", "100000", "--mode", "layup"], "--cpu-workers must be 1 .. cores (got '100000'"),
    (["--until-step", "-1"], "--until-step must be 1 .. --steps (got '-1')"),
    (["--steps", "abc", "--steps", "2"], "--steps must be an integer ≥ 1 (got 'abc')"),
    (["--resume", ""], "--resume must not be empty"),
    (["--out", "--overwrite"], "--out takes a name, and '--overwrite' reads as a flag"),
    (["--memory-budget", ""], "--memory-budget takes a positive size"),
    (["--log-every", "0"], "--log-every"),
])
def test_contradictory_or_out_of_range_flags(tmp_path, shards, flags, phrase):
    fails_with([binary("layup"), "train", "--data", shards, "--out", tmp_path / "run", *flags],
               phrase)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "bench", "memory", "study"])
@pytest.mark.parametrize("flags, phrase", [
    (["--model", "gpt2", "--layers", "2"], "give either --model or --layers/--heads/--dim"),
    (["--layers", "2", "--heads", "2"], "an explicit model needs all of --layers, --heads and"),
    (["--layers", "0", "--heads", "2", "--dim", "32"], "--layers must be an integer ≥ 1 (got '0')"),
    (["--layers", "2", "--heads", "2", "--dim", "32", "--context", "0"],
     "--context must be an integer ≥ --seq-len (got '0')"),
    (["--layers", "2", "--heads", "2", "--dim", "32", "--context", "16", "--seq-len", "32"],
     "--seq-len 32 is above the model's context of 16 positions"),
])
def test_every_command_checks_the_model_flags_alike(tmp_path, shards, command, flags, phrase):
    out = {"train": ["--data", shards, "--out", tmp_path / "out"],
           "study": ["--out", tmp_path / "out"]}.get(command, [])
    fails_with([binary("layup"), command, "--device", "cpu", *flags, *out], phrase)
    assert not (tmp_path / "out").exists()


def test_resume_refuses_model_flags(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--until-step", "1"))
    before = snapshot(tmp_path / "run")
    fails_with([binary("layup"), "train", "--resume", tmp_path / "run", "--model", "gpt2"],
               "--resume takes the model from the checkpoint")
    assert snapshot(tmp_path / "run") == before


def test_diverging_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, shards):
    # A huge learning rate without clipping makes the loss non-finite within a few steps.
    args = [binary("layup"), "train", *TINY_RUN, "--steps", "30", "--data", shards,
            "--out", tmp_path / "run", "--lr", "1e30", "--min-lr", "1e30", "--clip", "none",
            "--checkpoint-every", "1", "--keep-checkpoints", "1", "--warmup", "0",
            "--eval-every", "0"]
    result = fails_with(args, "diverged", "last good checkpoint")
    checkpoints = sorted((tmp_path / "run").glob("step-*"))
    assert len(checkpoints) == 1 and str(checkpoints[0]) in result.stderr
    # The kept checkpoint is whole and holds no NaN or Inf: it was written before divergence.
    import torch
    from safetensors.torch import load_file
    for name, tensor in load_file(checkpoints[0] / "model.safetensors").items():
        assert torch.isfinite(tensor).all(), name
    run([binary("layup"), "sample", "--checkpoint", checkpoints[0], "--tokens", "2"])


def test_init_from_refuses_what_it_cannot_start_from(tmp_path, shards):
    """`--init-from` needs a model folder, takes the model's shape from it, and is not a resume."""
    init = [binary("layup"), "train", *TINY_TRAINING, "--steps", "2", "--data", shards]
    fails_with(init + ["--init-from", tmp_path / "nowhere", "--out", tmp_path / "run"],
               "cannot load a model from", "it is not a directory")
    fails_with(init + ["--init-from", tmp_path, "--layers", "2", "--out", tmp_path / "run"],
               "--init-from takes the model from", "drop --model, --layers")
    fails_with(init + ["--init-from", tmp_path, "--resume", tmp_path, "--out", tmp_path / "run"],
               "give one of them")
    assert not (tmp_path / "run").exists(), "a failed start must not leave a run folder"
