"""Outputs, file-size limits, early signals and the side commands' memory, through the CLI: what
would fail after the work (a folder that cannot be written, a full disk, `ulimit -f`, a buffer
beyond the host) is refused before it, naming the flag; nothing is written or left half-made."""
import os
import re
import resource
import signal
import subprocess
import time

import pytest

from oracle_util import TINY_RUN, binary, read_log, run, tiny_shards
from test_bad_inputs import fails_with, snapshot


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


def train(data, out, *extra):
    return [binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", data, "--out", out,
            *extra]


def file_size_limit(limit_bytes):
    """preexec_fn: a soft and hard RLIMIT_FSIZE for the child, with SIGXFSZ at its default
    (which ends the process): layup itself must ignore it."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def quick_fail(args, *phrases, seconds=5.0, **kwargs):
    """fails_with, and in well under `seconds`: refused before the work, not after it."""
    start = time.monotonic()
    result = run(args, check=False, **kwargs)
    elapsed = time.monotonic() - start
    assert result.returncode == 1, f"exit {result.returncode}:\n{result.stdout}\n{result.stderr}"
    for phrase in phrases:
        assert phrase.lower() in result.stderr.lower(), f"{phrase!r} not in:\n{result.stderr}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("layup: error:")]
    assert len(errors) == 1, result.stderr
    assert elapsed < seconds, f"took {elapsed:.1f} s: refused after the work?\n{result.stderr}"
    return result


# --- file-size limits ---

def test_a_checkpoint_file_over_the_file_size_limit_is_refused_before_training(tmp_path, shards):
    """The tiny model's training state (13 MB) does not fit 10 MB; its largest tensor (the 6.4 MB
    embedding) does, so the message offers a shard size, and under the same limit that works."""
    limit = 10 * 1000 * 1000
    result = quick_fail(train(shards, tmp_path / "run"), "a checkpoint's largest file",
                        "training_state.safetensors", f"ulimit -f {limit // 1024}",
                        "`ulimit -f unlimited`", "--no-checkpoints",
                        preexec_fn=file_size_limit(limit))
    assert not (tmp_path / "run").exists()
    shard_mb = re.search(r"--checkpoint-shard-mb (\d+)", result.stderr)
    assert shard_mb, result.stderr
    run(train(shards, tmp_path / "run", "--checkpoint-shard-mb", shard_mb.group(1)),
        preexec_fn=file_size_limit(limit))
    checkpoint = tmp_path / "run" / "step-00000002"
    assert (checkpoint / "optimizer.safetensors.index.json").is_file()
    assert max(p.stat().st_size for p in checkpoint.iterdir()) <= limit
    assert not list((tmp_path / "run").glob("*.partial"))


def test_below_the_largest_tensor_only_the_limit_or_no_checkpoints_help(tmp_path, shards):
    result = quick_fail(train(shards, tmp_path / "run"), "a checkpoint's largest file",
                        "ulimit -f 256", "--no-checkpoints",
                        preexec_fn=file_size_limit(256 * 1024))
    assert "--checkpoint-shard-mb" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_write_past_the_limit_fails_with_a_message_not_sigxfsz(tmp_path, shards):
    """With no checkpoint to check, log.jsonl outgrows a 2 KiB limit: SIGXFSZ would end the
    process (exit -25) mid-line; ignored, the append fails (EFBIG) and the run says so."""
    result = run(train(shards, tmp_path / "run", "--no-checkpoints", "--steps", "40",
                       "--eval-every", "0"),
                 check=False, preexec_fn=file_size_limit(2048))
    assert result.returncode == 1, f"exit {result.returncode}:\n{result.stderr}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("layup: error:")]
    assert len(errors) == 1, result.stderr
    for phrase in ("cannot write to the log file", "File too large", "ulimit -f"):
        assert phrase in errors[0], errors[0]
    # The lines written are whole: a reader of the log never sees half a record.
    assert all(line.endswith("}") for line in
               (tmp_path / "run" / "log.jsonl").read_text().splitlines())


def test_a_json_result_over_the_limit_is_refused_before_the_benchmark(tmp_path):
    quick_fail([binary("layup"), "bench-adamw", "--params", "1000000", "--json",
                tmp_path / "out.json"], "--json", "ulimit -f 64",
               preexec_fn=file_size_limit(64 * 1024))
    assert not list(tmp_path.iterdir())


# --- outputs checked before the work ---

BENCH_TINY = [binary("layup"), "bench", "--layers", "2", "--heads", "2", "--dim", "32",
              "--context", "64", "--seq-len", "32", "--batch", "2", "--steps", "2", "--warmup",
              "1", "--device", "cpu"]


@pytest.mark.parametrize("flag", ["--json", "--trace"])
def test_bench_outputs_into_a_missing_folder_are_refused_before_timing(tmp_path, flag):
    path = tmp_path / "missing" / "out.json"
    result = quick_fail([*BENCH_TINY, flag, path], flag, "does not exist")
    assert "step_ms" not in result.stdout and "tokens" not in result.stdout  # no table printed
    assert not list(tmp_path.iterdir())


VIRTUAL_OUTPUTS = {
    "bench-adamw --json": ["bench-adamw", "--params", "1000000", "--json", "/proc/layup.json"],
    "bench --json": [*BENCH_TINY[1:], "--json", "/proc/layup.json"],
    "bench --trace": [*BENCH_TINY[1:], "--trace", "/proc/layup-trace.json"],
    "train --out": ["train", *TINY_RUN, "--steps", "2", "--out", "/proc/layup-run"],
}


@pytest.mark.parametrize("case", VIRTUAL_OUTPUTS)
def test_a_virtual_file_system_is_not_a_disk(tmp_path, shards, case):
    """/proc has no blocks: the output is refused as unwritable, not as "0 B free"."""
    args = [binary("layup"), *VIRTUAL_OUTPUTS[case]]
    if case.startswith("train"):
        args += ["--data", shards]
    result = quick_fail(args, "cannot be written", "virtual file system", "not a disk",
                        seconds=10)
    assert "0 B free" not in result.stderr


def test_a_read_only_folder_is_refused_before_the_work(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        probe = locked / "probe"
        try:
            probe.write_text("x")
            probe.unlink()
            pytest.skip("this user writes through permission bits (root)")
        except PermissionError:
            pass
        quick_fail([binary("layup"), "bench-adamw", "--params", "1000000", "--json",
                    locked / "out.json"], "--json", "cannot be written", "permission denied")
        quick_fail([binary("layup"), "study", "--out", locked, "--steps", "1"], "--out",
                   "cannot be written")
        assert not list(locked.iterdir())
    finally:
        locked.chmod(0o755)


def test_calibrate_checks_its_cache_file_before_measuring(tmp_path):
    (tmp_path / "a-file").write_text("x")
    cache = tmp_path / "a-file" / "calibration.json"
    quick_fail([binary("layup"), "calibrate", "--device", "cpu", "--calibration", cache],
               "--calibration", "is a file, not a folder")
    quick_fail([binary("layup"), "calibrate", "--device", "cpu", "--calibration",
                tmp_path], "--calibration", "is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_bench_disk_refuses_a_scratch_file_larger_than_the_free_space(tmp_path):
    free_gib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize / 2**30
    quick_fail([binary("layup"), "bench-disk", "--offload-dir", tmp_path, "--gib",
                str(int(free_gib * 2) + 1)], "--offload-dir", "free", "this needs about")
    assert not list(tmp_path.iterdir())


# --- side commands' host memory ---

def fake_machine(root, available_gib):
    """A /proc for LAYUP_SYSTEM_ROOT (test_run_lifecycle.py's, without a cgroup limit)."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(
        f"MemTotal: 999999999 kB\nMemAvailable: {int(available_gib * 1024 * 1024)} kB\n")
    (root / "proc" / "self" / "cgroup").write_text("0::/\n")
    return dict(os.environ, LAYUP_SYSTEM_ROOT=str(root))


