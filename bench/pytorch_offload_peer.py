#!/usr/bin/env python3
"""The PyTorch peers of layup's `offload` and `layup` modes: AdamW on the CPU, timed like layup.

Both offloading peers keep the fp32 parameters the model computes with on the device and the fp32
master weights and AdamW state on the CPU; they differ in when the CPU works. "Conventional
offload" (ZeRO-Offload without its overlap) waits for the whole backward pass, then moves every
gradient to the host, clips, runs one AdamW step over all parameters and copies every weight
back: the GPU idles during the CPU step and the CPU idles during forward and backward.
"Layer-wise" is the overlap PyTorch users write with hooks: a post-accumulate-grad hook on each
parameter starts that parameter's gradient copy, CPU AdamW step and weight copy back as soon as
backward has produced the gradient, so the CPU updates the last layers while the GPU is still
computing the gradients of the first. It cannot clip by the global norm, which is known only
after the last gradient, so it runs with --clip none.

  gpu        everything on the device, fused AdamW there (pytorch_peer.py's eager step)
  offload    backward, then every gradient to pinned host memory, CPU clip + AdamW, weights back
  layerwise  per-parameter hooks: gradient to host on a side stream, AdamW on a CPU worker thread,
             weight back on another side stream, overlapping backward; --clip none only

  bench/pytorch_offload_peer.py --mode gpu|offload|layerwise --model gpt2 --batch 32 --seq-len 1024
      [--warmup 3] [--steps 10] [--clip 1.0|none] [--cpu-threads N] [--device auto|cpu|cuda]
      [--json FILE] [--seed 1337]
  bench/pytorch_offload_peer.py --check --device cpu --model small --batch 2 --seq-len 64

The model, data, AdamW hyper-parameters, timing and JSON fields are pytorch_peer.py's. A step runs
from zero_grad until the loss is read back and the new weights are on the device. --check trains
3 steps of each mode from the same weights in fp32 without clipping and fails if offload or
layerwise ends more than 1e-5 away from gpu in any parameter.
"""
import argparse
import copy
import os
import queue
import sys
import threading

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_peer  # noqa: E402  (the shared GPT-2 module, data, timing and report)
from pytorch_peer import ADAMW_HYPERPARAMS, CONFIGS, GPT2  # noqa: E402

MODES = ("gpu", "offload", "layerwise")
CHECK_STEPS = 3
CHECK_TOLERANCE = 1e-5

_fused_cpu_adamw_failed = False


def cpu_adamw(param_groups):
    """Fused AdamW over CPU tensors (PyTorch >= 2.4); foreach AdamW where fused is refused."""
    global _fused_cpu_adamw_failed
    if not _fused_cpu_adamw_failed:
        try:
            return torch.optim.AdamW(param_groups, **ADAMW_HYPERPARAMS, fused=True)
        except (RuntimeError, ValueError) as error:
            _fused_cpu_adamw_failed = True
            print(f"  note: fused AdamW on the CPU is not available ({error}); using foreach=True")
    return torch.optim.AdamW(param_groups, **ADAMW_HYPERPARAMS, foreach=True)


def host_copy(tensor, on_cuda):
    """An fp32 CPU copy of tensor, page-locked on CUDA so copies to and from it are asynchronous."""
    host = tensor.detach().to("cpu", dtype=torch.float32, copy=True)
    return host.pin_memory() if on_cuda else host


def host_buffer_like(tensor, on_cuda):
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=on_cuda)


def pinned_bytes(host_tensors, on_cuda):
    return sum(t.numel() * t.element_size() for t in host_tensors) if on_cuda else 0


class DeviceAdamW:
    """Mode gpu: fused AdamW on the device, as pytorch_peer.py."""

    engine = "pytorch-gpu"

    def __init__(self, model, on_cuda, clip):
        self.params = list(model.parameters())
        self.clip = clip
        self.optimizer = torch.optim.AdamW(pytorch_peer.adamw_param_groups(self.params),
                                           **ADAMW_HYPERPARAMS, fused=on_cuda)
        self.host_pinned_bytes = 0

    def update_weights(self):
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.optimizer.step()

    def close(self):
        pass


