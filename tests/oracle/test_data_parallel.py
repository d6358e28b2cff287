"""Data parallel on the CPU backend (docs/parallel.md): `mpirun -np 2 layup train` trains bit for
bit like one process with the same global batch (each rank one of the step's two micro-batches)
in every mode, to fp32 rounding with two micro-batches a rank (another order of additions), and a
checkpoint resumes with another rank count. Skipped where mpirun or an MPI build is missing."""
import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from oracle_util import TINY_MODEL, binary, read_log, run, tiny_shards

# One OpenMP thread a process: the CPU backend's sums are bitwise for a fixed thread count, and
# mpirun binds each rank to a core.
COMMON = [*TINY_MODEL, "--seq-len", "32", "--batch", "2", "--eval-every", "0", "--sample-tokens",
          "0", "--warmup", "2", "--lr", "1e-3", "--min-lr", "1e-4", "--device", "cpu", "--threads",
          "1", "--log-every", "1"]
# Every mode, and each way layup updates a block: as its gradient arrives (no clipping),
# speculatively before the norm is known, or after it (deferred). Clipping at 1 is active.
MODES = {
    "gpu": ["--mode", "gpu"],
    "offload": ["--mode", "offload"],
    "layup-speculative": ["--mode", "layup", "--layup-clip", "speculative"],
    "layup-deferred": ["--mode", "layup", "--layup-clip", "deferred"],
    "layup-no-clip": ["--mode", "layup", "--clip", "none"],
    # Each rank sums its micro-batches block by block, then the ranks' sums (docs/parallel.md).
    "layup-layer-major": ["--mode", "layup", "--layup-clip", "deferred", "--accumulate",
                          "layer-major"],
    # A block's weights streamed through a ring, filled from each rank's host copy.
    "layup-streamed": ["--mode", "layup", "--layup-clip", "deferred", "--streamed-blocks", "1"],
}
# Open MPI refuses root without these (CI runs as root); --oversubscribe: CI has two cores.
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpi_missing():
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (Debian: openmpi-bin)"
    if "without MPI" in run([binary("layup"), "--version"]).stdout:
        return "this layup was built without MPI (Debian: libopenmpi-dev, then rebuild)"
    return None


pytestmark = pytest.mark.skipif(mpi_missing() is not None, reason=str(mpi_missing()))


def ranks(n, args, check=True):
    return run(["mpirun", "--oversubscribe", "-np", str(n), binary("layup"), *args], check=check,
               env=MPI_ENV)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


def files(step_dir):
    return {name: (step_dir / name).read_bytes()
            for name in ("model.safetensors", "training_state.safetensors")}


def losses(run_dir):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in read_log(run_dir) if "loss" in r]


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_train_bitwise_like_one_process(tmp_path, shards, mode):
    args = ["train", *COMMON, *MODES[mode], "--steps", "4", "--grad-accum", "2", "--data", shards]
    run([binary("layup"), *args, "--out", tmp_path / "one"])
    result = ranks(2, [*args, "--out", tmp_path / "two"])
    assert "2 ranks (mpirun), 1 micro-batches of each step on each" in result.stderr
    # ZeRO-1 in every mode: each rank keeps and updates its part of the moments.
    assert "this rank's shard of 2 (ZeRO-1)" in result.stderr, result.stderr
    # Rank 0 alone prints and writes: one progress line per step, one summary, one run folder.
    assert result.stderr.count("step 4/4") == 1, result.stderr
    assert result.stdout.count("trained to step 4") == 1, result.stdout
    assert losses(tmp_path / "one") == losses(tmp_path / "two")
    if "none" not in MODES[mode]:
        assert any(norm > 1.0 for _, _, norm in losses(tmp_path / "one")), "no clipping exercised"
    assert files(tmp_path / "one" / "step-00000004") == files(tmp_path / "two" / "step-00000004")


def moments_bytes(stderr):
    """The plan's bytes of AdamW m on this rank (the line `layup train` prints)."""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for line in stderr.splitlines():
        if "AdamW m" in line and "optimizer moments" in line:
            words = line.split()
            at = words.index("moments") + 2  # class, kind, then the size and its unit
            return float(words[at]) * units[words[at + 1]]
    raise AssertionError("no AdamW m line in the plan:\n" + stderr)


