"""`cmake --install` makes a tree that can move as a whole: PREFIX/bin/layup finds its tokenizer in
PREFIX/share/layup before the source tree's data/, and LAYUP_DATA_DIR overrides both. The tokenizer
a run used is read off the ids it wrote: the installed copy is swapped for a byte-level one, whose
document separator (256) GPT-2's (50256) is not."""
import os
import shutil
import struct
import subprocess

import numpy as np

from paths import BUILD_DIR, DATA_DIR
from test_token_inputs import byte_tokenizer

GPT2_SEPARATOR = 50256
BYTES_SEPARATOR = 256


def run(args, **variables):
    """Runs a command without the LAYUP_DATA_DIR ctest sets, unless given."""
    env = {k: v for k, v in os.environ.items() if k != "LAYUP_DATA_DIR"}
    env.update(variables)
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def first_token(layup, tmp_path, name, **variables):
    """The first id `layup tokenize` writes for a short text (the tokenizer's document separator)."""
    text = tmp_path / "text.txt"
    text.write_text("A few words to tokenize.\n" * 20)
    out = tmp_path / name
    run([layup, "tokenize", "--out", out, text], **variables)
    data = next(out.glob("*train*.bin")).read_bytes()
    magic = struct.unpack("<i", data[:4])[0]
    return int(np.frombuffer(data[1024:], dtype="<u2" if magic == 20240520 else "<u4")[0])


def test_an_installed_binary_finds_its_data_beside_itself(tmp_path):
    prefix = tmp_path / "prefix"
    run(["cmake", "--install", BUILD_DIR, "--prefix", prefix])
    share = prefix / "share" / "layup"
    for installed in ("gpt2-tokenizer/gpt2.tiktoken", "corpus/austen.txt", "corpus/kjv.txt",
                      "README.md"):
        assert (share / installed).is_file(), installed

    # Moved elsewhere as a whole, with a tokenizer of its own in place of GPT-2's.
    moved = tmp_path / "moved"
    shutil.move(prefix, moved)
    shutil.rmtree(moved / "share" / "layup" / "gpt2-tokenizer")
    byte_tokenizer(moved / "share" / "layup" / "gpt2-tokenizer")
    layup = moved / "bin" / "layup"
    assert first_token(layup, tmp_path, "installed") == BYTES_SEPARATOR
    assert first_token(layup, tmp_path, "override", LAYUP_DATA_DIR=str(DATA_DIR)) == GPT2_SEPARATOR

    # Without share/layup beside it, the source tree's data/ (where a build's binary finds it).
    shutil.rmtree(moved / "share")
    assert first_token(layup, tmp_path, "source") == GPT2_SEPARATOR
