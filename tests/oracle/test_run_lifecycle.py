"""A run's life through the CLI: what the machine's host memory allows, the run folder, resuming
with the run's own settings, stopping on SIGINT/SIGTERM, a log that cannot be written, --version."""
import json
import os
import re
import signal
import struct
import subprocess
import time

import pytest

from oracle_util import TINY_RUN, binary, read_log, run, tiny_shards
from test_bad_inputs import fails_with, snapshot


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


def train(data, out, *extra):
    return [binary("layup"), "train", *TINY_RUN, "--steps", "4", "--data", data, "--out", out,
            *extra]


def fake_machine(root, available_gib, cgroup_limit_bytes=None):
    """A /proc and cgroup tree for LAYUP_SYSTEM_ROOT: the same code path reads it as the real one."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(
        f"MemTotal: 999999999 kB\nMemAvailable: {int(available_gib * 1024 * 1024)} kB\n")
    (root / "proc" / "self" / "cgroup").write_text("0::/job\n")
    job = root / "sys" / "fs" / "cgroup" / "job"
    job.mkdir(parents=True)
    (job / "memory.max").write_text("max\n" if cgroup_limit_bytes is None
                                    else f"{cgroup_limit_bytes}\n")
    (job / "memory.current").write_text("0\n")
    return dict(os.environ, LAYUP_SYSTEM_ROOT=str(root))


# --- host memory ---

def test_a_cgroup_too_small_for_the_plan_is_refused_before_allocating(tmp_path, shards):
    env = fake_machine(tmp_path / "machine", 64, cgroup_limit_bytes=600 * 2**20)
    result = run(train(shards, tmp_path / "run"), check=False, env=env)
    assert result.returncode == 1, result.stderr
    assert "of host memory at its peak" in result.stderr
    assert "cgroup /job limit 600.0 MiB" in result.stderr
    assert not (tmp_path / "run").exists()


def test_the_readmes_bench_example_is_refused_on_a_24_gb_machine(tmp_path):
    env = fake_machine(tmp_path / "machine", 22.5)
    result = run([binary("layup"), "bench", "--model", "gpt2", "--batch", "32", "--seq-len",
                  "1024", "--device", "cpu"], check=False, env=env)
    assert result.returncode == 1, result.stderr
    assert "of host memory at its peak" in result.stderr and "Within the budget" in result.stderr


def test_host_budget_can_lower_the_machines_limit_but_not_raise_it(tmp_path, shards):
    env = fake_machine(tmp_path / "machine", 2)
    fails = run(train(shards, tmp_path / "run", "--host-budget", "64G"), check=False, env=env)
    assert fails.returncode == 1 and "--allow-overcommit" in fails.stderr, fails.stderr
    assert not (tmp_path / "run").exists()
    run(train(shards, tmp_path / "run", "--host-budget", "64G", "--allow-overcommit"), env=env)


def test_the_run_reports_its_peak_resident_set_within_the_plan(tmp_path, shards):
    """The plan covers what the process holds on the host at its peak: the measured peak resident
    set (VmHWM) stays within the plan's host memory, and is not far below it."""
    result = run(train(shards, tmp_path / "run", "--layers", "4", "--dim", "256", "--heads", "4",
                       "--checkpoint-every", "2"))
    plan = float(result.stderr.split("host memory at the peak: ")[1].split(" MiB")[0])
    measured = float(result.stderr.split("process peak resident set (VmHWM): ")[1]
                     .split(" MiB")[0])
    assert measured <= plan, result.stderr
    assert measured >= 0.5 * plan, f"the plan ({plan} MiB) is far above the peak ({measured} MiB)"


# --- the run folder ---