@pytest.mark.parametrize("mode", ["gpu", "layup-deferred"])
def test_three_ranks_split_the_moments_and_train_bitwise(tmp_path, shards, mode):
    """ZeRO-1: each of three ranks keeps a third of the moments (the shards cut the embeddings'
    span; layup's CPU workers update their rank's part), and the run's losses and checkpoint are
    still those of one process."""
    args = ["train", *COMMON, *MODES[mode], "--steps", "3", "--grad-accum", "3", "--data", shards]
    one = run([binary("layup"), *args, "--out", tmp_path / "one"])
    three = ranks(3, [*args, "--out", tmp_path / "three"])
    assert "this rank's shard of 3 (ZeRO-1)" in three.stderr, three.stderr
    assert moments_bytes(three.stderr) < 0.4 * moments_bytes(one.stderr)
    # `layup memory --ranks 3` plans one such rank (the largest shard) without starting any.
    plan = run([binary("layup"), "memory", *TINY_MODEL, "--seq-len", "32", "--batch", "2",
                "--grad-accum", "3", "--device", "cpu", "--mode", MODES[mode][1], "--ranks", "3"])
    assert "this rank's shard of 3 (ZeRO-1)" in plan.stdout, plan.stdout
    assert moments_bytes(plan.stdout) < 0.4 * moments_bytes(one.stderr)
    assert losses(tmp_path / "one") == losses(tmp_path / "three")
    assert files(tmp_path / "one" / "step-00000003") == files(tmp_path / "three" / "step-00000003")


def measured_host_state(record):
    """The bytes of master weights and moments the accountant measured on the host side."""
    cells = record["memory"]["measured"]["cells"]
    return {c["class"]: c["peak_bytes"] for c in cells
            if c["side"] == "host" and c["class"] in ("master", "moments")}


def test_each_rank_measures_a_third_of_the_moments_on_three_ranks(tmp_path):
    """ZeRO-1 measured, not only planned: rank 0's accountant (what its allocations took) holds
    a third of the host's moments under three ranks, and all of the master weights (every rank
    gathers the updated weights)."""
    args = ["bench", *TINY_MODEL, "--seq-len", "32", "--batch", "2", "--grad-accum", "3",
            "--device", "cpu", "--mode", "layup", "--layup-clip", "deferred", "--threads", "1",
            "--warmup", "1", "--steps", "1"]
    run([binary("layup"), *args, "--json", tmp_path / "one.json"])
    ranks(3, [*args, "--json", tmp_path / "three.json"])
    one = measured_host_state(json.loads((tmp_path / "one.json").read_text()))
    three = measured_host_state(json.loads((tmp_path / "three.json").read_text()))
    assert 0 < three["moments"] < 0.4 * one["moments"], (one, three)
    assert three["master"] == one["master"], (one, three)


def test_bench_under_two_ranks_reports_once_for_the_global_batch(tmp_path):
    args = ["bench", *TINY_MODEL, "--seq-len", "32", "--batch", "2", "--grad-accum", "2",
            "--device", "cpu", "--mode", "gpu", "--threads", "1", "--warmup", "1", "--steps", "2",
            "--json", tmp_path / "bench.json"]
    result = ranks(2, args)
    lines = result.stdout.splitlines()
    assert sum(line.split()[:1] == ["tokens/s"] for line in lines) == 1, result.stdout
    assert "2 (mpirun)" in result.stdout
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["ranks"] == 2
    assert record["tokens_per_step"] == 2 * 2 * 32  # the global batch: both ranks' micro-batches


