"""Token data that would change meaning is refused or kept apart (through the CLI): the shipped
corpus's cache is keyed by the tokenizer, `tokenize` does not mix old and new shards, and ids
beyond the model's vocabulary stop a run before its first step."""
import json
import math
import shutil
import struct

import numpy as np
import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from oracle_util import DATA_DIR, TINY_RUN, TINY_TRAINING, binary, run, tiny_shards
from test_bad_inputs import fails_with, snapshot

CORPUS_CHARACTERS = 20_000


def gpt2_byte_alphabet():
    """byte -> the character GPT-2's byte-level BPE spells it with (tokenizer.json's vocab)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelling, unprintable = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + unprintable)
            unprintable += 1
    return spelling


def byte_tokenizer(folder):
    """A tokenizer.json without merges whose ids are the bytes, and <|endoftext|> 256: ids that
    GPT-2's tokenizer would never give the same text."""
    folder.mkdir(parents=True, exist_ok=True)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {s: b for b, s in gpt2_byte_alphabet().items()}, "merges": []}}))
    return folder


def tiny_model(folder, vocab_size, tokenizer=False):
    """A random 1-layer GPT-2 folder (config.json, model.safetensors) of `vocab_size` tokens, with
    the byte tokenizer beside it if asked (as a model from the Hub carries its own)."""
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=vocab_size,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    if tokenizer:
        byte_tokenizer(folder)
    return folder


def shard_ids(path):
    data = path.read_bytes()
    magic, _, count = struct.unpack("<3i", data[:12])
    return np.frombuffer(data[1024:], dtype="<u2" if magic == 20240520 else "<u4")[:count]


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A data folder of the shipped tokenizer and the start of both texts, and a cache folder, both
    the test's own; returns the data folder."""
    data = tmp_path / "data"
    (data / "corpus").mkdir(parents=True)
    for name in ("austen.txt", "kjv.txt"):
        (data / "corpus" / name).write_bytes(
            (DATA_DIR / "corpus" / name).read_bytes()[:CORPUS_CHARACTERS])
    shutil.copytree(DATA_DIR / "gpt2-tokenizer", data / "gpt2-tokenizer")
    monkeypatch.setenv("LAYUP_DATA_DIR", str(data))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return data


def test_the_corpus_cache_is_keyed_by_the_tokenizer(tmp_path, shipped):
    """`layup train`, then `--init-from` a model with its own tokenizer, then `layup train` again:
    each tokenizer's ids, each from a cache of its own, and the first cache reused untouched."""
    model = tiny_model(tmp_path / "model", vocab_size=300, tokenizer=True)
    cache = tmp_path / "cache" / "layup" / "shards"
    gpt2 = run([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--out", tmp_path / "a"])
    [gpt2_cache] = list(cache.iterdir())
    assert (f"data: tokenizing the shipped corpus (2 files) with {shipped / 'gpt2-tokenizer'} "
            f"into {gpt2_cache}") in gpt2.stderr
    gpt2_ids = shard_ids(gpt2_cache / "train_000000.bin")
    assert gpt2_ids[0] == 50256 and gpt2_ids.max() >= 300

    byte_run = run([binary("layup"), "train", "--init-from", model, *TINY_TRAINING, "--steps", "2",
                    "--out", tmp_path / "b"])
    [byte_cache] = [path for path in cache.iterdir() if path != gpt2_cache]
    assert f"with {model} into {byte_cache}" in byte_run.stderr
    train, val = [], []
    for name in ("austen.txt", "kjv.txt"):
        ids = [256, *(shipped / "corpus" / name).read_bytes()]
        val_count = math.floor(len(ids) * 0.05)
        train += ids[:len(ids) - val_count]
        val += ids[len(ids) - val_count:]
    assert shard_ids(byte_cache / "train_000000.bin").tolist() == train
    assert shard_ids(byte_cache / "val_000000.bin").tolist() == val

    before = snapshot(gpt2_cache)
    again = run([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--out", tmp_path / "c"])
    assert f"tokenizes it, cached in {gpt2_cache}" in again.stderr
    assert snapshot(gpt2_cache) == before
    assert len(list(cache.iterdir())) == 2


def texts(folder, *contents):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate(contents):
        (folder / f"doc{i}.txt").write_text(text)
        paths.append(folder / f"doc{i}.txt")
    return paths


def test_tokenize_refuses_older_shards_and_overwrite_replaces_them(tmp_path):
    tokenize = [binary("layup"), "tokenize", "--out", tmp_path / "shards"]
    old = texts(tmp_path / "old", "An older text. " * 200, "Another one. " * 200)
    new = texts(tmp_path / "new", "A newer text, of other words. " * 150)
    run(tokenize + old)
    shutil.copy(tmp_path / "shards" / "train_000000.bin", tmp_path / "shards" / "train_000001.bin")
    (tmp_path / "shards" / "notes.txt").write_text("kept")
    before = snapshot(tmp_path / "shards")

    fails_with(tokenize + new, f"(--out) {tmp_path / 'shards'} already holds 3 shards",
               "train_000000.bin, train_000001.bin, val_000000.bin", "add --overwrite")
    assert snapshot(tmp_path / "shards") == before
    # A tokenize that fails after writing (too little text for one validation token) removes none.
    fails_with(tokenize + ["--overwrite", *texts(tmp_path / "short", "Hi.")], "no validation tokens")
    assert snapshot(tmp_path / "shards") == before

    replaced = run(tokenize + ["--overwrite", *new])
    assert "replaced the 3 older *.bin files" in replaced.stdout
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        "notes.txt", "train_000000.bin", "val_000000.bin"]
    run([binary("layup"), "tokenize", "--out", tmp_path / "fresh", *new])
    for name in ("train_000000.bin", "val_000000.bin"):
        assert (tmp_path / "shards" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"), characters=20_000)


def test_val_shard_out_of_vocabulary_is_refused(tmp_path, shards):
    data = tmp_path / "data"
    shutil.copytree(shards, data)
    val = data / "val_000000.bin"
    val.write_bytes(val.read_bytes()[:1024 + 6] + struct.pack("<H", 50300) + val.read_bytes()[1024 + 8:])
    before = snapshot(data)
    fails_with([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", data, "--out",
                tmp_path / "run"],
               f"token shard {val} has token id 50300 at position 3, outside the vocabulary of "
               "50257 tokens")
    assert snapshot(data) == before
    assert not (tmp_path / "run").exists()


def test_init_from_a_smaller_vocabulary_refuses_the_shards(tmp_path, shards):
    """GPT-2's ids in the shards, a model of 1000 tokens: the first id beyond it, by shard and
    position, before any step (no run folder)."""
    model = tiny_model(tmp_path / "model", vocab_size=1000)
    train = shards / "train_000000.bin"
    ids = shard_ids(train)
    position = int(np.argmax(ids >= 1000))
    fails_with([binary("layup"), "train", "--init-from", model, *TINY_TRAINING, "--steps", "2",
                "--data", shards, "--out", tmp_path / "run"],
               f"token shard {train} has token id {ids[position]} at position {position}, outside "
               "the vocabulary of 1000 tokens", "layup tokenize --tokenizer")
    assert not (tmp_path / "run").exists()