class ConventionalOffload:
    """Mode offload: after backward, gradients to the host, CPU clip + AdamW, weights back."""

    engine = "pytorch-offload"

    def __init__(self, model, on_cuda, clip):
        self.on_cuda = on_cuda
        self.clip = clip
        self.device_params = list(model.parameters())
        self.master_weights = [host_copy(p, on_cuda) for p in self.device_params]
        # The master weights' .grad are the pinned buffers the gradients are copied into, so the
        # CPU clip and AdamW read them in place.
        for master in self.master_weights:
            master.grad = host_buffer_like(master, on_cuda)
        # The AdamW moments stay in pageable memory: they never cross PCIe.
        self.optimizer = cpu_adamw(pytorch_peer.adamw_param_groups(self.master_weights))
        self.host_pinned_bytes = 2 * pinned_bytes(self.master_weights, on_cuda)  # weights + grads

    def update_weights(self):
        for param, master in zip(self.device_params, self.master_weights):
            master.grad.copy_(param.grad, non_blocking=True)
        self.synchronize()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.master_weights, self.clip)
        self.optimizer.step()
        with torch.no_grad():
            for param, master in zip(self.device_params, self.master_weights):
                param.copy_(master, non_blocking=True)
        # Also keeps the next step's AdamW from writing a master weight still being copied.
        self.synchronize()

    def synchronize(self):
        if self.on_cuda:
            torch.cuda.synchronize()

    def close(self):
        pass


class LayerwiseOffload:
    """Mode layerwise: each parameter's gradient copy, CPU AdamW and weight copy start from a
    post-accumulate-grad hook during backward; update_weights() only waits for them.

    Per parameter i, on CUDA:
      compute stream  ... grad_i produced -> grad_ready[i]
      d2h stream      wait grad_ready[i] -> grad_i into pinned grad_host[i] -> grad_on_host[i]
      worker thread   grad_on_host[i].synchronize() -> AdamW on master[i] -> enqueue h2d copy
      h2d stream      pinned master[i] into param i -> weight_on_device[i]
    and the compute stream waits for the h2d stream before the next forward.
    """

    engine = "pytorch-layerwise"

    def __init__(self, model, on_cuda, clip):
        if clip is not None:
            raise ValueError("layerwise mode cannot clip by the global gradient norm")
        self.on_cuda = on_cuda
        params = list(model.parameters())
        self.device_weights = [p.detach() for p in params]  # the worker writes these, untracked
        self.master_weights = [host_copy(p, on_cuda) for p in params]
        self.grad_host = [host_buffer_like(m, on_cuda) for m in self.master_weights]
        for master, grad in zip(self.master_weights, self.grad_host):
            master.grad = grad
        # One optimizer per parameter, so each can be stepped alone the moment its gradient lands.
        self.optimizers = [
            cpu_adamw([{"params": [m], "weight_decay": pytorch_peer.weight_decay_for(m)}])
            for m in self.master_weights]
        self.host_pinned_bytes = 2 * pinned_bytes(self.master_weights, on_cuda)  # weights + grads
        if on_cuda:
            self.d2h_stream = torch.cuda.Stream()
            self.h2d_stream = torch.cuda.Stream()
            self.grad_ready = [torch.cuda.Event() for _ in params]
            self.grad_on_host = [torch.cuda.Event() for _ in params]
            self.weight_on_device = [torch.cuda.Event() for _ in params]
        self.worker_error = None
        self.updates = queue.Queue()
        self.worker = threading.Thread(target=self._worker_loop, name="cpu-adamw", daemon=True)
        self.worker.start()
        self.hooks = [p.register_post_accumulate_grad_hook(self._make_grad_hook(i))
                      for i, p in enumerate(params)]

    def _make_grad_hook(self, i):
        def on_grad_ready(param):
            grad = param.grad
            if self.on_cuda:
                # Runs on the autograd thread with the stream that produced grad current; the
                # copy on the side stream must not start before that stream has written it.
                self.grad_ready[i].record()
                self.d2h_stream.wait_event(self.grad_ready[i])
                with torch.cuda.stream(self.d2h_stream):
                    self.grad_host[i].copy_(grad, non_blocking=True)
                    self.grad_on_host[i].record()
                # grad is freed below while the copy may still read it: tell the caching
                # allocator not to hand its memory to the compute stream before the copy is done.
                grad.record_stream(self.d2h_stream)
            else:
                self.grad_host[i].copy_(grad)
            param.grad = None
            self.updates.put(i)
        return on_grad_ready

    def _worker_loop(self):
        while True:
            i = self.updates.get()
            try:
                if i is None:
                    return
                if self.worker_error is None:
                    self._update_parameter(i)
            except BaseException as error:  # reported by update_weights on the main thread
                self.worker_error = error
            finally:
                self.updates.task_done()

    def _update_parameter(self, i):
        if self.on_cuda:
            self.grad_on_host[i].synchronize()
            # The last step's copy of master[i] to the device must be done before AdamW rewrites
            # it. The compute stream's wait before this step's forward already orders it on the
            # GPU, but the host does not wait for that; this makes it explicit (and is free).
            self.weight_on_device[i].synchronize()
        self.optimizers[i].step()
        if self.on_cuda:
            # Overwriting weight i while backward goes on is safe: every backward kernel that
            # reads it belongs to a node that feeds its gradient, so it was enqueued before
            # grad_ready[i], and grad_on_host[i] has completed, so the GPU has run it.
            with torch.cuda.stream(self.h2d_stream):
                self.device_weights[i].copy_(self.master_weights[i], non_blocking=True)
                self.weight_on_device[i].record()
        else:
            self.device_weights[i].copy_(self.master_weights[i])

    def update_weights(self):
        """Waits until every parameter updated during backward is back on the device."""
        self.updates.join()  # every hook has fired by now, since backward() has returned
        if self.worker_error is not None:
            raise RuntimeError("the CPU AdamW worker failed") from self.worker_error
        if self.on_cuda:
            # All weight copies are on the h2d stream, enqueued before join() returned.
            torch.cuda.current_stream().wait_stream(self.h2d_stream)

    def close(self):
        for hook in self.hooks:
            hook.remove()
        self.updates.put(None)
        self.worker.join()


