"""`layup sample`: the key/value cache decodes the tokens the recomputed window decodes (GPT-2 and
a Llama with grouped K/V heads, a prompt longer than one prefill piece); generation stops at the
model's EOS id (generation_config.json's, a list too) and at --stop; BOS goes before the prompt as
transformers' tokenizer puts it there; a model that does not fit is refused before it is read."""
import json
import os
import subprocess

import pytest
import torch
from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaTokenizerFast,
                          PreTrainedTokenizerFast)

from oracle_util import VOCAB, binary, local_gpt2_encoding, random_hf_model, run, target_env

PROMPT = "It was the best of times, it was the worst of times"


def llama_gqa(path, vocab_size=VOCAB, n_positions=256, **ids):
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=n_positions,
        tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, **ids))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)  # clear leads between greedy candidates
    model.save_pretrained(path)
    return model


def sample(checkpoint, *flags, device=("--device", "cpu")):
    """stdout as bytes (a few random tokens need not end on a UTF-8 boundary), stderr as text."""
    result = subprocess.run([binary("layup"), "sample", "--checkpoint", str(checkpoint), *device,
                             *flags], capture_output=True)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout, result.stderr.decode(errors="replace")


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_the_cache_decodes_what_the_recomputed_window_decodes(tmp_path, family):
    """Greedy, past a prompt of more than one prefill piece (128 tokens): the same text. Sampled
    (top-k 40) with the same seed: the same text too, the logits agreeing to float rounding (the
    recomputed window's 50k-wide logits of every position make these runs the slow ones)."""
    if family == "gpt2":
        random_hf_model(tmp_path / "model", n_positions=256)
    else:
        llama_gqa(tmp_path / "model")
    prompt = " ".join([PROMPT] * 13)  # ~160 tokens
    assert 128 < len(local_gpt2_encoding().encode(prompt)) < 200
    sampled = [["--top-k", "40", "--temperature", "1", "--seed", "7"]] if family != "gpt2" else []
    for flags in [["--top-k", "1"], *sampled]:
        common = ["--prompt", prompt, "--tokens", "16", "--ignore-eos", *flags]
        cached, cached_log = sample(tmp_path / "model", *common)
        recomputed, recomputed_log = sample(tmp_path / "model", *common, "--no-kv-cache")
        assert cached == recomputed
        assert len(cached) > len(prompt) + 8
        assert "key/value cache" in cached_log and "recomputed" in recomputed_log
        assert "decode: 15 tokens in" in cached_log and "tokens/s" in cached_log


@pytest.mark.parametrize("dtype, tokens", [("fp32", "16"), ("bf16", "4")])
def test_cuda_decodes_what_the_cpu_decodes(tmp_path, dtype, tokens):
    """On the GPU (skipped without one), with the cache and without: the CPU's greedy text, in
    fp32, and in bf16 over the first few tokens (the head's leads are far above bf16's rounding
    there)."""
    target_env("cuda", dtype)
    llama_gqa(tmp_path / "model")
    common = ["--prompt", " ".join([PROMPT] * 13), "--tokens", tokens, "--top-k", "1",
              "--ignore-eos"]
    expected, _ = sample(tmp_path / "model", *common)
    for flags in ([], ["--no-kv-cache"]):
        out, log = sample(tmp_path / "model", *common, *flags,
                          device=("--device", "cuda", "--dtype", dtype))
        assert out == expected
        assert f"cuda in {dtype}" in log


def test_the_cache_stops_at_the_models_context(tmp_path):
    random_hf_model(tmp_path / "model", n_positions=32)
    _, log = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "100", "--ignore-eos")
    assert "the key/value cache cannot slide" in log
    # 13 prompt tokens and 19 new ones fed back fill the 32 positions; the 20th needs none.
    assert "decode: 19 tokens" in log


def greedy_ids(model, prompt_ids, count):
    ids = torch.tensor([prompt_ids])
    return model.generate(ids, max_new_tokens=count, do_sample=False, eos_token_id=None,
                          pad_token_id=0, min_new_tokens=count)[0].tolist()[len(prompt_ids):]


def test_generation_stops_at_an_eos_id_of_generation_config(tmp_path):
    """eos_token_id as a list: the first of its ids greedy decoding reaches ends the text, and is
    not printed."""
    model = llama_gqa(tmp_path / "model")
    encoding = local_gpt2_encoding()
    prompt_ids = encoding.encode(PROMPT)
    continuation = greedy_ids(model.eval(), prompt_ids, 12)
    stop_at = next(i for i in range(3, 12) if continuation[i] not in continuation[:i])
    config = tmp_path / "model" / "generation_config.json"
    config.write_text(json.dumps({"eos_token_id": [VOCAB - 1, continuation[stop_at]]}))
    out, log = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "12", "--top-k", "1")
    assert out == encoding.decode_bytes(prompt_ids + continuation[:stop_at]) + b"\n"
    assert "stopped: end-of-sequence token" in log
    ignored, _ = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "12", "--top-k", "1",
                        "--ignore-eos")
    assert ignored == encoding.decode_bytes(prompt_ids + continuation) + b"\n"


