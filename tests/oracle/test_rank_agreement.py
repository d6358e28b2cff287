"""Ranks started with other flags are refused before their first collective (docs/parallel.md):
`mpirun -np 1 layup train A : -np 1 layup train B` names the first differing flag of rank 1 and
rank 0 on one line, ends every rank (no hang: each case has 30 s) and leaves no run folder.
Skipped where mpirun or an MPI build is missing."""
import subprocess

import pytest

from oracle_util import TINY_MODEL, binary, tiny_shards
from test_data_parallel import MPI_ENV, mpi_missing

pytestmark = pytest.mark.skipif(mpi_missing() is not None, reason=str(mpi_missing()))

TRAIN = ["train", "--seq-len", "32", "--batch", "2", "--grad-accum", "2", "--eval-every", "0",
         "--sample-tokens", "0", "--device", "cpu", "--threads", "1", "--mode", "gpu"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


def two_ranks(rank0, rank1):
    """Rank 0 given `rank0`, rank 1 `rank1` (Open MPI's MPMD form); fails the test on a hang."""
    command = ["mpirun", "--oversubscribe", "-np", "1", binary("layup"), *rank0, ":", "-np", "1",
               binary("layup"), *rank1]
    try:
        return subprocess.run([str(a) for a in command], capture_output=True, text=True,
                              env=MPI_ENV, timeout=30)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the ranks hung (30 s):\n{expired.stderr}")


def refused(result, message):
    assert result.returncode != 0, result.stderr
#layup 's own line, not MPI' s text alone.
    assert f"layup: error: {message}" in result.stderr, result.stderr


@pytest.mark.parametrize("flag, rank0, rank1", [
    ("--steps", "4", "2"),    # a different count of steps: the ranks hung in the last collective
    ("--layers", "2", "3"),   # another shape: MPI_ERR_TRUNCATE in MPI_Allgatherv
    ("--mode", "gpu", "layup"),  # other collectives: the heap was corrupted
    ("--seed", "1337", "7"),  # other weights: trained to the end, each rank its own model
])
def test_ranks_given_different_flags_are_refused_by_name(tmp_path, shards, flag, rank0, rank1):
    common = [*TRAIN, *TINY_MODEL, "--steps", "4", "--data", shards, "--out", tmp_path / "run"]
    result = two_ranks([*common, flag, rank0], [*common, flag, rank1])
    refused(result, f"rank 1 was given {flag} {rank1} but rank 0 {flag} {rank0}: every rank of "
                    "an mpirun must get the same flags")
    assert not (tmp_path / "run").exists()


def test_a_float_flag_is_named_as_given(tmp_path, shards):
    common = [*TRAIN, *TINY_MODEL, "--steps", "2", "--data", shards, "--out", tmp_path / "run"]
    refused(two_ranks([*common, "--lr", "3e-3"], [*common, "--lr", "0.001"]),
            "rank 1 was given --lr 0.001 but rank 0 --lr 0.003")


def test_ranks_reading_other_data_are_refused(tmp_path, shards):
    other = tiny_shards(tmp_path / "other", characters=30_000)
    common = [*TRAIN, *TINY_MODEL, "--steps", "2", "--out", tmp_path / "run"]
    refused(two_ranks([*common, "--data", shards], [*common, "--data", other]),
            f"rank 1 was given --data {other} but rank 0 --data {shards}")


def test_bench_ranks_given_different_flags_are_refused(tmp_path):
    bench = ["bench", *TINY_MODEL, "--seq-len", "32", "--batch", "2", "--grad-accum", "2",
             "--device", "cpu", "--mode", "gpu", "--threads", "1", "--warmup", "1"]
    refused(two_ranks([*bench, "--steps", "3"], [*bench, "--steps", "2"]),
            "rank 1 was given --steps 2 but rank 0 --steps 3")