ENGINES = {"gpu": DeviceAdamW, "offload": ConventionalOffload, "layerwise": LayerwiseOffload}


def make_train_step(model, engine, inputs, targets, device, autocast_dtype):
    """One step: forward, backward (which starts the layerwise updates), the mode's weight update,
    then the loss read back; autocast_dtype None runs in fp32."""
    def train_step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            loss = model(inputs, targets)
        loss.backward()
        engine.update_weights()
        return loss.item()
    return train_step


def check(args, device):
    """Trains CHECK_STEPS steps of every mode from the same weights in fp32 and compares each
    parameter with mode gpu; returns the process exit status."""
    on_cuda = device == "cuda"
    # The modes must differ only in where AdamW runs, so no TF32 in the matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    initial = GPT2(*CONFIGS[args.model]).to(device)
    inputs, targets = pytorch_peer.synthetic_tokens(args.batch, args.seq_len, args.seed, device)
    trained, losses = {}, {}
    for mode in MODES:
        model = copy.deepcopy(initial)  # keeps the tied embedding / head weight tied
        engine = ENGINES[mode](model, on_cuda, clip=None)
        train_step = make_train_step(model, engine, inputs, targets, device, autocast_dtype=None)
        losses[mode] = [train_step() for _ in range(CHECK_STEPS)]
        engine.close()
        if on_cuda:
            torch.cuda.synchronize()
        trained[mode] = dict(model.named_parameters())

    print(f"  check: {CHECK_STEPS} steps of each mode in fp32 on {device}, --clip none, "
          f"{args.model} B={args.batch} T={args.seq_len}")
    for mode in MODES:
        print(f"  {mode:<10} losses {', '.join(f'{loss:.6f}' for loss in losses[mode])}")
    # How far AdamW moved the weights, to show that a difference under the tolerance is not
    # just a missing update (lr 1e-4 moves most weights by about 1e-4 per step).
    moved = max((trained["gpu"][name] - p).abs().max().item()
                for name, p in initial.named_parameters())
    print(f"  max |gpu weights - initial weights| = {moved:.3e}")
    worst = 0.0
    for mode in MODES[1:]:
        print(f"  max |{mode} - gpu| per parameter:")
        for name, reference in trained["gpu"].items():
            diff = (trained[mode][name] - reference).abs().max().item()
            worst = max(worst, diff)
            flag = "  <-- over tolerance" if diff > CHECK_TOLERANCE else ""
            print(f"    {name:<28} {diff:.3e}{flag}")
    passed = worst <= CHECK_TOLERANCE
    print(f"  check {'passed' if passed else 'FAILED'}: max difference {worst:.3e}, "
          f"tolerance {CHECK_TOLERANCE:.0e}")
    return 0 if passed else 1