def test_a_new_run_into_another_runs_folder_is_refused(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--steps", "2"))
    before = snapshot(tmp_path / "run")
    fails_with(train(shards, tmp_path / "run", "--steps", "2"), "already holds another run",
               "--resume", "--overwrite")
    assert snapshot(tmp_path / "run") == before


def test_overwrite_replaces_the_other_runs_checkpoints_and_log(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--steps", "3"))
    run(train(shards, tmp_path / "run", "--steps", "2", "--overwrite"))
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-00000002"]
    assert max(r["step"] for r in read_log(tmp_path / "run")) == 2


@pytest.mark.parametrize("make", ["file", "under_a_file"])
def test_an_out_that_is_not_a_folder_is_refused(tmp_path, shards, make):
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" if make == "file" else tmp_path / "a_file" / "run"
    # Under a file: refused with the other checks of --out, before anything is planned or loaded.
    fails_with(train(shards, out), "--out", *([] if make == "file" else ["is a file, not a folder"]))
    assert (tmp_path / "a_file").read_text() == "x"


# --- resume ---

def test_resume_alone_continues_with_the_runs_own_settings(tmp_path, shards):
    """docs/cli.md's example: a run with non-default flags, resumed with --resume alone."""
    common = [binary("layup"), "train", "--layers", "2", "--heads", "2", "--dim", "32",
              "--context", "64", "--seq-len", "32", "--batch", "2", "--lr", "2e-3",
              "--warmup", "1", "--eval-every", "2", "--sample-tokens", "0", "--steps", "4",
              "--data", shards]
    run([*common, "--out", tmp_path / "straight"])
    run([*common, "--out", tmp_path / "split", "--until-step", "2"])
    os.chdir(tmp_path)  # the data folder was saved as an absolute path
    run([binary("layup"), "train", "--resume", tmp_path / "split"])
    for name in ("model.safetensors", "training_state.safetensors"):
        assert (tmp_path / "straight" / "step-00000004" / name).read_bytes() == \
            (tmp_path / "split" / "step-00000004" / name).read_bytes(), name


def test_resume_refuses_a_flag_that_changes_the_trajectory(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--until-step", "2"))
    before = snapshot(tmp_path / "run")
    fails_with([binary("layup"), "train", "--resume", tmp_path / "run", "--lr", "0.5"],
               "--lr 0.5", "the run was trained with 0.001")
    fails_with([binary("layup"), "train", "--resume", tmp_path / "run", "--batch", "3"],
               "--batch 3", "trained with 4")
    assert snapshot(tmp_path / "run") == before


def test_resume_applies_a_flag_that_leaves_the_trajectory_alone(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--until-step", "2", "--eval-every", "0"))
    run([binary("layup"), "train", "--resume", tmp_path / "run", "--eval-every", "1",
         "--threads", "1"])
    evaluated = [r["step"] for r in read_log(tmp_path / "run") if "val_loss" in r]
    assert evaluated == [3, 4]


def test_resume_with_more_steps_extends_a_finished_run(tmp_path, shards):
    run(train(shards, tmp_path / "run"))
    fails_with([binary("layup"), "train", "--resume", tmp_path / "run"], "it is finished",
               "--steps")
    result = run([binary("layup"), "train", "--resume", tmp_path / "run", "--steps", "6"])
    assert "changes the run's length from 4" in result.stderr
    assert (tmp_path / "run" / "step-00000006").is_dir()


def saved_settings(checkpoint):
    """The run settings a checkpoint saved (training_state.safetensors' "options" metadata)."""
    header = (checkpoint / "training_state.safetensors").read_bytes()
    length = struct.unpack("<Q", header[:8])[0]
    return json.loads(json.loads(header[8:8 + length])["__metadata__"]["options"])


def test_a_short_run_needs_no_warmup_flag_and_resumes_with_its_warmup(tmp_path, shards):
    """The default warmup (20 updates) is cut to --steps when --warmup is not given: that value
    is the one saved, and a resume that lengthens the run keeps it."""
    warmup = TINY_RUN.index("--warmup")
    without_warmup = TINY_RUN[:warmup] + TINY_RUN[warmup + 2:]
    run([binary("layup"), "train", *without_warmup, "--steps", "2", "--until-step", "1",
         "--data", shards, "--out", tmp_path / "run"])
    assert saved_settings(tmp_path / "run" / "step-00000001")["warmup_steps"] == 2
    run([binary("layup"), "train", "--resume", tmp_path / "run", "--steps", "3"])
    assert saved_settings(tmp_path / "run" / "step-00000003")["warmup_steps"] == 2


# --- stopping ---

def start_long_run(tmp_path, shards):
    args = [binary("layup"), "train", *TINY_RUN, "--steps", "100000", "--data", shards, "--out",
            tmp_path / "run", "--eval-every", "0", "--checkpoint-every", "0", "--log-every", "1"]
    process = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    log = tmp_path / "run" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and '"loss"' in log.read_text()):
        time.sleep(0.05)
    assert log.exists(), "the run did not start"
    return process


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_finishes_the_step_and_saves(tmp_path, shards, signal_number):
    process = start_long_run(tmp_path, shards)
    process.send_signal(signal_number)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    stopped = [r for r in read_log(tmp_path / "run") if "stopped_by" in r]
    assert len(stopped) == 1, stderr
    step = stopped[0]["step"]
    checkpoint = tmp_path / "run" / f"step-{step:08d}"
    assert checkpoint.is_dir() and str(checkpoint) in stdout, stdout
    assert "continue with: layup train --resume" in stdout
    # The run continues from there.
    run([binary("layup"), "train", "--resume", tmp_path / "run", "--until-step", str(step + 1)])
    assert (tmp_path / "run" / f"step-{step + 1:08d}").is_dir()


def test_a_second_signal_stops_at_once(tmp_path, shards):
    process = start_long_run(tmp_path, shards)
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)  # the first one has been handled
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode in (0, -signal.SIGINT)
    assert not list((tmp_path / "run").glob("step-*.partial"))


# --- the log ---

def test_a_log_that_cannot_be_written_stops_the_run(tmp_path, shards):
    run(train(shards, tmp_path / "run", "--until-step", "1"))
    log = tmp_path / "run" / "log.jsonl"
    log.unlink()
    log.symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    result = fails_with([binary("layup"), "train", "--resume", tmp_path / "run"],
                        "cannot write to the log file", "no space left on device")
    assert "trained to step" not in result.stdout


def test_version_names_the_commit(tmp_path):
    result = run([binary("layup"), "--version"])
    assert result.stdout.startswith("layup ") and "commit" in result.stdout


def test_an_allocation_that_fails_is_one_error(tmp_path, shards):
    """Memory the plan counted on but the process cannot get (here an address-space limit the
    plan does not know of) ends in one line and exit 1, not an abort."""
    import resource

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (900 * 2**20, 900 * 2**20))

    args = train(shards, tmp_path / "run", "--layers", "4", "--heads", "4", "--dim", "512")
    result = run(args, check=False, preexec_fn=limit_address_space)
    assert result.returncode == 1, result.stderr
    # Where the allocation fails decides the words: "out of memory" (std::bad_alloc, caught at the
    # top) or "out of host memory allocating ..." (the device's own allocator).
    # It fails where the address space runs out: at the start (a build linking the CUDA libraries
    # maps much of it), or at the checkpoint, after the steps' progress lines.
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("layup: error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], result.stderr
    assert re.match(r"layup: error: out of (host )?memory", errors[0]), result.stderr
    assert "terminate" not in result.stderr and "Aborted" not in result.stderr, result.stderr


def test_a_refused_study_leaves_no_folder(tmp_path):
    env = fake_machine(tmp_path / "machine", 4)
    result = run([binary("layup"), "study", "--model", "gpt2-medium", "--batch", "16", "--out",
                  tmp_path / "study"], check=False, env=env)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("of host memory at its peak") == 1, result.stderr
    assert not (tmp_path / "study").exists()


# --- checkpoints and the disk ---

def test_checkpoints_that_do_not_fit_the_disk_are_refused_before_allocating(tmp_path, shards):
    # ~40 TB of weights and optimizer state a checkpoint: no test machine's disk holds that.
    args = [binary("layup"), "train", "--layers", "4000", "--heads", "16", "--dim", "8192",
            "--steps", "1", "--data", shards, "--out", tmp_path / "run"]
    result = fails_with(args, "do not fit on the disk of its folder", "free",
                        "--checkpoint-contents weights", "--no-checkpoints", "--out")
    assert "host memory" not in result.stderr  # refused before the memory plan
    assert not (tmp_path / "run").exists()


def test_a_disk_that_fills_during_a_checkpoint_leaves_the_last_one_intact(tmp_path, shards):
    """A file-size limit makes every write past it fail (EFBIG, SIGXFSZ ignored) as a full disk
    makes them fail (ENOSPC). A limit the checkpoints do not fit is refused at the start
    (test_outputs_and_limits.py), so it is lowered once the run is past its checks, as a disk
    fills during a run: the save of step 20 stops, and step 10 still resumes."""
    import resource

    run(train(shards, tmp_path / "run", "--steps", "40", "--until-step", "10",
              "--checkpoint-every", "10"))
    before = snapshot(tmp_path / "run" / "step-00000010")

    process = subprocess.Popen([binary("layup"), "train", "--resume", str(tmp_path / "run")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    header = ""
    while not header.startswith("layup train:"):  # printed after the checks, steps before a save
        header = process.stderr.readline()
        assert header, "the run ended before its header"
    resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("layup: error:")]
    assert len(errors) == 1, stderr
    for phrase in ("cannot write", "File too large", "ulimit -f",
                   "The checkpoint of step 20 was not written",
                   f"The last complete checkpoint, {tmp_path / 'run' / 'step-00000010'}, is intact",
                   "--checkpoint-contents weights"):
        assert phrase in errors[0], errors[0]
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-00000010"]
    assert snapshot(tmp_path / "run" / "step-00000010") == before

    resumed = run([binary("layup"), "train", "--resume", tmp_path / "run", "--until-step", "20"])
    assert "resumed from" in resumed.stderr and "step-00000010" in resumed.stderr
    assert (tmp_path / "run" / "step-00000020").is_dir()


def test_the_checkpoint_line_reports_its_size_and_rate(tmp_path, shards):
    result = run(train(shards, tmp_path / "run", "--checkpoint-every", "2"))
    assert re.search(r"checkpoint \S+step-00000004: [0-9.]+ GB in [0-9.]+ s \([0-9.]+ GB/s\)",
                     result.stderr), result.stderr
    saves = [r for r in read_log(tmp_path / "run") if "checkpoint" in r]
    assert [r["step"] for r in saves] == [2, 4]
    assert all(r["checkpoint_bytes"] > 0 and r["checkpoint_s"] >= 0 for r in saves)


def test_weights_only_checkpoints_hold_no_optimizer_state_and_do_not_resume(tmp_path, shards):
    result = run(train(shards, tmp_path / "run", "--checkpoint-contents", "weights",
                       "--checkpoint-shard-mb", "1"))
    step = tmp_path / "run" / "step-00000004"
    assert "checkpoint" in result.stdout
    assert (step / "model.safetensors.index.json").is_file() and (step / "config.json").is_file()
    assert not list(step.glob("optimizer*")) and not (step / "training_state.safetensors").exists()
    fails_with([binary("layup"), "train", "--resume", tmp_path / "run", "--steps", "6"],
               "holds the weights only", "cannot be resumed", "layup sample")
    run([binary("layup"), "sample", "--checkpoint", step, "--tokens", "4"])


def test_the_final_sample_draws_only_ids_the_tokenizer_spells(tmp_path, shards):
    """A model whose vocabulary is larger than the tokenizer's (a Llama-family shape trained on the
    shipped GPT-2 tokens): the sample at the end of the run stays inside GPT-2's 50,257 ids, which
    a hot temperature over a fresh model's near-uniform logits would otherwise leave."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": 60000, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "hidden_act": "silu"}))
    result = run([binary("layup"), "train", "--model", model, "--steps", "1", "--batch", "2",
                  "--seq-len", "32", "--eval-every", "0", "--sample-tokens", "200",
                  "--temperature", "2.0", "--data", shards, "--out", tmp_path / "run"])
    assert "\nsample:\n" in result.stdout, result.stdout