def test_bench_adamw_beyond_the_host_is_refused_naming_params(tmp_path):
    """The issue's case: 1,649,217,280 parameters (46 GB of arrays) on a 24 GB machine was ended
    by the OOM killer; refused at once, with the largest --params that fits."""
    env = fake_machine(tmp_path / "machine", 22.5)
    result = quick_fail([binary("layup"), "bench-adamw", "--params", "1649217280", "--workers",
                         "1"], "bench-adamw --params 1649217280", "of host memory",
                        "MemAvailable 22.50 GiB", seconds=1.0, env=env)
    largest = int(re.search(r"give --params at most (\d+)", result.stderr).group(1))
    usable = 22.5 * 2**30 - max(22.5 * 2**30 / 20, 512 * 2**20)
    assert largest * 28 <= usable < (largest + 1) * 28 + 28
    # Far beyond any machine, without a fake one: the same refusal, no wrap-around.
    quick_fail([binary("layup"), "bench-adamw", "--params", str(10**15)], "--params",
               "of host memory", seconds=1.0)


def test_bench_disk_buffers_beyond_the_host_name_the_flag(tmp_path):
    quick_fail([binary("layup"), "bench-disk", "--offload-dir", tmp_path, "--chunk-mib", "1e9"],
               "--chunk-mib", "of host memory", "give --chunk-mib at most", seconds=1.0)
    quick_fail([binary("layup"), "bench-disk", "--offload-dir", tmp_path, "--record-mib", "1e9"],
               "--record-mib", "give --record-mib at most", seconds=1.0)
    assert not list(tmp_path.iterdir())


