"""The Llama family (Llama, Qwen2, Mistral) on layup's CPU backend against transformers in fp32:
tiny random models made and saved here (grouped-query attention, tied and untied heads, Qwen2's
q/k/v biases, Llama 3's rope scaling), loaded by layup; logits, loss and every gradient compared;
layup's save of the gradients loaded back by transformers."""
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from oracle_util import (VOCAB, binary, check_grads_tool_output, hf_loss, local_gpt2_encoding,
                         random_tokens, relative_error, run, target_env)

B, T = 2, 24
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

FAMILIES = {
    "llama-untied": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=False)),
    # Llama 3's stretch of the slow frequencies, with an original context short enough that all
    # three bands of the rule occur at head_dim 16.
    "llama3-scaled-tied": lambda: LlamaForCausalLM(LlamaConfig(
        **SHAPE, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama-bias-mha": lambda: LlamaForCausalLM(LlamaConfig(
        **{**SHAPE, "num_key_value_heads": 4}, attention_bias=True)),
    "qwen2-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=None)),
}


def random_model(path, family, seed=0):
    """The family's model with every parameter away from its init (norm gains 1, biases 0), so
    each takes part in the check, saved with save_pretrained in fp32."""
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_loss_and_every_gradient_match_transformers(tmp_path, family):
    env = target_env("cpu", "fp32")
    model = random_model(tmp_path / "model", family)
    [(inputs, targets)] = random_tokens(tmp_path / "tokens.bin", 1, B, T)
    run([binary("layup_model_tool"), "grads", tmp_path / "model", tmp_path / "tokens.bin", B, T,
         tmp_path / "out"], env=env)

    grads = check_grads_tool_output(tmp_path / "out", model, inputs, targets)

    # What layup saved (here the gradients, in the model's layout and config) is a model
    # transformers loads as the same architecture and shape.
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "grads")
    assert type(saved) is type(model)
    assert saved.config.num_key_value_heads == model.config.num_key_value_heads
    assert saved.config.tie_word_embeddings == model.config.tie_word_embeddings
    for name, param in saved.named_parameters():
        assert torch.equal(param.detach(), grads[name]), name


@pytest.mark.parametrize("family", ["llama-untied", "qwen2-tied"])
def test_train_init_from_starts_at_the_models_weights_and_saves_what_transformers_loads(
        tmp_path, family):
    """`layup train --init-from` with a learning rate too small to move any weight: the run's
    checkpoint holds the model's weights bit for bit (so they were loaded, not initialized), in
    files transformers loads as the same model."""
    model = random_model(tmp_path / "model", family)
    run([binary("layup"), "train", "--init-from", tmp_path / "model", "--steps", "1",
         "--lr", "1e-30", "--min-lr", "1e-30", "--warmup", "0", "--batch", "2", "--seq-len", "16",
         "--eval-every", "0", "--sample-tokens", "0", "--out", tmp_path / "run"])
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "step-00000001")
    assert type(saved) is type(model)
    expected = dict(model.named_parameters())
    for name, param in saved.named_parameters():
        assert torch.equal(param, expected[name]), name


@pytest.mark.parametrize("family", ["llama-untied", "mistral"])
def test_greedy_sample_decodes_what_transformers_generates(tmp_path, family):
    """`layup sample --top-k 1` continues a prompt with the tokens transformers' greedy generate
    picks. The head's weights are scaled up so that the likeliest token leads the next by far more
    than the two engines' rounding differences."""
    torch.manual_seed(1)
    model = FAMILIES[family]()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    model.save_pretrained(tmp_path / "model")
    model.eval()
    encoding = local_gpt2_encoding()
    prompt = "It was the best of times"
    ids = torch.tensor([encoding.encode(prompt)])
    expected = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)[0].tolist()
    result = subprocess.run([str(binary("layup")), "sample", "--checkpoint", str(tmp_path / "model"),
                             "--prompt", prompt, "--tokens", "12", "--top-k", "1"],
                            capture_output=True, check=True)
    # Bytes: twelve random tokens need not end on a UTF-8 boundary.
    assert result.stdout == encoding.decode_bytes(expected) + b"\n"


@pytest.mark.parametrize("family", ["llama-untied", "qwen2-tied"])
def test_ten_adamw_steps_match_torch(tmp_path, family):
    """Ten AdamW updates from the same weights and batches (warmup + cosine, clipping, two
    micro-batches a step) in layup and in torch.optim: the same losses and parameters. The clip
    is half the first gradient norm, so every step clips on both sides, far from the threshold.
    The learning rate is small for the reason test_adamw_against_torch.py gives."""
    from test_adamw_against_torch import ACCUM, LR, MIN_LR, STEPS, WARMUP, WD, torch_adamw_steps
    model = random_model(tmp_path / "model", family)
    batches = random_tokens(tmp_path / "tokens.bin", STEPS * ACCUM, B, T)
    inputs, targets = batches[0]
    first, _ = hf_loss(model, inputs, targets)
    first.backward()
    clip = 0.5 * torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    run([binary("layup_model_tool"), "train", tmp_path / "model", tmp_path / "tokens.bin", B, T,
         STEPS, ACCUM, LR, MIN_LR, WARMUP, WD, clip, tmp_path / "out"])

    # Decay on matrices only: not norms or biases.
    losses, norms = torch_adamw_steps(model, batches, clip, lambda name, param: param.dim() == 2)
    assert all(norm > 1.2 * clip for norm in norms)

    result = load_file(tmp_path / "out" / "losses.safetensors")
    assert relative_error(result["loss"], torch.tensor(losses)) < 1e-5
    assert all(factor < 1.0 for factor in result["clip_factor"])
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "model")
    reference = dict(model.named_parameters())
    for name, param in trained.named_parameters():
        error = relative_error(param.detach(), reference[name].detach())
        assert error < 1e-5, f"{name}: relative error {error:.3e}"
