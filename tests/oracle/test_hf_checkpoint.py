"""layup's checkpoints are Hugging Face GPT-2 checkpoints, in both directions."""
import torch

from oracle_util import (TINY_RUN, binary, hf_loss, load_hf, random_hf_model, random_tokens,
                         run, tiny_shards)

B, T = 2, 32


def layup_loss(model_dir, tokens_path):
    return float(run([binary("layup_model_tool"), "loss", model_dir, tokens_path, B, T]).stdout)


def test_layup_checkpoint_loads_in_transformers_with_the_same_loss(tmp_path):
    shards = tiny_shards(tmp_path / "data")
    run([binary("layup"), "train", *TINY_RUN, "--steps", "3", "--data", shards,
         "--out", tmp_path / "run"])
    checkpoint = tmp_path / "run" / "step-00000003"
    model = load_hf(checkpoint)
    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    with torch.no_grad():
        expected, _ = hf_loss(model, inputs, targets)
    actual = layup_loss(checkpoint, tmp_path / "tokens.bin")
    assert abs(actual - expected.item()) <= 1e-5 * abs(expected.item())


def test_save_pretrained_model_loads_in_layup_with_the_same_loss(tmp_path):
    model = random_hf_model(tmp_path / "model", n_layer=3, n_head=2, n_embd=48, n_positions=64)
    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    with torch.no_grad():
        expected, _ = hf_loss(model, inputs, targets)
    actual = layup_loss(tmp_path / "model", tmp_path / "tokens.bin")
    assert abs(actual - expected.item()) <= 1e-5 * abs(expected.item())
