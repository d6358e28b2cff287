"""Sharded checkpoints in Hugging Face's layout, both ways: layup's shards (the writer's, and a
training run's) load in transformers with the same weights, logits and loss, and
save_pretrained's shards load in layup."""
import json

import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel

from oracle_util import (TINY_RUN, binary, hf_loss, random_hf_model, random_tokens, relative_error,
                         run, tiny_shards)

B, T = 2, 32
# The 9.6 MB token embedding gets a shard of its own; each block (~112 kB) spans two.
MAX_SHARD_BYTES = 100_000
CHUNK_BYTES = 4096


def shard_names(directory):
    return sorted(path.name for path in directory.glob("model-*-of-*.safetensors"))


def small_model(path):
    return random_hf_model(path, n_layer=3, n_head=2, n_embd=48, n_positions=64)


def load_in_transformers_matching_layup(checkpoint, tmp_path):
    """transformers loads `checkpoint` with no key missing or left over, and its logits and loss on
    random tokens are layup's (layup_model_tool grads on the same directory). Returns the model."""
    model, info = GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation="eager",
                                                  dtype=torch.float32, output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    run([binary("layup_model_tool"), "grads", checkpoint, tmp_path / "tokens.bin", B, T,
         tmp_path / "out"])
    outputs = load_file(tmp_path / "out" / "outputs.safetensors")
    with torch.no_grad():
        loss, logits = hf_loss(model, inputs, targets)
    assert relative_error(outputs["logits"], logits) < 1e-5
    assert relative_error(outputs["loss"], loss.reshape(1)) < 1e-5
    return model


def test_layup_shards_load_in_transformers_with_the_same_logits_and_loss(tmp_path):
    original = small_model(tmp_path / "model")
    sharded = tmp_path / "sharded"
    largest = run([binary("layup_model_tool"), "save-sharded", tmp_path / "model", sharded,
                   MAX_SHARD_BYTES, CHUNK_BYTES]).stdout.split()
    # Both directions moved the parameters a chunk at a time.
    assert [int(n) for n in largest] == [CHUNK_BYTES // 4, CHUNK_BYTES // 4]

    shards = shard_names(sharded)
    assert len(shards) > 3
    assert all(name.endswith(f"-of-{len(shards):05d}.safetensors") for name in shards)
    assert not (sharded / "model.safetensors").exists()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    stored = {}
    for name in shards:
        tensors = load_file(sharded / name)
        assert all(index["weight_map"][tensor] == name for tensor in tensors)
        stored.update(tensors)
    assert set(stored) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in stored.values())
    assert max((sharded / name).stat().st_size for name in shards[1:]) <= MAX_SHARD_BYTES + 4096

    model = load_in_transformers_matching_layup(sharded, tmp_path)
    expected_weights = original.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected_weights[name]), name


def test_save_pretrained_shards_load_in_layup_with_the_same_loss(tmp_path):
    model = small_model(tmp_path / "model")
    sharded = tmp_path / "hf-sharded"
    model.save_pretrained(sharded, max_shard_size=MAX_SHARD_BYTES)
    assert len(shard_names(sharded)) > 3
    assert not (sharded / "model.safetensors").exists()

    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    with torch.no_grad():
        expected, _ = hf_loss(model, inputs, targets)
    actual = float(run([binary("layup_model_tool"), "loss", sharded, tmp_path / "tokens.bin",
                        B, T]).stdout)
    assert abs(actual - expected.item()) <= 1e-5 * abs(expected.item())

    # A shard gone: the error names it.
    missing = sharded / shard_names(sharded)[1]
    missing.unlink()
    result = run([binary("layup_model_tool"), "loss", sharded, tmp_path / "tokens.bin", B, T],
                 check=False)
    assert result.returncode == 1
    assert f"{missing} does not exist" in result.stderr, result.stderr


def test_a_trainers_sharded_checkpoint_loads_in_transformers(tmp_path):
    """`layup train` writes its checkpoints span by span from the schedule; with 1 MB shards the
    weights are several files that transformers loads, giving layup's logits."""
    shards = tiny_shards(tmp_path / "data")
    run([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--checkpoint-shard-mb", "1",
         "--data", shards, "--out", tmp_path / "run"])
    checkpoint = tmp_path / "run" / "step-00000002"
    assert len(shard_names(checkpoint)) > 1
    assert not (checkpoint / "model.safetensors").exists()

    load_in_transformers_matching_layup(checkpoint, tmp_path)
