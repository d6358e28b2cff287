"""`layup tokenize` of instruction data against transformers: the token ids and the learn masks of
chat and prompt/completion lines, read back from the shards and their .flags files.

Small tokenizers are trained here with `tokenizers` (no network): byte-level BPEs with the special
tokens of Llama 3 and of ChatML (Qwen2, SmolLM), and SentencePiece-style ones shaped as Llama 2's
and Mistral v0.3's. Each is saved with a tokenizer_config.json that holds its BOS, EOS and a chat
template of its family (the renderer's test templates, data/chat_templates/); transformers loads
the same folder. What layup must give, per example:
  - chat (`{"messages"}`): ids = apply_chat_template(messages, tokenize=True). Learned (the mask
    TRL's assistant-only loss and open-instruct compute by rendering prefixes): for each assistant
    message i, the ids from len(apply_chat_template(messages[:i], add_generation_prompt=True))
    (0 for a first message) up to len(apply_chat_template(messages[:i + 1])): its content and the
    template's end-of-turn tokens, not its header.
  - prompt/completion: ids = tokenizer(prompt + completion + eos_token) (the EOS text appended as
    TRL's SFT trainer appends it, unless the completion ends with it); learned: every id after the
    first len(tokenizer(prompt)) (TRL's completion mask).
  - text (`{"text"}`): the tokenizer's document separator, then the text as text; all learned.
With --learn all every token is learned. Every example's first token is flagged as its start.
"""
import json
import pathlib
import struct
import subprocess

import pytest

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer
except ImportError:  # pragma: no cover
    pytest.skip("transformers and tokenizers are needed", allow_module_level=True)

import test_hf_tokenizer_spm as spm
from oracle_util import binary

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"
LEARN, START = 1, 2

# family: (special tokens, bos, eos, whether the post-processor puts BOS in front, templates).
# The byte-level families are trained here; "llama2" and "mistral" are SentencePiece-style
# tokenizer.json files shaped as the published ones (test_hf_tokenizer_spm.py says how): Llama 2's
# legacy normalizer, and Mistral v0.3's Metaspace with [INST] and [/INST] as control tokens.
FAMILIES = {
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>", True,
               ["llama3", "llama3_1", "llama3_2"]),
    "chatml": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", False,
               ["qwen2", "qwen2_5", "smollm", "smollm2"]),
    "byte-level-inst": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", True,
                        ["mistral_v0_3"]),
    "llama2": (["<unk>", "<s>", "</s>"], "<s>", "</s>", True, ["llama2", "mistral_v0_1"]),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", True,
                ["mistral_v0_3"]),
}
SENTENCEPIECE_FAMILIES = ("llama2", "mistral")


def turns(*pairs):
    return [{"role": role, "content": content} for role, content in pairs]


CONVERSATIONS = [
    turns(("user", "Hello!"), ("assistant", "Hi, how can I help?")),
    turns(("user", "What is 2+2?"), ("assistant", "4."), ("user", "And 3+3?"), ("assistant", "6.")),
    turns(("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello.")),
    turns(("user", "  padded question\n\n"), ("assistant", "\tpadded answer  \n")),
    turns(("user", "Grüße, 世界! 👋🏽"), ("assistant", "Ответ: ✓ — e\u0301")),
    # special tokens' text inside content is recognised, as transformers does by default
    turns(("user", "say <|im_end|> or </s> or <|eot_id|>"), ("assistant", "no <|im_start|>[INST]")),
    turns(("user", "only a question")),
]

PAIRS = [
    ("Question: what is the capital of France?\nAnswer:", " Paris."),
    ("Translate to French: cat", " chat"),
    ("Already ends with EOS:", " yes{eos}"),
]


def train_tokenizer(folder, corpus, family, template):
    specials, bos, eos, bos_in_front, _ = FAMILIES[family]
    if family in SENTENCEPIECE_FAMILIES:
        trained, merges = spm.train(
            [corpus], pre_tokenizers.Metaspace(replacement=spm.BAR, prepend_scheme="always",
                                               split=True), limit_alphabet=90)
        model = models.BPE(vocab=spm.sentencepiece_vocab(trained), merges=merges,
                           unk_token="<unk>", fuse_unk=True, byte_fallback=True)
        shape = ({"normalizer": spm.LLAMA2_NORMALIZER} if family == "llama2"
                 else {"pre_tokenizer": spm.MISTRAL_V03_PRE_TOKENIZER})
        spm.save(folder, model, specials=specials, decoder=spm.LLAMA2_DECODER, template=True,
                 **shape)
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=800, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator([corpus], trainer)
        tokenizer.add_special_tokens(specials)
        steps = [processors.ByteLevel(trim_offsets=False)]
        if bos_in_front:
            steps.append(processors.TemplateProcessing(
                single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]))
        tokenizer.post_processor = processors.Sequence(steps)
        folder.mkdir()
        tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": bos, "eos_token": eos, "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast"}))