@pytest.mark.parametrize("mode", ["gpu", "layup-deferred", "layup-layer-major"])
def test_two_micro_batches_a_rank_agree_to_rounding(tmp_path, shards, mode):
    """Four micro-batches: one process adds them in turn, two ranks add pairs then the pairs, so
    the gradients differ in the last bits; the trajectories agree to fp32 rounding."""
    args = ["train", *COMMON, *MODES[mode], "--steps", "4", "--grad-accum", "4", "--data", shards]
    run([binary("layup"), *args, "--out", tmp_path / "one"])
    ranks(2, [*args, "--out", tmp_path / "two"])
    for (step, loss_one, _), (_, loss_two, _) in zip(losses(tmp_path / "one"),
                                                      losses(tmp_path / "two")):
        assert loss_two == pytest.approx(loss_one, rel=1e-5), f"step {step}"
    one = load_file(str(tmp_path / "one" / "step-00000004" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "step-00000004" / "model.safetensors"))
    for name, expected in one.items():
        error = np.linalg.norm(two[name] - expected) / max(np.linalg.norm(expected), 1e-30)
        assert error < 1e-4, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("first, then, mode", [(2, 1, "gpu"), (1, 2, "gpu"), (2, 1, "layup-deferred"),
                                              (1, 2, "offload")])
def test_a_checkpoint_resumes_with_another_rank_count(tmp_path, shards, first, then, mode):
    args = ["train", *COMMON, *MODES[mode], "--steps", "4", "--grad-accum", "2", "--data", shards]
    run([binary("layup"), *args, "--out", tmp_path / "straight"])
    split = [*args, "--until-step", "2", "--out", tmp_path / "split"]
    resume = ["train", "--resume", tmp_path / "split", "--threads", "1", "--data", shards]
    for count, command in ((first, split), (then, resume)):
        if count > 1:  # the sharded side: rank 0 writes every rank's part, each imports its own
            assert "this rank's shard of 2 (ZeRO-1)" in ranks(count, command).stderr
        else:
            run([binary("layup"), *command])
    assert files(tmp_path / "straight" / "step-00000004") == \
        files(tmp_path / "split" / "step-00000004")


# Every block's state on disk (the tiny model has two), each rank's file in the one --offload-dir.
def on_disk(offload):
    return ["--mode", "layup", "--layup-clip", "deferred", "--optimizer-placement", "disk:2",
            "--offload-dir", offload]


def test_two_ranks_with_blocks_on_disk_train_and_resume_bitwise(tmp_path, shards):
    """ZeRO-1 with the blocks' state on disk: each rank keeps a file of its own (the blocks' whole
    master weights, its part of their moments) in the directory both were given; two ranks train
    bit for bit like one process, and a checkpoint (rank 0 asks rank 1 for its part of the disk
    blocks' moments) resumes 2 -> 1 and 1 -> 2 bit for bit."""
    offload = tmp_path / "offload"
    offload.mkdir()
    args = ["train", *COMMON, *on_disk(offload), "--steps", "4", "--grad-accum", "2", "--data",
            shards]
    run([binary("layup"), *args, "--out", tmp_path / "one"])
    two = ranks(2, [*args, "--out", tmp_path / "two"])
    assert "this rank's part of their moments" in two.stderr, two.stderr
    assert "layup-optimizer-state-rank0-" in two.stderr, two.stderr
    # `layup memory --ranks 2` plans the largest rank's file. The embeddings are most of the tiny
    # model, so rank 1 owns the blocks' moments whole and rank 0 none of them (its file holds the
    # weights only); the C++ suite cuts blocks between ranks (MemoryPlan, RanksEquivalence).
    plan = ["memory", *TINY_MODEL, "--seq-len", "32", "--batch", "2", "--grad-accum", "2",
            "--device", "cpu", *on_disk(offload)]
    alone = disk_row(run([binary("layup"), *plan]).stdout)
    per_rank = run([binary("layup"), *plan, "--ranks", "2"]).stdout
    assert disk_row(per_rank) == alone
    assert "each rank a file of its own" in per_rank, per_rank
    assert losses(tmp_path / "one") == losses(tmp_path / "two")
    assert files(tmp_path / "one" / "step-00000004") == files(tmp_path / "two" / "step-00000004")
    assert list(offload.iterdir()) == [], "the disk tier's files are unlinked"
    for first, then in ((2, 1), (1, 2)):
        folder = tmp_path / f"split-{first}-{then}"
        split = [*args, "--until-step", "2", "--out", folder]
        resume = ["train", "--resume", folder, "--threads", "1", "--data", shards,
                  *on_disk(offload)[-4:]]  # the placement is not a setting a checkpoint keeps
        for count, command in ((first, split), (then, resume)):
            if count > 1:
                ranks(count, command)
            else:
                run([binary("layup"), *command])
        assert files(tmp_path / "one" / "step-00000004") == files(folder / "step-00000004"), \
            f"{first} -> {then}"


