#!/usr/bin/env python3
"""The PyTorch DDP peer of `mpirun -np N layup bench`: pytorch_peer.py's GPT-2 step on N ranks.

Each rank takes --batch sequences of a global batch of N x --batch drawn from the seed (rank r the
r-th slice), so one process at --batch N x B trains on the same tokens. DistributedDataParallel
averages the gradients over the ranks (NCCL on GPUs, gloo on the CPU) during the backward; then
global-norm clipping at 1.0 and fused AdamW, as the one-GPU peer. Timed as the one-GPU peer, each
step between barriers; rank 0 reports the tokens/s of all ranks, the loss averaged over them and
the largest peak memory of any rank. Start it with torchrun:

  torchrun --standalone --nproc_per_node 2 bench/pytorch_ddp_peer.py --model gpt2 --batch 32

Keep NCCL_NVLS_ENABLE=0 on machines whose rules say so.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import pytorch_peer as peer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer.add_run_arguments(parser, batch_help="sequences per rank")
    args = parser.parse_args()

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if on_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    n_layer, n_head, n_embd = peer.CONFIGS[args.model]
    model = peer.GPT2(n_layer, n_head, n_embd).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if on_cuda else None)
    optimizer = torch.optim.AdamW(peer.adamw_param_groups(model.parameters()),
                                  **peer.ADAMW_HYPERPARAMS, fused=on_cuda)
    dtype = torch.bfloat16 if on_cuda else torch.float32
    inputs, targets = peer.synthetic_tokens(world * args.batch, args.seq_len, args.seed, device)
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    inputs, targets = inputs[mine].contiguous(), targets[mine].contiguous()

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=dtype, enabled=on_cuda):
            loss = ddp(inputs, targets)
        loss.backward()  # DDP averages the gradients over the ranks here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss = loss.detach().clone()
        dist.all_reduce(loss)  # the global batch's mean loss, as one process would report it
        dist.barrier()
        return loss.item() / world

    step_ms, loss, device_used_peak = peer.time_steps(train_step, args.warmup, args.steps, on_cuda)
    # The largest of any rank: what each GPU must hold.
    peaks = torch.tensor([torch.cuda.max_memory_allocated() if on_cuda else 0, device_used_peak],
                         dtype=torch.float64, device=device)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    if rank == 0:
        global_args = argparse.Namespace(**{**vars(args), "batch": world * args.batch})
        result = peer.make_result("pytorch-ddp", global_args, device, step_ms, loss,
                                  int(peaks[1].item()))
        result["ranks"] = world
        result["batch_per_rank"] = args.batch
        result["memory_peak_bytes"] = int(peaks[0].item())
        result["memory_source"] = ("torch.cuda.max_memory_allocated, the largest of any rank"
                                   if on_cuda else "none")
        peer.report(result, args.json, [("ranks", f"{world} ({args.batch} sequences each)")])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
