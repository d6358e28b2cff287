"""Helpers shared by the oracle tests: paths to layup's binaries, random GPT-2 models, tokens."""
import base64
import subprocess

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from paths import BUILD_DIR, DATA_DIR
VOCAB = 50257


def binary(name):
    path = BUILD_DIR / name
    assert path.exists(), f"{path} is missing: build layup first (cmake --build {BUILD_DIR})"
    return str(path)


def run(args, check=True, **kwargs):
    """Runs a command, returning the CompletedProcess; on failure shows its output."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def random_hf_model(path, n_layer=2, n_head=4, n_embd=64, n_positions=32, seed=0):
    """A random GPT2LMHeadModel saved with save_pretrained. Biases and layer-norm parameters are
    perturbed away from their 0/1 init so that every parameter takes part in the check."""
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions,
                        vocab_size=VOCAB, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        activation_function="gelu_new")
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "ln_" in name or name.endswith(".bias"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return load_hf(path)


def load_hf(path):
    model = GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager",
                                            torch_dtype=torch.float32)
    model.eval()  # no dropout (the probabilities are 0 anyway)
    return model


def random_tokens(path, micro_batches, B, T, seed=1):
    """Writes micro_batches x (B*T inputs, B*T targets) int32 tokens; returns them as tensors."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(micro_batches):
        window = rng.integers(0, VOCAB, size=(B, T + 1), dtype=np.int32)
        batches.append((window[:, :-1].copy(), window[:, 1:].copy()))
    with open(path, "wb") as f:
        for inputs, targets in batches:
            f.write(inputs.tobytes())
            f.write(targets.tobytes())
    return [(torch.from_numpy(i).long(), torch.from_numpy(t).long()) for i, t in batches]


def hf_loss(model, inputs, targets):
    logits = model(inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1)), logits


def relative_error(actual, expected):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


TINY_MODEL = ["--layers", "2", "--heads", "2", "--dim", "32", "--context", "64"]
TINY_TRAINING = ["--seq-len", "32", "--batch", "4", "--eval-every", "5",
                         "--eval-batches", "2", "--sample-tokens", "0", "--warmup", "2",
                         "--lr", "1e-3", "--min-lr", "1e-4"]
TINY_RUN = TINY_MODEL + TINY_TRAINING


def tiny_shards(path, characters=60_000):
    """Token shards of the start of both shipped texts, made with `layup tokenize`."""
    path.mkdir(parents=True, exist_ok=True)
    texts = []
    for name in ("austen.txt", "kjv.txt"):
        text_path = path / name
        text_path.write_bytes((DATA_DIR / "corpus" / name).read_bytes()[:characters])
        texts.append(text_path)
    shards = path / "shards"
    run([binary("layup"), "tokenize", "--out", shards, *texts])
    return shards


def tiny_trained_run(run_dir, shards):
    """A run folder of the 2-layer TINY_MODEL trained 2 steps: one resumable checkpoint,
    step-00000002, that `layup sample` reads too."""
    run([binary("layup"), "train", *TINY_RUN, "--steps", "2", "--data", shards, "--out", run_dir])
    assert (run_dir / "step-00000002" / "training_state.safetensors").is_file()
    return run_dir


def read_log(run_dir):
    import json
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def target_env(device, dtype="fp32"):
    """The environment that points layup_model_tool at a compute target; skips the calling test,
    saying why, where this build or machine cannot run that target (e.g. no GPU)."""
    import os
    import pytest
    env = dict(os.environ, LAYUP_ORACLE_DEVICE=device, LAYUP_ORACLE_DTYPE=dtype)
    probe = run([binary("layup_model_tool"), "target"], check=False, env=env)
    if probe.returncode != 0:
        pytest.skip(f"{device}/{dtype} is not usable here: {probe.stderr.strip()}")
    return env


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_TOKEN = 50256


def local_gpt2_encoding():
    """tiktoken's GPT-2 encoding, made from the shipped gpt2.tiktoken rather than downloaded."""
    import tiktoken
    ranks = {}
    for line in (DATA_DIR / "gpt2-tokenizer" / "gpt2.tiktoken").read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN})


def check_grads_tool_output(out_dir, model, inputs, targets):
    """What `layup_model_tool grads` wrote to out_dir against `model` on the same batch: logits,
    loss and every parameter's gradient within 1e-5. Returns layup's gradients by HF name."""
    from safetensors.torch import load_file
    loss, logits = hf_loss(model, inputs, targets)
    loss.backward()
    outputs = load_file(out_dir / "outputs.safetensors")
    assert relative_error(outputs["logits"], logits.detach()) < 1e-5
    assert relative_error(outputs["loss"], loss.detach().reshape(1)) < 1e-5
    grads = load_file(out_dir / "grads" / "model.safetensors")
    expected = {name: p.grad for name, p in model.named_parameters()}
    assert set(grads) == set(expected), set(grads) ^ set(expected)
    for name, grad in expected.items():
        assert grads[name].shape == grad.shape, name
        error = relative_error(grads[name], grad)
        assert error < 1e-5, f"{name}: relative error {error:.3e}"
    return grads
