#!/usr/bin/env python3
"""The PyTorch peer of layup's compact optimizer state: the same GPT-2 trained on the same token
shards with fp32 AdamW and with torchao's AdamW8bit (blockwise 8-bit moments), so the loss an
8-bit state costs can be compared engine against engine.

The model is bench/pytorch_peer.py's GPT-2 (bf16 autocast, fp32 master weights, tied head), the
schedule layup's (linear warmup from lr/warmup, cosine to --min-lr), clipping at 1.0, weight
decay on the 2-D weights only. Training windows are drawn at random from the train shards
(torch.Generator seeded), validation is the mean loss of --eval-batches fixed consecutive windows
of the val shards. One CSV line per evaluation: step, train loss (mean since the last
evaluation), validation loss.

  bench/pytorch_optimizer_state_peer.py --data DIR --optimizer adamw8bit --steps 2000 --csv F
"""
import argparse
import csv
import glob
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_peer import CONFIGS, GPT2, adamw_param_groups  # noqa: E402


def read_shards(pattern):
    """Concatenated token ids of llm.c-layout shards (uint16 magic 20240520, uint32 20240801)."""
    parts = []
    for path in sorted(glob.glob(pattern)):
        header = np.fromfile(path, dtype="<i4", count=256)
        dtype = {20240520: "<u2", 20240801: "<u4"}.get(int(header[0]))
        if dtype is None:
            sys.exit(f"{path}: not a token shard (magic {header[0]})")
        parts.append(np.fromfile(path, dtype=dtype, offset=1024, count=int(header[2])))
    if not parts:
        sys.exit(f"no token shards match {pattern}")
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


def lr_at(step, args):
    """layup's schedule (optim/lr_schedule.cpp)."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (args.lr - args.min_lr)


def make_optimizer(name, params, args):
    groups = adamw_param_groups(params)
    common = {"lr": args.lr, "betas": (0.9, 0.95), "eps": 1e-8}
    if name == "adamw":
        return torch.optim.AdamW(groups, fused=True, **common)
    if name == "adamw8bit":
        from torchao.optim import AdamW8bit  # blockwise 8-bit moments, block size 256
        return AdamW8bit(groups, **common)
    if name == "adamw-bnb8bit":
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(groups, **common)
    sys.exit(f"unknown --optimizer {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="folder of train_*.bin / val_*.bin shards")
    parser.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    parser.add_argument("--optimizer", default="adamw",
                        choices=["adamw", "adamw8bit", "adamw-bnb8bit"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--min-lr", type=float, default=6e-5)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--csv", required=True)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = "cuda"
    train = read_shards(os.path.join(args.data, "train_*.bin"))
    val = read_shards(os.path.join(args.data, "val_*.bin"))
    n_layer, n_head, n_embd = CONFIGS[args.model]
    model = GPT2(n_layer, n_head, n_embd).to(device)
    optimizer = make_optimizer(args.optimizer, model.parameters(), args)
    generator = torch.Generator().manual_seed(args.seed)
    window = args.seq_len + 1

    def batch_at(tokens, starts):
        rows = torch.stack([tokens[s:s + window] for s in starts.tolist()]).to(device)
        return rows[:, :-1], rows[:, 1:]

    val_starts = [torch.arange(args.batch) * window + b * args.batch * window
                  for b in range(args.eval_batches)]
    if int(val_starts[-1][-1]) + window > len(val):
        sys.exit("the validation shards are too short for --eval-batches windows")

    @torch.no_grad()
    def validation_loss():
        model.eval()
        losses = []
        for starts in val_starts:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                losses.append(model(*batch_at(val, starts)).item())
        model.train()
        return sum(losses) / len(losses)

    started = time.time()
    with open(args.csv, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "train_loss", "val_loss"])
        out.writerow([0, "", f"{validation_loss():.6f}"])
        train_sum, train_count = 0.0, 0
        for step in range(args.steps):
            for group in optimizer.param_groups:
                if torch.is_tensor(group["lr"]):  # torchao's optimizers keep lr as a tensor
                    group["lr"].fill_(lr_at(step, args))
                else:
                    group["lr"] = lr_at(step, args)
            starts = torch.randint(0, len(train) - window, (args.batch,), generator=generator)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(*batch_at(train, starts))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            train_sum += loss.item()
            train_count += 1
            done = step + 1
            if done % args.eval_every == 0 or done == args.steps:
                val_loss = validation_loss()
                out.writerow([done, f"{train_sum / train_count:.6f}", f"{val_loss:.6f}"])
                f.flush()
                print(f"{args.optimizer} step {done}: train {train_sum / train_count:.4f} "
                      f"val {val_loss:.4f} ({time.time() - started:.0f} s)", flush=True)
                train_sum, train_count = 0.0, 0


if __name__ == "__main__":
    main()
