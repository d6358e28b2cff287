#!/usr/bin/env python3
"""The PyTorch peer of `layup bench`: the same GPT-2 training step, timed the same way.

A compact GPT-2 (pre-LayerNorm blocks, learned positions, tanh GELU, tied LM head, vocabulary
padded to 50304, no dropout) with F.scaled_dot_product_attention(is_causal=True), bf16 autocast
with fp32 master weights, global-norm clipping at 1.0 and fused AdamW: what a careful PyTorch user
writes (nanoGPT's recipe). Eager by default, torch.compile with --compile. Synthetic uniform
tokens from a fixed seed; warm-up steps, then timed steps, each from zero_grad to the loss read
back (as layup's step ends), between torch.cuda.synchronize() calls.

  bench/pytorch_peer.py --model gpt2 --batch 32 --seq-len 1024 [--compile] [--json FILE]

FLOPs per token for MFU use layup's formula: 6N + 12LTC, N = 12LC^2 + VC (V = 50257).
"""
import argparse
import datetime
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # n_layer, n_head, n_embd
    "small": (4, 4, 128),
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
}
VOCAB = 50257
PADDED_VOCAB = 50304
H100_BF16_DENSE_FLOPS = 989.4e12


class Block(nn.Module):
    def __init__(self, n_head, n_embd):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, n_positions=1024):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.blocks = nn.ModuleList(Block(n_head, n_embd) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, PADDED_VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        # The padded logits are excluded from the loss, as in layup.
        logits = logits[..., :VOCAB].float()
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def flops_per_token(n_layer, n_embd, seq_len):
    return 6.0 * (12.0 * n_layer * n_embd**2 + VOCAB * n_embd) + 12.0 * n_layer * seq_len * n_embd


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# AdamW as in nanoGPT and layup: weight decay on the 2-D (matmul and embedding) weights only.
ADAMW_HYPERPARAMS = {"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8}
WEIGHT_DECAY = 0.1


def weight_decay_for(param):
    return WEIGHT_DECAY if param.dim() == 2 else 0.0


def adamw_param_groups(params):
    params = list(params)
    decay = [p for p in params if weight_decay_for(p) > 0]
    no_decay = [p for p in params if weight_decay_for(p) == 0]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0}]


def synthetic_tokens(batch, seq_len, seed, device):
    """Uniform inputs and targets from their own generator: every peer trains on the same data."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, seq_len)
    inputs = torch.randint(0, VOCAB, shape, generator=generator).to(device)
    targets = torch.randint(0, VOCAB, shape, generator=generator).to(device)
    return inputs, targets


def device_used_bytes():
    """The whole GPU's memory in use (cudaMemGetInfo total - free: every process, the CUDA
    context, the caching allocator's reserve), the reading layup's bench takes after each step."""
    free, total = torch.cuda.mem_get_info()
    return total - free


def time_steps(train_step, warmup, steps, on_cuda):
    """Runs warmup + steps calls of train_step (which returns the loss as a float), each between
    device synchronizations; returns the timed steps' milliseconds, the last loss, and the largest
    whole-GPU memory in use read after a step, as layup's bench reads it (0 off CUDA)."""
    def sync():
        if on_cuda:
            torch.cuda.synchronize()

    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    step_ms, loss, device_used_peak = [], float("nan"), 0
    for step in range(warmup + steps):
        sync()
        start = time.perf_counter()
        loss = train_step()
        sync()
        if step >= warmup:
            step_ms.append((time.perf_counter() - start) * 1e3)
        if on_cuda:
            device_used_peak = max(device_used_peak, device_used_bytes())
    return step_ms, loss, device_used_peak


def timing_result(engine, args, device, step_ms, loss, device_used_peak, model, fpt, formula):
    """The JSON object of one run, as both peers write it: args carries batch, seq_len, warmup,
    steps and seed; `model` the model's own fields (its name and sizes), fpt its FLOPs per token
    by `formula`; the rest is what time_steps returned."""
    on_cuda = device == "cuda"
    tokens_per_step = args.batch * args.seq_len
    tokens_per_s = tokens_per_step * len(step_ms) / (sum(step_ms) / 1e3)
    device_name = torch.cuda.get_device_name() if on_cuda else cpu_model()
    hopper = on_cuda and ("H100" in device_name or "H200" in device_name)
    peak = H100_BF16_DENSE_FLOPS if hopper else 0.0
    return {
        "engine": engine,
        "command_line": " ".join([sys.executable] + sys.argv),
        **model,
        "batch": args.batch, "seq_len": args.seq_len, "grad_accum": 1,
        "warmup_steps": args.warmup, "steps": args.steps, "seed": args.seed,
        "device": device, "dtype": "bf16" if on_cuda else "fp32", "device_name": device_name,
        "tokens_per_step": tokens_per_step, "step_ms": step_ms,
        "median_ms": statistics.median(step_ms), "min_ms": min(step_ms), "max_ms": max(step_ms),
        "tokens_per_s": tokens_per_s, "flops_per_token": fpt, "flops_formula": formula,
        "achieved_tflops": fpt * tokens_per_s / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu": fpt * tokens_per_s / peak if peak else None,
        "memory_source": "torch.cuda.max_memory_allocated (this process's tensors)" if on_cuda
        else "none",
        "memory_peak_bytes": torch.cuda.max_memory_allocated() if on_cuda else 0,
        "memory_reserved_peak_bytes": torch.cuda.max_memory_reserved() if on_cuda else 0,
        "memory_device_used_peak_bytes": device_used_peak,
        "last_loss": loss,
        "torch_version": torch.__version__,
        "machine": {"hostname": socket.gethostname(), "cpu": cpu_model(),
                    "gpu": device_name if on_cuda else "none"},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
    }


