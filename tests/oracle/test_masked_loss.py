"""The masked loss of instruction fine-tuning against transformers: a window whose prompt targets
are not learned (layup's target -1, transformers' label -100) gives the same loss (the mean over
the learned targets), logits and every gradient, on a tiny GPT-2 and a tiny Llama; a window with
nothing learned gives loss 0 and no gradient. Then `layup train` on token shards with flags files
beside them: examples packed into windows, prompts and the targets between examples not learned,
the step's and the validation loss equal transformers' on the same windows."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from oracle_util import (TINY_RUN, TINY_TRAINING, VOCAB, binary, random_hf_model, read_log,
                         relative_error, run, target_env)

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


def write_flagged_shard(path, tokens, flags):
    """A uint16 token shard as `layup tokenize` writes it, and its flags file beside it."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())
    header[:3] = [20261205, 1, len(tokens)]
    path.with_suffix(".flags").write_bytes(header.tobytes() + bytes(flags))


def examples_shard(path, examples, rng):
    """A shard of random examples, each (length, prompt): the first `prompt` tokens not learned,
    the first token beginning the example. Returns the tokens and their flags."""
    tokens, flags = [], []
    for length, prompt in examples:
        tokens += rng.integers(0, VOCAB, size=length).tolist()
        flags += [(2 if i == 0 else 0) | (1 if i >= prompt else 0) for i in range(length)]
    write_flagged_shard(path, tokens, flags)
    return tokens, flags


def packed_batch(tokens, flags, windows, T):
    """The inputs and labels (-100 where not learned) of windows (start, length) as layup packs
    them: padding after the window's tokens, a target learned where its flag says so and it
    begins no example."""
    inputs = torch.zeros(len(windows), T, dtype=torch.long)
    labels = torch.full((len(windows), T), -100, dtype=torch.long)
    for w, (start, length) in enumerate(windows):
        for t in range(min(length, T)):
            inputs[w, t] = tokens[start + t]
            if t + 1 < length and flags[start + t + 1] == 1:
                labels[w, t] = tokens[start + t + 1]
    return inputs, labels


# The examples (length, prompt) of each split, and the windows (start, length) they make at
# T = 16 (windows of 17 tokens). Packed: (10, 4) + (6, 2) fill one window of 16 tokens; (12, 5)
# does not fit after them, and with (5, 1) fills the second exactly; in validation (9, 9), all
# prompt, packs after (7, 3). One example per window (--no-packing): each its own window, the
# all-prompt one left out.
TRAIN = [(10, 4), (6, 2), (12, 5), (5, 1)]
PACKINGS = {
    "packed": dict(flags=[], batch=2, val=[(7, 3), (9, 9), (17, 6)],
                   train_windows=[(0, 16), (16, 17)], val_windows=[(0, 16), (16, 17)]),
    "one-per-window": dict(flags=["--no-packing"], batch=4,
                           val=[(7, 3), (9, 9), (17, 6), (5, 1), (6, 2)],
                           train_windows=[(0, 10), (10, 6), (16, 12), (28, 5)],
                           val_windows=[(0, 7), (16, 17), (33, 5), (38, 6)]),
}


@pytest.mark.parametrize("packing", sorted(PACKINGS))
def test_train_on_flagged_shards_learns_the_completions_only(tmp_path, packing):
    """One batch holds every training window, in whatever order the shuffle draws them: the
    step's loss is the mean over their learned targets. A learning rate too small to move a
    weight leaves every validation loss on the start's weights."""
    T, case = 16, PACKINGS[packing]
    model = random_hf_model(tmp_path / "model")
    rng = np.random.default_rng(5)
    data = tmp_path / "data"
    data.mkdir()
    train = examples_shard(data / "train_000000.bin", TRAIN, rng)
    val = examples_shard(data / "val_000000.bin", case["val"], rng)
    run([binary("layup"), "train", "--init-from", tmp_path / "model", "--data", data, "--steps",
         "1", "--lr", "1e-30", "--min-lr", "1e-30", "--warmup", "0", "--batch", case["batch"],
         "--seq-len", T, "--eval-every", "1", "--eval-batches", "1", "--sample-tokens", "0",
         "--no-checkpoints", "--out", tmp_path / "run", *case["flags"]])
    log = read_log(tmp_path / "run")
    [step] = [entry for entry in log if "loss" in entry]
    evaluations = [entry["val_loss"] for entry in log if "val_loss" in entry]
    assert evaluations

    def expected_loss(shard, windows):
        inputs, labels = packed_batch(*shard, windows, T)
        with torch.no_grad():
            logits = model(inputs).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))

    assert relative_error(step["loss"], expected_loss(train, case["train_windows"])) < 1e-5
    for val_loss in evaluations:
        assert relative_error(val_loss, expected_loss(val, case["val_windows"])) < 1e-5


def test_train_refuses_flags_that_learn_nothing(tmp_path):
    random_hf_model(tmp_path / "model")
    rng = np.random.default_rng(6)
    data = tmp_path / "data"
    data.mkdir()
    examples_shard(data / "train_000000.bin", [(10, 10), (8, 8)], rng)
    examples_shard(data / "val_000000.bin", [(10, 3)], rng)
    result = run([binary("layup"), "train", "--init-from", tmp_path / "model", "--data", data,
                  "--steps", "1", "--batch", "1", "--seq-len", "16", "--sample-tokens", "0",
                  "--no-checkpoints", "--out", tmp_path / "run"], check=False)
    assert result.returncode == 1
    assert "the training data's flags learn no target in its 2 examples" in result.stderr


def test_resume_on_instruction_data_is_bitwise_a_straight_run(tmp_path):
    """The shuffled order of packed windows continues from the checkpoint: 4 steps straight equal
    2, stop, resume, 2 (bit for bit), into the second pass over the windows (about 10, of 4 per
    batch), with examples longer than a window. Resuming with the other packing is refused: it
    would change the run."""
    rng = np.random.default_rng(7)
    data = tmp_path / "data"
    data.mkdir()
    lengths = rng.integers(3, 45, size=12)
    examples = [(int(n), int(rng.integers(1, n))) for n in lengths]
    examples_shard(data / "train_000000.bin", examples, rng)
    examples_shard(data / "val_000000.bin", examples, rng)
    common = [binary("layup"), "train", *TINY_RUN, "--steps", "4", "--data", data]
    run([*common, "--out", tmp_path / "straight"])
    run([*common, "--until-step", "2", "--out", tmp_path / "split"])
    resume = [binary("layup"), "train", "--resume", tmp_path / "split", "--steps", "4",
              *TINY_TRAINING, "--data", data]
    refused = run([*resume, "--no-packing"], check=False)
    assert refused.returncode == 1 and "cannot resume" in refused.stderr
    assert "--no-packing" in refused.stderr
    run(resume)
    for name in ["model.safetensors", "training_state.safetensors"]:
        straight = (tmp_path / "straight" / "step-00000004" / name).read_bytes()
        split = (tmp_path / "split" / "step-00000004" / name).read_bytes()
        assert straight == split, f"{name} differs after resume"

    def losses(run_dir):
        return [(r["step"], r["loss"]) for r in read_log(run_dir) if "loss" in r]

    assert losses(tmp_path / "straight") == losses(tmp_path / "split")
    assert len(losses(tmp_path / "straight")) == 4
