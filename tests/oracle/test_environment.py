"""The LAYUP_* environment variables at the command line: a bad value stops every command before
it does anything, naming the variable and what it takes; --help needs none. What each variable
does is tested where it acts (the host-memory check, the AdamW loops, the shipped data)."""
import os

import pytest

from oracle_util import binary, run


def layup(*args, **variables):
    return run([binary("layup"), *args], check=False, env=dict(os.environ, **variables))


@pytest.mark.parametrize("variable, value, says", [
    ("LAYUP_ADAMW_ISA", "sse9", "LAYUP_ADAMW_ISA 'sse9' names no AdamW loop: use scalar, avx2"),
    ("LAYUP_ADAMW_STREAM", "yes", "LAYUP_ADAMW_STREAM 'yes' is neither 0 nor 1"),
    ("LAYUP_SYSTEM_ROOT", "/nonexistent/root", "LAYUP_SYSTEM_ROOT '/nonexistent/root' is not a"),
])
def test_a_bad_value_is_refused_before_the_command_runs(tmp_path, variable, value, says):
    text = tmp_path / "text.txt"
    text.write_text("A few words to tokenize.\n" * 20)
    result = layup("tokenize", "--out", str(tmp_path / "shards"), str(text), **{variable: value})
    assert result.returncode == 1
    assert f"layup: error: {says}" in result.stderr
    assert not (tmp_path / "shards").exists()


def test_help_reads_no_environment():
    result = layup("--help", LAYUP_ADAMW_STREAM="yes")
    assert result.returncode == 0, result.stderr


def test_good_values_let_the_command_run(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("A few words to tokenize.\n" * 20)
    result = layup("tokenize", "--out", str(tmp_path / "shards"), str(text),
                   LAYUP_ADAMW_ISA="scalar", LAYUP_ADAMW_STREAM="0", LAYUP_SYSTEM_ROOT="/")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "shards").glob("train_*.bin"))
