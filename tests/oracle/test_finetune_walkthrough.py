"""docs/finetune.md's walkthrough, run as it is written: every ```sh block of the page in order, in
one shell, with layup and the venv's python first on PATH, on the stand-in model its first block
makes. The reply `layup sample --chat` prints must be the one transformers generates from the
checkpoint, and the checkpoint folder must hold what the page lists."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from oracle_util import BUILD_DIR, binary

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "finetune.md"
MARK = "@@walkthrough-block"


def sh_blocks(text):
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_walkthrough_runs_as_written(tmp_path):
    binary("layup")
    blocks = sh_blocks(PAGE.read_text())
    assert len(blocks) == 6, "the walkthrough's sh blocks changed: update this test's checks"
    script = "set -euo pipefail\n" + "".join(
        f"echo {MARK} {i}\n{block}" for i, block in enumerate(blocks))
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
               PATH=os.pathsep.join([str(BUILD_DIR), str(pathlib.Path(sys.executable).parent),
                                     os.environ["PATH"]]))
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"the walkthrough failed:\n{result.stdout}\n{result.stderr}"

    outputs = re.split(rf"^{MARK} \d+\n", result.stdout, flags=re.M)[1:]
    assert len(outputs) == len(blocks)
    tokenize, train, sample, handoff = outputs[2], outputs[3], outputs[4], outputs[5]
    assert "learned, --learn completions" in tokenize
    assert (tmp_path / "shards" / "train_000000.flags").exists()
    assert "instruction data: 9 examples" in result.stdout + result.stderr
    assert (tmp_path / "run" / "step-00000040" / "model.safetensors").exists()
    # layup's greedy reply is transformers' greedy reply from the same checkpoint.
    layup_reply = sample.rstrip("\n")
    transformers_reply = handoff.split("\n")[0]
    assert layup_reply == transformers_reply, (layup_reply, transformers_reply)
    listed = set(handoff.split()[len(transformers_reply.split()):])
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja"} <= listed
