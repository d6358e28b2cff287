#!/usr/bin/env python3
"""The PyTorch peer of `layup bench --model llama-3.2-1b`: the same Llama training step, timed the
same way as bench/pytorch_peer.py times GPT-2.

transformers' LlamaForCausalLM built from a LlamaConfig of the published shape (random weights:
nothing is downloaded), SDPA attention, fp32 master weights under bf16 autocast, global-norm
clipping at 1.0, fused AdamW with weight decay on the matrices; eager by default, torch.compile of
the model with --compile. Synthetic uniform tokens from a fixed seed: one row of T + 1 tokens per
sequence, the first T the inputs and the last T the targets, so the loss covers all T positions
as layup's does (transformers' labels= would shift inside and drop one). Warm-up steps, then timed
steps, each from zero_grad to the loss read back, between torch.cuda.synchronize() calls.

  bench/pytorch_llama_peer.py --model llama-3.2-1b --batch 8 --seq-len 2048 [--compile]
  bench/pytorch_llama_peer.py --model llama-3-8b --batch 2 --seq-len 2048 --cpu-offload \
      --device-budget 24
  bench/pytorch_llama_peer.py --model tiny --device cpu --batch 2 --seq-len 64 --steps 2

--cpu-offload is the recipe torchao gives for a model whose AdamW state does not fit the GPU:
torchao's CPUOffloadOptimizer (AdamW on the CPU, fused; each gradient copied to pinned host memory
by a hook as backward produces it and freed on the GPU, each parameter copied back after its step),
the model in bf16 (weights, gradients and AdamW state all bf16: CPUOffloadOptimizer keeps the
host copy in the parameters' dtype, and fp32 weights of an 8B model alone would fill a 24 GB GPU),
activation checkpointing per layer, no clipping (the gradients are gone from the GPU once copied)
and no accumulation (offload_gradients frees each gradient, so the micro-batches cannot be
summed): one micro-batch a step. --device-budget GiB caps PyTorch's caching allocator
(set_per_process_memory_fraction) to stand for a smaller GPU.

FLOPs per token for MFU use layup's count: 6N + 12LTC, N the matmul weights (q/k/v, o, gate, up,
down of every block, and V C for the head). llama-3-8b in fp32 with AdamW needs ~128 GB for its
weights, gradients and moments alone: more than one H200 holds beside the activations.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_peer  # noqa: E402  (the timing, AdamW groups and report of the GPT-2 peer)

LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# The published shapes, as layup's named configs (src/model/model_config.cpp) give them; tiny is
# for a CPU smoke test.
CONFIGS = {
    "llama-3.2-1b": dict(num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         hidden_size=2048, intermediate_size=8192, vocab_size=128256,
                         max_position_embeddings=131072, rope_theta=500000.0,
                         rope_scaling=LLAMA3_ROPE_SCALING, tie_word_embeddings=True,
                         rms_norm_eps=1e-5),
    "llama-3-8b": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       hidden_size=4096, intermediate_size=14336, vocab_size=128256,
                       max_position_embeddings=8192, rope_theta=500000.0, rope_scaling=None,
                       tie_word_embeddings=False, rms_norm_eps=1e-5),
    "llama-2-13b": dict(num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                        hidden_size=5120, intermediate_size=13824, vocab_size=32000,
                        max_position_embeddings=4096, rope_theta=10000.0, rope_scaling=None,
                        tie_word_embeddings=False, rms_norm_eps=1e-5),
    "tiny": dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 hidden_size=64, intermediate_size=96, vocab_size=512,
                 max_position_embeddings=131072, rope_theta=500000.0,
                 rope_scaling=LLAMA3_ROPE_SCALING, tie_word_embeddings=True, rms_norm_eps=1e-5),
}


def llama_config(name):
    shape = CONFIGS[name]
    return LlamaConfig(**shape, hidden_act="silu", attention_bias=False, mlp_bias=False,
                       attention_dropout=0.0, attn_implementation="sdpa")


def matmul_weights(shape):
    """N of the PaLM count, as layup's model_flops_per_token: every block's q, k, v, o, gate, up
    and down projections, and the head's V x C (tied or not; the input lookup is no matmul)."""
    C, L, I, V = (shape[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                      "vocab_size"))
    head_dim = C // shape["num_attention_heads"]
    qkv = (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]) * head_dim
    attention = shape["num_attention_heads"] * head_dim
    return L * (qkv * C + attention * C + 3 * I * C) + V * C


