"""The masked loss of instruction fine-tuning against transformers: a window whose prompt targets
are not learned (layup's target -1, transformers' label -100) gives the same loss (the mean over
the learned targets), logits and every gradient, on a tiny GPT-2 and a tiny Llama; a window with
nothing learned gives loss 0 and no gradient."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from oracle_util import VOCAB, binary, random_hf_model, relative_error, run, target_env

B, T = 2, 24
# Not-learned targets per sequence: a prompt of 9 targets, and one of 17 (a shorter completion).
PROMPTS = (9, 17)


def tiny_llama(path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


MODELS = {"gpt2": lambda path: random_hf_model(path), "llama": tiny_llama}


def write_window(path, window, learned):
    """layup_model_tool's tokens: the inputs window[:, :T], then the targets window[:, 1:] with
    -1 where a target is not learned."""
    targets = np.where(learned, window[:, 1:], -1).astype(np.int32)
    with open(path, "wb") as f:
        f.write(window[:, :-1].astype(np.int32).tobytes())
        f.write(targets.tobytes())


@pytest.mark.parametrize("family", sorted(MODELS))
def test_masked_loss_and_gradients_match_transformers_labels(tmp_path, family):
    env = target_env("cpu", "fp32")
    model = MODELS[family](tmp_path / "model")
    window = np.random.default_rng(3).integers(0, VOCAB, size=(B, T + 1), dtype=np.int64)
    learned = np.ones((B, T), dtype=bool)
    for b, prompt in enumerate(PROMPTS):
        learned[b, :prompt] = False
    write_window(tmp_path / "tokens.bin", window, learned)
    run([binary("layup_model_tool"), "grads", tmp_path / "model", tmp_path / "tokens.bin", B, T,
         tmp_path / "out"], env=env)

    # transformers' own loss: labels are the inputs, -100 where not learned, shifted inside the
    # model. The window's last token is only a label, and causal attention keeps it out of every
    # earlier logit, so the first T logits are layup's.
    labels = torch.from_numpy(window).clone()
    labels[:, 1:][torch.from_numpy(~learned)] = -100
    output = model(torch.from_numpy(window), labels=labels)
    output.loss.backward()
    outputs = load_file(tmp_path / "out" / "outputs.safetensors")
    assert relative_error(outputs["logits"], output.logits[:, :T].detach()) < 1e-5
    assert relative_error(outputs["loss"], output.loss.detach().reshape(1)) < 1e-5
    # Not the unmasked mean: the mask matters.
    unmasked = torch.nn.functional.cross_entropy(output.logits[:, :T].reshape(-1, VOCAB),
                                                 torch.from_numpy(window[:, 1:]).reshape(-1))
    assert abs(outputs["loss"].item() - unmasked.item()) > 1e-3
    grads = load_file(tmp_path / "out" / "grads" / "model.safetensors")
    for name, param in model.named_parameters():
        error = relative_error(grads[name], param.grad)
        assert error < 1e-5, f"{name}: relative error {error:.3e}"


def test_a_window_with_nothing_learned_has_loss_zero_and_no_gradient(tmp_path):
    env = target_env("cpu", "fp32")
    random_hf_model(tmp_path / "model")
    window = np.random.default_rng(4).integers(0, VOCAB, size=(B, T + 1), dtype=np.int64)
    write_window(tmp_path / "tokens.bin", window, np.zeros((B, T), dtype=bool))
    run([binary("layup_model_tool"), "grads", tmp_path / "model", tmp_path / "tokens.bin", B, T,
         tmp_path / "out"], env=env)
    assert load_file(tmp_path / "out" / "outputs.safetensors")["loss"].item() == 0.0
    for name, grad in load_file(tmp_path / "out" / "grads" / "model.safetensors").items():
        assert torch.count_nonzero(grad) == 0, name