def test_generation_stops_after_the_token_that_completes_a_stop_text(tmp_path):
    random_hf_model(tmp_path / "model", n_positions=128)
    full, _ = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "30", "--top-k", "1",
                     "--ignore-eos")
    continuation = full[len(PROMPT):-1]
    stop = continuation[10:13]
    out, log = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "30", "--top-k", "1",
                      "--ignore-eos", "--stop", "never there", "--stop", stop)
    text = out[:-1]
    # Whole tokens: the text ends with the token that completed the stop text's first occurrence.
    end = len(PROMPT) + continuation.find(stop) + len(stop)
    assert full.startswith(text) and end <= len(text) < len(full) - 1
    assert "stopped: --stop text" in log


def byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([PROMPT * 20], trainer)
    tokenizer.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    return tokenizer


@pytest.mark.parametrize("style", ["llama3-template", "add-bos-token", "no-bos",
                                   "config-disagrees"])
def test_bos_goes_where_transformers_tokenizer_puts_it(tmp_path, style):
    """Llama 3's post-processor template puts <|begin_of_text|> first; Llama 2's and Mistral's
    tokenizer classes write add_bos_token into theirs; with neither there is none. Where
    tokenizer_config.json says add_bos_token but tokenizer.json's template has no BOS, transformers
    (5.x) follows tokenizer.json, and so does layup. --no-bos leaves it out."""
    pytest.importorskip("tokenizers")
    from tokenizers import processors
    raw = byte_level_tokenizer()
    special = dict(bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    if style == "llama3-template":
        bos_id = raw.token_to_id("<|begin_of_text|>")
        raw.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos_id)])
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, **special)
    else:
        tokenizer = LlamaTokenizerFast(tokenizer_object=raw, add_bos_token=style == "add-bos-token",
                                       add_eos_token=False, legacy=False, **special)
    tokenizer.save_pretrained(tmp_path / "model")
    if style == "config-disagrees":
        config_path = tmp_path / "model" / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["add_bos_token"] = True
        config_path.write_text(json.dumps(config))
    llama_gqa(tmp_path / "model", vocab_size=len(tokenizer), n_positions=64,
              eos_token_id=tokenizer.eos_token_id)
    expected = AutoTokenizer.from_pretrained(tmp_path / "model")(PROMPT).input_ids
    has_bos = style in ("llama3-template", "add-bos-token")
    assert (expected[0] == tokenizer.bos_token_id) == has_bos
    out, _ = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "1", "--ignore-eos")
    assert out.startswith(tokenizer.decode(expected).encode())
    assert out.startswith(b"<|begin_of_text|>") == has_bos
    plain, _ = sample(tmp_path / "model", "--prompt", PROMPT, "--tokens", "1", "--no-bos")
    assert plain.startswith(PROMPT.encode())


def test_a_model_that_does_not_fit_is_refused_before_it_is_read(tmp_path):
    random_hf_model(tmp_path / "model", n_positions=32)
    root = tmp_path / "machine"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 1000000 kB\nMemAvailable: 530000 kB\n")
    (root / "proc" / "self" / "cgroup").write_text("0::/\n")
    result = run([binary("layup"), "sample", "--checkpoint", tmp_path / "model", "--tokens", "4"],
                 check=False, env={**os.environ, "LAYUP_SYSTEM_ROOT": str(root)})
    assert result.returncode == 1, result.stderr
    assert "layup sample needs" in result.stderr and "of host memory" in result.stderr
    assert "weights" in result.stderr and "key/value cache" in result.stderr
    assert result.stdout == ""


def test_prompt_ids_are_the_prompt_as_given(tmp_path):
    """--prompt-ids (a benchmark's way to give two engines the same ids) continues those ids as
    --prompt continues the text that spells them; with --chat it is refused."""
    random_hf_model(tmp_path / "model", n_positions=32)
    ids = local_gpt2_encoding().encode(PROMPT)
    flags = ["--tokens", "4", "--top-k", "1", "--ignore-eos"]
    from_text, _ = sample(tmp_path / "model", "--prompt", PROMPT, *flags)
    from_ids, _ = sample(tmp_path / "model", "--prompt-ids", ",".join(map(str, ids)), *flags)
    assert from_ids == from_text
    refused = run([binary("layup"), "sample", "--checkpoint", tmp_path / "model", "--prompt-ids",
                   "1,2", "--chat"], check=False)
    assert refused.returncode == 1 and "--prompt-ids" in refused.stderr


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")


def test_chat_renders_the_template_and_prints_the_reply(tmp_path):
    """--chat: the prompt as one user message through the model's chat template, tokenized as
    apply_chat_template(add_generation_prompt=True) tokenizes it; greedy, the reply is the one
    transformers generates from those ids."""
    pytest.importorskip("tokenizers")
    raw = byte_level_tokenizer()
    raw.add_special_tokens(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|begin_of_text|>",
                                        eos_token="<|eot_id|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "model")
    model = llama_gqa(tmp_path / "model", vocab_size=len(tokenizer), n_positions=64,
                      eos_token_id=tokenizer.eos_token_id).eval()
    messages = [{"role": "user", "content": "It was the best of times"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.eos_token_id) == 1
    reply = greedy_ids(model, ids, 6)
    out, _ = sample(tmp_path / "model", "--chat", "--prompt", messages[0]["content"], "--tokens",
                    "6", "--top-k", "1", "--ignore-eos")
    # transformers spells bytes that are not UTF-8 as U+FFFD; layup prints them as they are.
    assert out.decode(errors="replace") == tokenizer.decode(reply) + "\n"
