"""Bad files and numbers given to layup (damaged checkpoints, text that cannot be tokenized, data
folders missing a split, sampling flags out of range) end in one clear error, exit status 1,
before any work, and change no file."""
import json
import math
import random
import shutil
import struct

import pytest

from oracle_util import TINY_RUN, TINY_TRAINING, binary, run, tiny_shards, tiny_trained_run
from test_bad_inputs import fails_with, snapshot


def refused(args, *phrases):
    """fails_with, and exit status 1 with one line of stderr that says it all."""
    result = fails_with(args, *phrases)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.lower().splitlines()
    assert any(all(p.lower() in line for p in phrases) for line in lines), result.stderr
    return result


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shards):
    return tiny_trained_run(tmp_path_factory.mktemp("trained") / "run", shards)


def safetensors_layout(path):
    """(header, offset of the data section) of a safetensors file."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + length]), 8 + length


def overwrite_data(path, make_bytes):
    """Replaces every byte of the data section of `path` with make_bytes(count)."""
    data = path.read_bytes()
    _, start = safetensors_layout(path)
    path.write_bytes(data[:start] + make_bytes(len(data) - start))


def set_float(path, tensor, index, value):
    header, start = safetensors_layout(path)
    begin = start + header[tensor]["data_offsets"][0] + 4 * index
    data = bytearray(path.read_bytes())
    data[begin:begin + 4] = struct.pack("<f", value)
    path.write_bytes(bytes(data))


def sample(checkpoint, *flags):
    return [binary("layup"), "sample", "--checkpoint", checkpoint, *flags]


def resume(run_dir, shards):
    return [binary("layup"), "train", "--resume", run_dir, *TINY_TRAINING, "--steps", "3",
            "--data", shards]


# Checkpoints.

@pytest.mark.parametrize("weights, phrases", [
    (lambda count: struct.pack("<f", math.nan) * (count // 4), ["holds nan at element 0"]),
    (lambda count: random.Random(0).randbytes(count), []),
], ids=["all-nan", "random-bytes"])
def test_sample_refuses_non_finite_weights(tmp_path, trained, weights, phrases):
    checkpoint = tmp_path / "step-00000002"
    shutil.copytree(trained / "step-00000002", checkpoint)
    overwrite_data(checkpoint / "model.safetensors", weights)
    before = snapshot(checkpoint)
    result = refused(sample(checkpoint, "--tokens", "5"), str(checkpoint / "model.safetensors"),
                     ": tensor 'transformer.", "weights are never nan or infinite", *phrases)
    assert result.stdout == ""  # no text sampled from a broken model
    assert snapshot(checkpoint) == before


@pytest.mark.parametrize("tensor, value, shown", [
    ("adamw.m", math.inf, "inf"),
    ("adamw.v", math.nan, "nan"),
    ("adamw.v", -0.5, "-0.5"),
])
def test_resume_refuses_moments_adamw_cannot_produce(tmp_path, trained, shards, tensor, value,
                                                     shown):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    state = run_dir / "step-00000002" / "training_state.safetensors"
    set_float(state, tensor, 5, value)
    before = snapshot(run_dir)
    refused(resume(run_dir, shards), f"{state}: tensor '{tensor}' holds {shown} at index 5 (wte",
            "resume from an earlier checkpoint")
    assert snapshot(run_dir) == before


def test_resume_refuses_a_state_of_another_step(tmp_path, trained, shards):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / "step-00000002").rename(run_dir / "step-00000005")
    before = snapshot(run_dir)
    refused(resume(run_dir, shards), "training_state.safetensors says step 2",
            "folder step-00000005 is named for step 5")
    assert snapshot(run_dir) == before


# `layup tokenize`.

def tokenize(out, *files, flags=()):
    return [binary("layup"), "tokenize", "--out", out, *flags, *files]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("It is a truth universally acknowledged. " * 50)
    return path


@pytest.mark.parametrize("name, contents, phrase", [
    ("missing.txt", None, "it does not exist"),
    ("folder", "<dir>", "it is a directory"),
    ("empty.txt", b"", "it has no text (it is empty)"),
    ("blank.txt", b"  \n\n\t\n", "it has no text (6 bytes of whitespace)"),
])
def test_tokenize_refuses_input_without_text(tmp_path, text, name, contents, phrase):
    bad = tmp_path / name
    if contents == "<dir>":
        bad.mkdir()
    elif contents is not None:
        bad.write_bytes(contents)
    before = snapshot(tmp_path)
    refused(tokenize(tmp_path / "out", text, bad), f"cannot tokenize {bad}: {phrase}")
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fraction", ["0", "1", "-0.1", "1.5", "nan"])
def test_tokenize_refuses_val_fraction_outside_zero_one(tmp_path, text, fraction):
    refused(tokenize(tmp_path / "out", text, flags=["--val-fraction", fraction]),
            "--val-fraction must be (0, 1)")
    assert not (tmp_path / "out").exists()


def test_tokenize_refuses_text_too_short_for_a_validation_token(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Hello world.")
    refused(tokenize(tmp_path / "out", short), "no validation tokens",
            "the longest has 4 tokens; one needs at least 20", "larger --val-fraction")
    assert not (tmp_path / "out").exists()


def test_tokenize_refuses_an_out_that_is_a_file_or_cannot_be_made(tmp_path, text):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    before = snapshot(tmp_path)
    refused(tokenize(taken, text), f"the output folder (--out) {taken} is an existing file")
    refused(tokenize(taken / "shards", text), f"cannot create the output folder (--out) {taken}")
    assert snapshot(tmp_path) == before


def test_tokenize_warns_about_binary_files_and_tokenizes_them(tmp_path, text):
    binary_file = tmp_path / "image.png"
    binary_file.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    result = run(tokenize(tmp_path / "out", text, binary_file))
    assert f"warning: {binary_file} looks binary (a NUL byte at offset 8)" in result.stderr
    assert str(text) not in result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train_000000.bin",
                                                                     "val_000000.bin"]


# `layup train --data`.

def train(data, out):
    return [binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", data, "--out", out]


def test_data_must_be_a_folder_with_both_splits(tmp_path, shards):
    tokenize_hint = "layup tokenize --out DIR FILES..."
    refused(train(shards / "train_000000.bin", tmp_path / "run"),
            f"--data {shards / 'train_000000.bin'} is a file, not a folder", tokenize_hint)
    only_train = tmp_path / "only_train"
    only_train.mkdir()
    shutil.copy(shards / "train_000000.bin", only_train)
    refused(train(only_train, tmp_path / "run"), str(only_train), "val", "found train_000000.bin",
            tokenize_hint)
    assert not (tmp_path / "run").exists()


# `layup sample` flags.

@pytest.mark.parametrize("flags, phrase", [
    (["--tokens", "0"], "--tokens must be an integer ≥ 1 (got '0')"),
    (["--tokens", "-3"], "--tokens must be an integer ≥ 1 (got '-3')"),
    (["--temperature", "0"], "--temperature must be a finite number > 0 (got '0')"),
    (["--temperature", "-1"], "--temperature must be a finite number > 0 (got '-1')"),
    (["--temperature", "inf"], "--temperature must be a finite number > 0 (got 'inf')"),
    (["--temperature", "nan"], "--temperature must be a finite number > 0 (got 'nan')"),
    (["--top-k", "-1"], "--top-k must be an integer ≥ 0 (got '-1')"),
    (["--seed", "-1"], "--seed must be 0 .. 2^64-1 (got '-1')"),
    (["--seed", "18446744073709551616"], "--seed must be 0 .. 2^64-1 (got '18446744073709551616'"),
    (["--tokens", "many"], "--tokens"),
])
def test_sample_flags_out_of_range(trained, flags, phrase):
    result = refused(sample(trained, *flags), phrase)
    assert result.stdout == ""
