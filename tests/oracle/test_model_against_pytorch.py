"""layup's logits, loss and every gradient against Hugging Face's GPT-2 in PyTorch (fp32), on
every backend this machine can run (the CUDA one is skipped, with the reason, without a GPU)."""
import pytest
from safetensors.torch import load_file

from oracle_util import (binary, hf_loss, random_hf_model, random_tokens, relative_error, run,
                         target_env)

B, T = 4, 32


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_logits_loss_and_every_gradient_match_pytorch(tmp_path, device):
    env = target_env(device, "fp32")
    model = random_hf_model(tmp_path / "model", n_layer=2, n_head=4, n_embd=64, n_positions=T)
    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    run([binary("layup_model_tool"), "grads", tmp_path / "model", tmp_path / "tokens.bin", B, T,
         tmp_path / "out"], env=env)

    loss, logits = hf_loss(model, inputs, targets)
    loss.backward()
    outputs = load_file(tmp_path / "out" / "outputs.safetensors")
    assert relative_error(outputs["logits"], logits.detach()) < 1e-5
    assert relative_error(outputs["loss"], loss.detach().reshape(1)) < 1e-5

    grads = load_file(tmp_path / "out" / "grads" / "model.safetensors")
    expected = {name: p.grad for name, p in model.named_parameters()}
    assert "lm_head.weight" not in expected  # tied: its gradient is wte's
    assert set(grads) == set(expected), set(grads) ^ set(expected)
    for name, grad in expected.items():
        assert grads[name].shape == grad.shape, name
        error = relative_error(grads[name], grad)
        assert error < 1e-5, f"{name}: relative error {error:.3e}"
