"""Model inputs layup cannot run are refused with one line naming the file or flag, exit status 1,
before any work, and change no file: Hugging Face configs of other classes or inconsistent heads,
a checkpoint whose config.json describes another shape than its state, CUDA-only flags on the
CPU, a host memory reading that cannot be trusted."""
import json
import os
import shutil

import pytest

from oracle_util import (TINY_MODEL, TINY_RUN, TINY_TRAINING, binary, run, tiny_shards,
                         tiny_trained_run)
from test_bad_inputs import fails_with, snapshot

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 64,
}
MEMORY = [*TINY_MODEL, "--batch", "2", "--seq-len", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shards):
    return tiny_trained_run(tmp_path_factory.mktemp("trained") / "run", shards)


def config_file(path, config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path / "config.json"


# --- Hugging Face config.json ---

@pytest.mark.parametrize("edit, phrases", [
    ({"architectures": ["BertForMaskedLM"]},
     ['"architectures" names "bertformaskedlm", a class layup does not train',
      "layup trains gpt2lmheadmodel"]),
    ({"num_key_value_heads": 0},
     ['"num_key_value_heads" is 0; it must be at least 1 and divide "num_attention_heads" 4']),
    ({"num_key_value_heads": 3}, ['"num_key_value_heads" is 3']),
    ({"num_attention_heads": 5, "num_key_value_heads": 5},
     ['"hidden_size" 32 is not divisible by "num_attention_heads" 5; give "head_dim"']),
    ({"head_dim": 0}, ['"head_dim" is 0; it must be at least 1']),
], ids=["bert", "zero-kv-heads", "kv-heads-not-dividing", "heads-not-dividing", "zero-head-dim"])
def test_a_config_layup_cannot_train_is_refused_naming_the_field(tmp_path, edit, phrases):
    config = config_file(tmp_path / "model", {**LLAMA, **edit})
    result = fails_with([binary("layup"), "memory", "--model", config, "--batch", "2",
                         "--seq-len", "32", "--device", "cpu"], str(config), *phrases)
    assert result.stdout == ""


def test_a_gpt2_config_of_another_class_is_not_loaded_as_gpt2(tmp_path):
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2,
            "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 50257}
    memory = [binary("layup"), "memory", "--batch", "2", "--seq-len", "32", "--device", "cpu"]
    run([*memory, "--model", config_file(tmp_path / "gpt2", gpt2)])
    bert = config_file(tmp_path / "bert", {**gpt2, "architectures": ["BertForMaskedLM"]})
    fails_with([*memory, "--model", bert],
               f'{bert}: "architectures" names "BertForMaskedLM", a class layup does not train '
               'with model_type "gpt2"')


# --- resuming a checkpoint whose files disagree ---

@pytest.mark.parametrize("field, value, trained_value", [
    ("n_layer", 3, 2), ("n_embd", 64, 32),
])
def test_resume_refuses_a_config_of_another_shape_than_its_state(tmp_path, trained, shards, field,
                                                                 value, trained_value):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint = run_dir / "step-00000002"
    shutil.copytree(trained / "step-00000002", checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config[field] = value
    (checkpoint / "config.json").write_text(json.dumps(config))
    before = snapshot(run_dir)
    result = fails_with([binary("layup"), "train", "--resume", run_dir, *TINY_TRAINING, "--steps",
                         "3", "--data", shards],
                        f"cannot resume {checkpoint}: its config.json describes a model with "
                        f"{field} {value}, but its training state",
                        f"was saved by a run with {field} {trained_value}",
                        "put back the config.json saved with this checkpoint")
    assert "internal error" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert snapshot(run_dir) == before  # no new checkpoint, no log, the old one as it was


# --- CUDA-only flags on the CPU backend ---

@pytest.mark.parametrize("flags, env, phrase", [
    (["--attention", "cudnn"], {}, "--attention cudnn (or layup_attention=cudnn) is a cuda backend"),
    (["--attention", "layup"], {}, "--attention layup (or layup_attention=layup) is a cuda backend"),
    ([], {"LAYUP_ATTENTION": "cudnn"}, "--attention cudnn (or layup_attention=cudnn)"),
    (["--recompute", "1"], {}, "--recompute 1 is a cuda backend option"),
], ids=["attention-cudnn", "attention-layup", "env-cudnn", "recompute"])
def test_cuda_only_flags_are_refused_on_the_cpu_before_the_run(tmp_path, shards, flags, env,
                                                                phrase):
    out = tmp_path / "run"
    result = run([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", shards, "--out",
                  out, "--device", "cpu", *flags], check=False, env={**os.environ, **env})
    assert result.returncode == 1, result.stderr
    assert phrase in result.stderr.lower() and "use --device cuda" in result.stderr, result.stderr
    assert not out.exists()


# --- host memory readings ---

def machine_with(root, meminfo):
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(meminfo)
    (root / "proc" / "self" / "cgroup").write_text("0::/\n")
    return {**os.environ, "LAYUP_SYSTEM_ROOT": str(root)}


@pytest.mark.parametrize("value, why", [("-1", "negative"), ("lots", "not a number")])
def test_a_negative_or_unparsable_memavailable_is_refused(tmp_path, shards, value, why):
    env = machine_with(tmp_path / "machine", f"MemTotal: 999 kB\nMemAvailable: {value} kB\n")
    meminfo = tmp_path / "machine" / "proc" / "meminfo"
    out = tmp_path / "run"
    result = run([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", shards, "--out",
                  out], check=False, env=env)
    assert result.returncode == 1, result.stderr
    assert f"{meminfo}: MemAvailable is '{value}', {why}" in result.stderr, result.stderr
    assert not out.exists()
    # The flag the message names runs without the reading.
    memory = [binary("layup"), "memory", *MEMORY]
    assert run(memory, check=False, env=env).returncode == 1
    run([*memory, "--allow-overcommit"], env=env)