def parse_clip(text):
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--clip takes a number or 'none', not {text!r}") from None
    if value <= 0:
        raise ValueError(f"--clip must be positive (or 'none'), not {text!r}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, help="which peer to time (not with --check)")
    parser.add_argument("--check", action="store_true",
                        help=f"train {CHECK_STEPS} fp32 steps of each mode, compare the weights")
    parser.add_argument("--model", default="gpt2", choices=sorted(CONFIGS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--clip", metavar="1.0|none",
                        help="global-norm gradient clipping (default: 1.0, none for layerwise)")
    parser.add_argument("--cpu-threads", type=int, default=os.cpu_count(),
                        help="torch intra-op threads for the CPU AdamW (default: all cores)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--json", help="write the result as one JSON object here")
    args = parser.parse_args()

    if args.check == (args.mode is not None):
        parser.error("give either --mode gpu|offload|layerwise or --check")
    if args.clip is None:
        args.clip = None if args.mode == "layerwise" or args.check else 1.0
    else:
        try:
            args.clip = parse_clip(args.clip)
        except ValueError as error:
            parser.error(str(error))
    if args.mode == "layerwise" and args.clip is not None:
        parser.error(f"--clip {args.clip}: layerwise updates each parameter as soon as its "
                     "gradient is ready, before the global gradient norm is known, so it cannot "
                     "clip by that norm; run it with --clip none")
    if args.check and args.clip is not None:
        parser.error("--check compares the modes without clipping; leave --clip out")
    if args.cpu_threads < 1:
        parser.error("--cpu-threads must be at least 1")

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = device == "cuda"
    torch.set_num_threads(args.cpu_threads)
    if args.check:
        sys.exit(check(args, device))

    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = GPT2(*CONFIGS[args.model]).to(device)
    engine = ENGINES[args.mode](model, on_cuda, args.clip)
    inputs, targets = pytorch_peer.synthetic_tokens(args.batch, args.seq_len, args.seed, device)
    train_step = make_train_step(model, engine, inputs, targets, device,
                                 torch.bfloat16 if on_cuda else None)
    step_ms, loss, device_used_peak = pytorch_peer.time_steps(train_step, args.warmup, args.steps,
                                                              on_cuda)
    engine.close()

    result = pytorch_peer.make_result(engine.engine, args, device, step_ms, loss,
                                      device_used_peak)
    result.update({"mode": args.mode, "clip": args.clip, "cpu_threads": args.cpu_threads,
                   "host_pinned_bytes": engine.host_pinned_bytes})
    pytorch_peer.report(result, args.json, extra_rows=[
        ("mode", args.mode),
        ("clip", "none" if args.clip is None else f"global norm {args.clip}"),
        ("CPU threads", f"{args.cpu_threads}"),
        ("pinned host", f"{engine.host_pinned_bytes / 1024.0**3:.2f} GiB"),
    ])


if __name__ == "__main__":
    main()