def flops_per_token(shape, seq_len):
    C, L = shape["hidden_size"], shape["num_hidden_layers"]
    return 6.0 * matmul_weights(shape) + 12.0 * L * seq_len * C


def synthetic_tokens(batch, seq_len, vocab, seed, device):
    """Inputs and their next tokens, uniform over the vocabulary from their own generator."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=generator).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def make_result(engine, args, device, step_ms, loss, device_used_peak, n_params):
    """The JSON object of one run (pytorch_peer.timing_result), with the Llama shape's fields."""
    shape = CONFIGS[args.model]
    model = {
        "model": args.model, "n_layer": shape["num_hidden_layers"],
        "n_head": shape["num_attention_heads"], "n_kv_head": shape["num_key_value_heads"],
        "n_embd": shape["hidden_size"], "intermediate_size": shape["intermediate_size"],
        "vocab_size": shape["vocab_size"], "n_params": n_params,
    }
    result = pytorch_peer.timing_result(
        engine, args, device, step_ms, loss, device_used_peak, model,
        flops_per_token(shape, args.seq_len),
        "6N + 12LTC, N = matmul weights: L (q/k/v + o + 3IC) + VC")
    result["transformers_version"] = transformers.__version__
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-3.2-1b", choices=sorted(CONFIGS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--json", help="write the result as one JSON object here")
    parser.add_argument("--cpu-offload", action="store_true",
                        help="torchao's CPUOffloadOptimizer, bf16 model, checkpointed layers")
    parser.add_argument("--device-budget", type=float,
                        help="GiB of GPU memory PyTorch's allocator may take")
    args = parser.parse_args()
    for flag in ("batch", "seq_len", "steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.seq_len > CONFIGS[args.model]["max_position_embeddings"]:
        parser.error(f"--seq-len {args.seq_len} is above {args.model}'s context")

    device = args.device
    on_cuda = device == "cuda"
    if on_cuda and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU; --device cpu runs on the CPU")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    if args.cpu_offload and not on_cuda:
        parser.error("--cpu-offload needs --device cuda (CPUOffloadOptimizer offloads from a GPU)")
    if args.device_budget:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.device_budget * 2**30 / total))

    config = llama_config(args.model)
    if args.cpu_offload:
        torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy ever on the GPU
    with torch.device(device):  # initialized where it trains: 8B on the CPU takes minutes
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.train()
    if args.cpu_offload:
        model.gradient_checkpointing_enable()
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    n_params = sum(p.numel() for p in model.parameters())  # a tied head counted once
    if args.cpu_offload:
        from torchao.optim import CPUOffloadOptimizer
        optimizer = CPUOffloadOptimizer(pytorch_peer.adamw_param_groups(model.parameters()),
                                        torch.optim.AdamW, offload_gradients=True, fused=True,
                                        **pytorch_peer.ADAMW_HYPERPARAMS)
    else:
        optimizer = torch.optim.AdamW(pytorch_peer.adamw_param_groups(model.parameters()),
                                      **pytorch_peer.ADAMW_HYPERPARAMS, fused=on_cuda)
    step_model = torch.compile(model) if args.compile else model
    dtype = torch.bfloat16 if on_cuda else torch.float32
    vocab = config.vocab_size
    inputs, targets = synthetic_tokens(args.batch, args.seq_len, vocab, args.seed, device)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype, enabled=on_cuda):
            logits = step_model(input_ids=inputs, use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        if not args.cpu_offload:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()  # reads the loss back, as layup's step does

    step_ms, loss, device_used_peak = pytorch_peer.time_steps(train_step, args.warmup, args.steps,
                                                              on_cuda)
    engine = "pytorch-compile" if args.compile else "pytorch-eager"
    if args.cpu_offload:
        engine = "pytorch-torchao-cpu-offload-bf16"
    result = make_result(engine, args, device, step_ms, loss, device_used_peak, n_params)
    pytorch_peer.report(result, args.json, extra_rows=(
        ("parameters", f"{n_params:,} ({result['n_kv_head']} K/V heads, "
                       f"MLP {result['intermediate_size']}, transformers "
                       f"{result['transformers_version']})"),))


if __name__ == "__main__":
    main()