def disk_row(stdout):
    """The bytes `layup memory` plans on disk (its `on disk (--offload-dir)` row)."""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for line in stdout.splitlines():
        if line.strip().startswith("on disk (--offload-dir)"):
            words = line.split()
            return float(words[-2]) * units[words[-1]]
    raise AssertionError("no on-disk row in the plan:\n" + stdout)


def test_blocks_on_disk_split_over_three_ranks_train_like_one_process():
    """The C++ suite's disk case as three ranks: the shards of the tiny models leave some rank no
    part of a disk block's moments (src/schedule/schedules_equivalence_test.cpp)."""
    result = run(["mpirun", "--oversubscribe", "-np", "3", binary("layup_tests"),
                  "--gtest_filter=RanksEquivalence.BlocksOnDiskTrainLikeOneProcess",
                  "--gtest_color=no"], env=MPI_ENV)
    assert result.stdout.count("[  PASSED  ] 1 test.") == 3, result.stdout
    assert "SKIPPED" not in result.stdout, result.stdout


@pytest.mark.parametrize("extra, words", [
    (["--grad-accum", "3"], "do not split evenly over 2 ranks"),
])
def test_what_several_ranks_cannot_do_is_refused(tmp_path, shards, extra, words):
    args = ["train", *COMMON, "--steps", "2", "--data", shards, *extra,
            "--out", tmp_path / "run"]
    result = ranks(2, args, check=False)
    assert result.returncode != 0
    assert words in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_spans_updated_on_the_device_side_are_summed_over_the_ranks():
    """layup's device-updated spans (the head, blocks placed `device:K`) keep their gradient where
    they are updated; on the CPU backend the command line cannot place them there (the device
    computes with the master weights in place), so the C++ suite builds such schedules and runs as
    two ranks: every mode and placement bitwise like one process
    (src/schedule/schedules_equivalence_test.cpp)."""
    result = run(["mpirun", "--oversubscribe", "-np", "2", binary("layup_tests"),
                  "--gtest_filter=RanksEquivalence.*", "--gtest_color=no"], env=MPI_ENV)
    # Each rank passes every test of the suite (its blocks on disk among them).
    assert result.stdout.count("[  PASSED  ]") == 2, result.stdout
    assert "FAILED" not in result.stdout, result.stdout
    assert "SKIPPED" not in result.stdout, result.stdout


def test_each_device_updated_blocks_sum_over_the_ranks_overlaps_the_backward_below():
    """Each device-updated span's gradient is summed over the ranks as its backward ends, on the
    plan's ranks lane, while the device computes the blocks below (docs/schedules.md): the C++
    suite traces it as two ranks, the sums in the lane's order and each block's beside the next
    block's backward (src/schedule/ranks_overlap_test.cpp)."""
    result = run(["mpirun", "--oversubscribe", "-np", "2", binary("layup_tests"),
                  "--gtest_filter=RanksTrace.*", "--gtest_color=no"], env=MPI_ENV)
    assert result.stdout.count("[  PASSED  ] 1 test.") == 2, result.stdout
    assert "SKIPPED" not in result.stdout, result.stdout


def test_ranks_started_from_a_hostfile_train_like_one_process(tmp_path, shards):
    """The several-hosts path (docs/parallel.md) with one host: Open MPI places the ranks by the
    hostfile's slots instead of --oversubscribe."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    args = ["train", *COMMON, *MODES["layup-deferred"], "--steps", "3", "--grad-accum", "2",
            "--data", shards]
    run([binary("layup"), *args, "--out", tmp_path / "one"])
    run(["mpirun", "--hostfile", hostfile, "-np", "2", binary("layup"), *args,
         "--out", tmp_path / "two"], env=MPI_ENV)
    assert losses(tmp_path / "one") == losses(tmp_path / "two")
    assert files(tmp_path / "one" / "step-00000003") == files(tmp_path / "two" / "step-00000003")