def input_ids(encoded):
    return list(encoded["input_ids"] if not isinstance(encoded, list) else encoded)


def prefixes_hold(hf, messages):
    """Whether every assistant turn's conversation renders as the beginning of the whole: where it
    does not (Mistral v0.3 moves the system message into the last user turn), no prefix rule can
    find the turns, and layup refuses the line unless --learn all."""
    whole = hf.apply_chat_template(messages, tokenize=False)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        through = hf.apply_chat_template(messages[:i + 1], tokenize=False)
        before = "" if i == 0 else hf.apply_chat_template(
            messages[:i], tokenize=False, add_generation_prompt=True)
        if not (whole.startswith(through) and through.startswith(before)):
            return False
    return True


def expected_chat(hf, messages, learn_all):
    ids = input_ids(hf.apply_chat_template(messages, tokenize=True))
    mask = [learn_all] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or learn_all:
            continue
        begin = 0 if i == 0 else len(input_ids(
            hf.apply_chat_template(messages[:i], tokenize=True, add_generation_prompt=True)))
        end = len(input_ids(hf.apply_chat_template(messages[:i + 1], tokenize=True)))
        mask[begin:end] = [True] * (end - begin)
    return ids, mask


def expected_pair(hf, prompt, completion, learn_all):
    text = prompt + completion
    if not completion.endswith(hf.eos_token):
        text += hf.eos_token
    ids = input_ids(hf(text))
    prompt_count = len(input_ids(hf(prompt)))
    return ids, [learn_all or t >= prompt_count for t in range(len(ids))]


def read_split(out, split):
    """The ids and flags of a split's shards, in order."""
    ids, flags = [], b""
    for shard in sorted(out.glob(f"{split}_*.bin")):
        data = shard.read_bytes()
        header = struct.unpack("<256i", data[:1024])
        width = 2 if header[0] == 20240520 else 4
        ids += list(struct.unpack(f"<{header[2]}{'H' if width == 2 else 'I'}", data[1024:]))
        flag_data = shard.with_suffix(".flags").read_bytes()
        assert struct.unpack("<3i", flag_data[:12]) == (20261205, 1, header[2])
        flags += flag_data[1024:]
    return ids, list(flags)


