"""Shapes too large to plan are refused quickly, naming the flag that made them so (issue 41):
a huge --batch is refused in a bounded number of plans with the --batch that fits, and a huge
--dim, --layers, --context or --seq-len is blamed on itself, not on the batch, before anything
is allocated or written."""
import subprocess

import pytest

from oracle_util import TINY_MODEL, binary, tiny_shards

# A hang shows as a timeout here, not as a stuck CI job.
TIMEOUT_S = 20
SMALL = ["--layers", "2", "--heads", "2", "--dim", "32"]


def error_line(args):
    """The one `layup: error:` line of a command that must fail with exit 1."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode == 1, \
        f"expected exit 1, got {result.returncode}:\n{result.stdout}\n{result.stderr}"
    assert "terminate called" not in result.stderr and "Sanitizer" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("layup: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def bench(*args):
    return [binary("layup"), "bench", "--device", "cpu", "--steps", "1", "--warmup", "0", *args]


def largest_batch_offered(line):
    """N in '... --batch N or less ...' or 'Within the budget: --batch N'."""
    words = line.replace(";", " ").replace(",", " ").split()
    batches = [int(words[i + 1]) for i, word in enumerate(words[:-1])
               if word == "--batch" and words[i + 1].isdigit()]
    return batches


def test_bench_batch_of_two_billion_names_the_batch_that_fits():
    line = error_line(bench(*SMALL, "--batch", "2000000000"))
    assert "--batch 2000000000 is too large" in line, line
    offered = [b for b in largest_batch_offered(line) if b != 2000000000]
    assert offered and 1 <= offered[0] < 2000000000 // 1024, line


def test_bench_batch_of_a_million_is_refused_by_the_memory_plan_with_what_fits():
    # Within the shape limits (16 million tokens): the memory check refuses it, offering a batch.
    line = error_line(bench(*TINY_MODEL, "--seq-len", "16", "--batch", "1000000"))
    assert "B=1000000" in line, line
    offered = [b for b in largest_batch_offered(line) if b != 1000000]
    assert offered and all(1 <= b < 1000000 for b in offered), line


@pytest.mark.parametrize("flag, args", [
    ("--dim", ["--layers", "2", "--heads", "2", "--dim", "2000000000"]),
    ("--layers", ["--layers", "2000000000", "--heads", "2", "--dim", "32"]),
    ("--context", ["--layers", "2", "--heads", "8", "--dim", "1048576", "--context", "2000000000",
                   "--seq-len", "64", "--batch", "1"]),
    ("--seq-len", [*SMALL, "--context", "2000000000", "--seq-len", "2000000000", "--batch", "1"]),
])
def test_bench_blames_the_flag_that_made_the_shape_too_large(flag, args):
    line = error_line(bench(*args))
    assert f"{flag} " in line and "is too large" in line, line
    assert line.split(" is too large")[0].endswith(f"{flag} " + args[args.index(flag) + 1]), line
    others = {"--dim", "--layers", "--context", "--seq-len", "--batch"} - {flag}
    assert not any(other in line for other in others), line


def test_memory_blames_dim_and_batch():
    memory = [binary("layup"), "memory", "--device", "cpu"]
    line = error_line([*memory, *SMALL[:4], "--dim", "2000000000"])
    assert "--dim 2000000000 is too large" in line and "--batch" not in line, line
    line = error_line([*memory, *SMALL, "--batch", "2000000000"])
    assert "--batch 2000000000 is too large" in line, line


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


def test_train_blames_dim_and_batch_and_makes_no_run_folder(tmp_path, shards):
    train = [binary("layup"), "train", "--device", "cpu", "--steps", "1", "--data", shards]
    out = tmp_path / "run"
    line = error_line([*train, "--out", out, *SMALL[:4], "--dim", "2000000000"])
    assert "--dim 2000000000 is too large" in line and "--batch" not in line, line
    assert not out.exists()
    line = error_line([*train, "--out", out, *TINY_MODEL, "--seq-len", "64", "--batch",
                       "2000000000"])
    assert "--batch 2000000000 is too large" in line, line
    assert not out.exists()
