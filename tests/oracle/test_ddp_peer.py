"""bench/pytorch_ddp_peer.py, the PyTorch DDP peer of layup's runs on several GPUs, trains the same
function as the one-process peer: two ranks of B sequences (gloo on the CPU) end with the loss of
one process at 2B on the same tokens. A peer that split the data or averaged the gradients wrongly
would time a different training run than layup's."""
import json
import subprocess
import sys

import pytest

from paths import REPO

BENCH = REPO / "bench"
SHAPE = ["--model", "small", "--seq-len", "32", "--warmup", "1", "--steps", "2", "--device", "cpu"]


def peer(args, tmp_path, name):
    out = tmp_path / f"{name}.json"
    result = subprocess.run([sys.executable, *args, *SHAPE, "--json", str(out)], cwd=BENCH,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


def test_two_ddp_ranks_train_like_one_process_on_the_global_batch(tmp_path):
    pytest.importorskip("torch.distributed")
    two = peer(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "pytorch_ddp_peer.py", "--batch", "2"], tmp_path, "ddp")
    one = peer(["pytorch_peer.py", "--batch", "4"], tmp_path, "one")
    assert two["ranks"] == 2 and two["batch_per_rank"] == 2
    assert two["tokens_per_step"] == one["tokens_per_step"] == 4 * 32
    # The loss after one update depends on the first step's averaged gradient.
    assert two["last_loss"] == pytest.approx(one["last_loss"], rel=1e-5)
