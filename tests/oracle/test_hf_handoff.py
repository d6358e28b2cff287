"""A checkpoint of `layup train --init-from` is a Hugging Face folder a user can hand on: transformers'
AutoTokenizer and AutoModelForCausalLM load it as it is (the source's tokenizer files, its special
token ids, generation_config.json), its weights are in the dtype the source came in (or
--save-dtype's), and `layup sample --checkpoint` uses the tokenizer it carries."""
import json
import subprocess

import pytest
import torch
from safetensors import safe_open
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast)

from oracle_util import binary, relative_error, run, target_env

tokenizers = pytest.importorskip("tokenizers")

VOCAB_SIZE = 320
B, T = 2, 16
TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was "
        "the age of foolishness. ") * 40


def tiny_tokenizer(folder):
    """A byte-level BPE of VOCAB_SIZE ids with Llama 3's special tokens, saved as transformers
    saves a fast tokenizer: tokenizer.json, tokenizer_config.json (and special_tokens_map.json
    before transformers 5)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([TEXT], trainer)
    tokenizer.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                   eos_token="<|end_of_text|>")
    fast.save_pretrained(folder)
    return fast


def tiny_llama(folder, tokenizer, dtype):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.to(dtype).save_pretrained(folder)


def weights_dtypes(folder):
    with safe_open(folder / "model.safetensors", "pt") as weights:
        return {weights.get_slice(name).get_dtype() for name in weights.keys()}


@pytest.mark.parametrize("source_dtype,flags,saved_dtype", [
    (torch.bfloat16, [], "BF16"),                      # the source's dtype, by default
    (torch.float32, [], "F32"),
    (torch.float32, ["--save-dtype", "bf16"], "BF16"),
])
def test_checkpoint_loads_in_transformers_with_its_tokenizer(tmp_path, source_dtype, flags,
                                                             saved_dtype):
    env = target_env("cpu", "fp32")
    source = tmp_path / "model"
    tokenizer = tiny_tokenizer(source)
    tiny_llama(source, tokenizer, source_dtype)
    (tmp_path / "text.txt").write_text(TEXT)
    run([binary("layup"), "tokenize", "--tokenizer", source, "--out", tmp_path / "shards",
         tmp_path / "text.txt"])
    run([binary("layup"), "train", "--init-from", source, "--data", tmp_path / "shards",
         "--steps", "2", "--batch", "2", "--seq-len", "16", "--eval-every", "0",
         "--sample-tokens", "0", "--out", tmp_path / "run", *flags])
    checkpoint = tmp_path / "run" / "step-00000002"

    # The tokenizer as it was: the same files, the same ids, the same special tokens.
    # (transformers 5 writes no special_tokens_map.json; copied where it exists.)
    names = [name for name in ("tokenizer.json", "tokenizer_config.json",
                               "special_tokens_map.json") if (source / name).exists()]
    assert names[:2] == ["tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (checkpoint / name).read_bytes() == (source / name).read_bytes(), name
    loaded = AutoTokenizer.from_pretrained(checkpoint)
    assert loaded("It was the age of wisdom")["input_ids"] == \
        tokenizer("It was the age of wisdom")["input_ids"]
    assert (loaded.bos_token_id, loaded.eos_token_id) == \
        (tokenizer.bos_token_id, tokenizer.eos_token_id)
    config = json.loads((checkpoint / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == \
        (tokenizer.bos_token_id, tokenizer.eos_token_id)
    generation = GenerationConfig.from_pretrained(checkpoint)
    assert (generation.bos_token_id, generation.eos_token_id) == \
        (tokenizer.bos_token_id, tokenizer.eos_token_id)

    # The weights in the dtype asked, said so in config.json, and the run's state beside them.
    assert weights_dtypes(checkpoint) == {saved_dtype}
    assert config["torch_dtype"] == ("bfloat16" if saved_dtype == "BF16" else "float32")
    assert (checkpoint / "master_weights.safetensors").is_file() == (saved_dtype == "BF16")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype="auto").eval()
    assert model.dtype == (torch.bfloat16 if saved_dtype == "BF16" else torch.float32)

    # A forward of the saved weights in fp32 gives the logits layup's forward gives.
    model = model.float()
    ids = torch.tensor(tokenizer(TEXT[:400])["input_ids"][:B * (T + 1)]).reshape(B, T + 1)
    ids = ids.to(torch.int32)
    with open(tmp_path / "tokens.bin", "wb") as f:
        f.write(ids[:, :-1].contiguous().numpy().tobytes())
        f.write(ids[:, 1:].contiguous().numpy().tobytes())
    run([binary("layup_model_tool"), "grads", checkpoint, tmp_path / "tokens.bin", B, T,
         tmp_path / "out"], env=env)
    with safe_open(tmp_path / "out" / "outputs.safetensors", "pt") as outputs:
        layup_logits = outputs.get_tensor("logits")
    with torch.no_grad():
        expected = model(ids[:, :-1].long()).logits
    assert relative_error(layup_logits, expected) < 1e-5

    # `layup sample` spells the prompt with the checkpoint's tokenizer (GPT-2's ids would be
    # outside this model's 320).
    # Bytes: four random tokens need not end on a UTF-8 boundary.
    sample = subprocess.run([binary("layup"), "sample", "--checkpoint", str(tmp_path / "run"),
                             "--prompt", "It was the", "--tokens", "4", "--top-k", "1"],
                            capture_output=True, check=True)
    assert sample.stdout.startswith(b"It was the")