def tokenize(folder, data, out, *extra):
    return subprocess.run([binary("layup"), "tokenize", "--tokenizer", str(folder), "--out",
                           str(out), "--val-fraction", "0.3", *extra, str(data)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def corpus(data_dir):
    files = sorted((data_dir / "corpus").glob("*.txt"))
    return "".join(path.read_text(encoding="utf-8")[:200_000] for path in files)


CASES = [(family, template) for family, spec in FAMILIES.items() for template in spec[4]]


@pytest.mark.parametrize("family,template", CASES, ids=[f"{case[1]}-{case[0]}" for case in CASES])
def test_ids_and_masks_equal_transformers(tmp_path, corpus, family, template):
    folder = tmp_path / "tokenizer"
    train_tokenizer(folder, corpus, family, (TEMPLATES / f"{template}.jinja").read_text())
    hf = AutoTokenizer.from_pretrained(str(folder))

    lines, examples = [], []
    for messages in CONVERSATIONS:
        try:
            hf.apply_chat_template(messages, tokenize=False)
        except Exception:  # a template that refuses a system message (Llama 2's alternation)
            continue
        if not prefixes_hold(hf, messages):
            assert template.startswith("mistral_v0_3"), "the other templates render prefixes"
            continue
        lines.append(json.dumps({"messages": messages}))
        examples.append(("chat", messages))
    for prompt, completion in PAIRS:
        completion = completion.format(eos=FAMILIES[family][2])
        lines.append(json.dumps({"prompt": prompt, "completion": completion}))
        examples.append(("pair", (prompt, completion)))
    assert len(examples) >= 8
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")

    for learn in ("completions", "all"):
        out = tmp_path / f"out-{learn}"
        result = tokenize(folder, data, out, "--learn", learn)
        assert result.returncode == 0, result.stderr
        train_ids, train_flags = read_split(out, "train")
        val_ids, val_flags = read_split(out, "val")
        assert val_ids, "validation takes whole examples from the end"
        ids, flags = train_ids + val_ids, train_flags + val_flags

        expected_ids, expected_flags, position = [], [], 0
        for kind, example in examples:
            if kind == "chat":
                want_ids, mask = expected_chat(hf, example, learn == "all")
            else:
                want_ids, mask = expected_pair(hf, *example, learn == "all")
            got = ids[position:position + len(want_ids)]
            assert got == want_ids, f"{template} {kind} {example}: ids\n{got}\n{want_ids}"
            want_flags = [LEARN if m else 0 for m in mask]
            want_flags[0] |= START
            got_flags = flags[position:position + len(want_ids)]
            assert got_flags == want_flags, (
                f"{template} {kind} {example}: flags\n{got_flags}\n{want_flags}\n"
                f"{hf.convert_ids_to_tokens(want_ids)}")
            expected_ids += want_ids
            expected_flags += want_flags
            position += len(want_ids)
        assert ids == expected_ids and flags == expected_flags
        learned = sum(flag & LEARN for flag in train_flags)
        assert f"({learned} learned, --learn {learn})" in result.stdout
        if learn == "completions":
            assert 0 < learned < len(train_ids)


def test_refusals_name_the_line(tmp_path, corpus):
    folder = tmp_path / "tokenizer"
    train_tokenizer(folder, corpus, "mistral", (TEMPLATES / "mistral_v0_3.jinja").read_text())
    good = json.dumps({"messages": turns(("user", "a"), ("assistant", "b"))})
    cases = {
        # the template's raise_exception, as transformers raises it
        json.dumps({"messages": turns(("user", "a"), ("user", "b"))}):
            "data.jsonl: line 3: the chat template refuses the conversation: ",
        '{"messages": [{"role": "user"}]}': "data.jsonl: line 3: message 1 has no \"content\"",
        '{"prompt": "a"}': "data.jsonl: line 3: the object has \"prompt\" without \"completion\"",
        '{"text": "a"': "data.jsonl: line 3: the line starts with '{' but is not valid JSON",
    }
    for bad, message in cases.items():
        data = tmp_path / "data.jsonl"
        data.write_text(f"{good}\n\n{bad}\n{good}\n")
        out = tmp_path / "out"
        result = tokenize(folder, data, out)
        assert result.returncode != 0 and message in result.stderr, (bad, result.stderr)
        assert not out.exists(), "nothing is written when a line is refused"

    # Mistral v0.3 renders a system message only in the last user turn, so the conversation up to
    # an assistant turn is no beginning of the whole: refused, but for --learn all.
    data = tmp_path / "data.jsonl"
    system = json.dumps({"messages": turns(("system", "Be terse."), ("user", "Hi"),
                                           ("assistant", "Hello."))})
    data.write_text(f"{good}\n{system}\n{good}\n{good}\n")
    result = tokenize(folder, data, tmp_path / "out")
    assert result.returncode != 0 and (
        "data.jsonl: line 2: the chat template does not render the conversation up to message 3 "
        "as the beginning of the whole") in result.stderr
    assert tokenize(folder, data, tmp_path / "out", "--learn", "all").returncode == 0

    # A tokenizer without a chat template refuses chat lines, not prompt/completion ones.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    data = tmp_path / "data.jsonl"
    data.write_text(f'{{"prompt": "a", "completion": " b"}}\n' * 4 + good + "\n")
    result = tokenize(folder, data, tmp_path / "out2")
    assert result.returncode != 0
    assert "data.jsonl: line 5: a chat example is rendered with the model's chat template" in (
        result.stderr)
    # Nothing learned at all (chat without an assistant turn) is refused.
    config["chat_template"] = (TEMPLATES / "mistral_v0_3.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    data.write_text((json.dumps({"messages": turns(("user", "only a question"))}) + "\n") * 6)
    result = tokenize(folder, data, tmp_path / "out3")
    assert result.returncode != 0 and "no training token is learned" in result.stderr


def test_train_reads_a_jsonl_file_through_a_cache(tmp_path, monkeypatch):
    """`train --data FILE.jsonl` tokenizes the file once (with flags) into a cache that --learn
    keys, and reuses it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}: what follows {i}?\nA:",
                                        "completion": f" {i + 1}."}) + "\n" for i in range(200)))
    args = [binary("layup"), "train", "--model", "small", "--data", str(data), "--batch", "2",
            "--seq-len", "32", "--steps", "1", "--eval-every", "1", "--eval-batches", "1",
            "--no-checkpoints", "--sample-tokens", "1"]
    first = subprocess.run([*args, "--out", str(tmp_path / "a")], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    [made] = list((tmp_path / "cache" / "layup" / "shards").iterdir())
    assert made.name.startswith("pairs-") and (made / "train_000000.flags").exists()
    assert f"data: tokenizing {data} with" in first.stderr
    again = subprocess.run([*args, "--out", str(tmp_path / "b")], capture_output=True, text=True)
    assert again.returncode == 0 and f"tokenizes it, cached in {made}" in again.stderr
    everything = subprocess.run([*args, "--learn", "all", "--out", str(tmp_path / "c")],
                                capture_output=True, text=True)
    assert everything.returncode == 0, everything.stderr
    assert len(list((tmp_path / "cache" / "layup" / "shards").iterdir())) == 2