def test_calibrate_cpu_mparams_beyond_the_host_names_the_flag_not_batch(tmp_path):
    cache = tmp_path / "calibration.json"
    result = quick_fail([binary("layup"), "calibrate", "--device", "cpu", "--calibration", cache,
                         "--cpu-mparams", "1e9"], "--cpu-mparams", "of host memory",
                        "give --cpu-mparams at most", seconds=1.0)
    assert "--batch" not in result.stderr
    assert not cache.exists()


# --- signals before the stop handler ---

def first_open_in(folder):
    """An inotify watch for the first file opened in `folder`: returns a function that waits for
    it (so a test can act at a known moment of another process's work)."""
    import ctypes
    import select

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, str(folder).encode(), 0x20) >= 0  # IN_OPEN

    def wait(timeout_s=60):
        try:
            assert select.select([fd], [], [], timeout_s)[0], "nothing was opened"
        finally:
            os.close(fd)
    return wait


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_setup_stops_before_the_run_folder_is_made(tmp_path, shards,
                                                                   signal_number):
    """The signal arrives while the run reads its shards, after its checks and before it plans,
    allocates and makes its folder: the handler, installed first, stops it there (before, the
    default action ended the process). Should the setup outrun the signal, the run stops after its
    first step with a checkpoint, as a signal during training does."""
    data = tmp_path / "data"
    data.mkdir()
    for shard in shards.iterdir():
        (data / shard.name).write_bytes(shard.read_bytes())
    out = tmp_path / "run"
    args = [str(a) for a in train(data, out, "--steps", "100000", "--eval-every", "0",
                                  "--checkpoint-every", "0")]
    opened = first_open_in(data)
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    opened()
    process.send_signal(signal_number)
    _, stderr = process.communicate(timeout=120)
    assert not list(tmp_path.rglob("*.partial")), stderr
    if process.returncode == 1:
        name = "SIGINT (Ctrl-C)" if signal_number == signal.SIGINT else "SIGTERM"
        errors = [line for line in stderr.splitlines() if line.startswith("layup: error:")]
        assert errors == [f"layup: error: stopped by {name} before training began: nothing was "
                          "written"], stderr
        assert not out.exists(), stderr
    else:
        assert process.returncode == 0, stderr
        stopped = [r for r in read_log(out) if "stopped_by" in r]
        assert len(stopped) == 1 and (out / f"step-{stopped[0]['step']:08d}").is_dir(), stderr