def make_result(engine, args, device, step_ms, loss, device_used_peak):
    """The JSON object of one GPT-2 run (timing_result)."""
    n_layer, n_head, n_embd = CONFIGS[args.model]
    return timing_result(
        engine, args, device, step_ms, loss, device_used_peak,
        {"model": args.model, "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd},
        flops_per_token(n_layer, n_embd, args.seq_len),
        "6N + 12LTC, N = 12LC^2 + VC (matmul weights, V = 50257, tied head)")


def report(result, json_path=None, extra_rows=()):
    """Prints the result as a two-column table (extra_rows after the common ones) and writes
    it to json_path if given."""
    r = result
    on_cuda = r["device"] == "cuda"
    gib = 1024.0**3
    rows = [
        ("engine", f"{r['engine']} (torch {r['torch_version']})"),
        ("config", f"{r['model']} ({r['n_layer']} layers, {r['n_head']} heads, "
                   f"width {r['n_embd']})"),
        ("B x T", f"{r['batch']} x {r['seq_len']}"),
        ("device / dtype", f"{r['device']} ({r['device_name']}) / {r['dtype']}"),
        ("steps", f"{r['warmup_steps']} warm-up, {r['steps']} timed"),
        ("tokens/s", f"{r['tokens_per_s']:.0f}"),
        ("ms/step", f"median {r['median_ms']:.2f}, min {r['min_ms']:.2f}, max {r['max_ms']:.2f}"),
        ("FLOPs/token", f"{r['flops_per_token']:.4g} (6N + 12LTC, N = matmul weights)"),
        ("achieved", f"{r['achieved_tflops']:.2f} TFLOP/s"),
        ("MFU", f"{100 * r['mfu']:.1f}% of {r['peak_tflops']:.1f} TFLOP/s dense bf16" if r["mfu"]
         is not None else "n/a (no known peak for this device)"),
        ("memory peak", f"{r['memory_peak_bytes'] / gib:.2f} GiB allocated, "
                        f"{r['memory_reserved_peak_bytes'] / gib:.2f} GiB reserved, "
                        f"{r['memory_device_used_peak_bytes'] / gib:.2f} GiB whole GPU"
         if on_cuda else "n/a"),
        ("last loss", f"{r['last_loss']:.4f}"),
        *extra_rows,
    ]
    for name, value in rows:
        print(f"  {name:<22} {value}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
        print(f"  {'json':<22} {json_path}")


def add_run_arguments(parser, batch_help=None):
    """The flags every GPT-2 peer takes: the model, the shape, the steps, the device, the seed and
    the JSON file."""
    parser.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    parser.add_argument("--batch", type=int, default=32, help=batch_help)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--json", help="write the result as one JSON object here")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = device == "cuda"
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    n_layer, n_head, n_embd = CONFIGS[args.model]
    model = GPT2(n_layer, n_head, n_embd).to(device)
    optimizer = torch.optim.AdamW(adamw_param_groups(model.parameters()), **ADAMW_HYPERPARAMS,
                                  fused=on_cuda)
    step_model = torch.compile(model) if args.compile else model
    dtype = torch.bfloat16 if on_cuda else torch.float32
    inputs, targets = synthetic_tokens(args.batch, args.seq_len, args.seed, device)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype, enabled=on_cuda):
            loss = step_model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()  # reads the loss back, as layup's step does

    step_ms, loss, device_used_peak = time_steps(train_step, args.warmup, args.steps, on_cuda)
    engine = "pytorch-compile" if args.compile else "pytorch-eager"
    report(make_result(engine, args, device, step_ms, loss, device_used_peak), args.json)


if __name__ == "__main__":
    main()
