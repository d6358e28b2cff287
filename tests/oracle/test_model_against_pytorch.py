"""layup's logits, loss and every gradient against Hugging Face's GPT-2 in PyTorch (fp32), on
every backend this machine can run (the CUDA one is skipped, with the reason, without a GPU)."""
import pytest

from oracle_util import (binary, check_grads_tool_output, random_hf_model, random_tokens, run,
                         target_env)

B, T = 4, 32


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_logits_loss_and_every_gradient_match_pytorch(tmp_path, device):
    env = target_env(device, "fp32")
    model = random_hf_model(tmp_path / "model", n_layer=2, n_head=4, n_embd=64, n_positions=T)
    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    run([binary("layup_model_tool"), "grads", tmp_path / "model", tmp_path / "tokens.bin", B, T,
         tmp_path / "out"], env=env)

    assert "lm_head.weight" not in dict(model.named_parameters())  # tied: wte's gradient
    check_grads_tool_output(tmp_path / "out", model, inputs, targets)
