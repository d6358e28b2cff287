"""layup's SentencePiece-style tokenizer.json (Llama 2, Mistral) and SmolLM's Digits pre-tokenizer
against Hugging Face's tokenizers.

Two small BPEs are trained with the `tokenizers` library on the start of the shipped corpus (no
network): one over characters with "▁" for spaces, as SentencePiece's are, one byte-level. Each
kind below is a tokenizer.json built from one of them, with the parts around the model set to
the JSON that the real files hold; both sides then encode and decode the same texts, and the ids
and the decoded text must be identical. The C++ side runs through layup_hf_encode_tool --batch.

Where the shapes come from: the Hub's tokenizer.json of Llama 2 and Mistral are written by
transformers' convert_slow_tokenizer.LlamaConverter. With legacy on (Llama 2, Mistral v0.1) it
writes the normalizer Sequence [Prepend "▁", Replace " " -> "▁"] and no pre-tokenizer; with
legacy off (Mistral v0.3) no normalizer and the pre-tokenizer Metaspace (prepend_scheme "first",
split false). Both: a BPE with byte_fallback, unk_token "<unk>" and fuse_unk; the decoder Sequence
[Replace "▁" -> " ", ByteFallback, Fuse, Strip " " start 1]; the vocabulary <unk> <s> </s>, then
the 256 byte tokens <0x00>..<0xFF>, then the rest; "<s> $A" as the template (LlamaTokenizerFast's
add_bos_token). SpmConverter's default (for models without their own converter) is Metaspace as
both pre-tokenizer and decoder. SmolLM's pre-tokenizer is Sequence [Digits individual_digits,
ByteLevel] (as StarCoder's). The kinds:
  - llama2: the legacy shape, with an added token that is not special (matched after the
    normalizer put its "▁"s in);
  - mistral-v0.3: the non-legacy shape, with the control tokens [INST] and [/INST];
  - metaspace: SpmConverter's Metaspace (always, split) after Digits (runs), the Metaspace
    decoder, ignore_merges, no byte_fallback and unk_token without fuse_unk;
  - partial-bytes: llama2 without some byte tokens, so byte fallback and <unk> mix;
  - no-unk: llama2 with neither byte_fallback nor unk_token: unknown characters are dropped;
  - smollm: a byte-level BPE with SmolLM's pre-tokenizer.
Special tokens: layup's default (text is text) is compared with tokenizers' encode_special_tokens
= True, and layup's recognize_special_tokens with tokenizers' default.
"""

import json
import random
import struct
import subprocess

import numpy as np
import pytest

try:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
except ImportError as error:
    raise ImportError(
        f"the tokenizer.json oracle needs Hugging Face's tokenizers: pip install tokenizers ({error})"
    ) from error

from test_hf_tokenizer import MORE_STRINGS
from test_tokenizer import FRAGMENTS, HARD_STRINGS

BAR = "\u2581"  # ▁
LLAMA2_NORMALIZER = {
    "type": "Sequence",
    "normalizers": [
        {"type": "Prepend", "prepend": BAR},
        {"type": "Replace", "pattern": {"String": " "}, "content": BAR},
    ],
}
MISTRAL_V03_PRE_TOKENIZER = {
    "type": "Metaspace", "replacement": BAR, "prepend_scheme": "first", "split": False,
}
LLAMA2_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "Replace", "pattern": {"String": BAR}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ],
}
METASPACE_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "Metaspace", "replacement": BAR, "prepend_scheme": "always", "split": True},
    ],
}
METASPACE_DECODER = {"type": "Metaspace", "replacement": BAR, "prepend_scheme": "always",
                     "split": True}
SMOLLM_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True}


def bos_template(bos_id):
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [bos_id], "tokens": ["<s>"]}},
    }


NOT_SPECIAL = "<tool_call>"
SPM_STRINGS = [
    # spaces: leading, trailing, runs, alone, and the replacement character itself in the text
    "", " ", "  ", "a", " a", "a ", "  a  b   c  ", "\t x", BAR, BAR + BAR + "a", "a" + BAR + "b",
    " " + BAR + " ", "hello world", " Hello World ",
    # newlines and other white space
    "\n", "a\nb", "\n\n x \n", "\r\n", "x\r\n y", "\u3000a\u00a0b",
    # digit runs in several scripts
    "0", "2024", "1,234,567.89", "x1y22z333 4444", "\u0663\u0664\u0665 \u2460\u2461 \u00b9\u00b2",
    # characters the vocabulary lacks: byte fallback or <unk>
    "\U0001F600", "\U0001F600\U0001F600\U0001F600", "a\U0001F600b", "\u65e5\u672c\u8a9e",
    "\x00\x7f", "\U000E0001 tag", "\u00e9\u00e8\u00ea", "e\u0301", "\U0001F600\u65e5\U0001F600a",
    # special and added tokens in text, where Metaspace's "first" and Prepend differ most
    "<s>", "</s>", "<unk>", "<s><s>", " <s> ", "a<s>b", "<s>hi</s>", "<s> hi</s> ",
    "[INST] hi [/INST]", "[INST][/INST]", " [INST]x", "<tool_call>",
    "call <tool_call>{}<tool_call>", " <tool_call> ", "a<tool_call>",
    # text that looks like byte tokens
    "<0x41>", "<0xZZ>", "<0x41><0x42>",
]
TEXTS = HARD_STRINGS + MORE_STRINGS + SPM_STRINGS
SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<|endoftext|>", "<|im_start|>",
            "<|im_end|>", NOT_SPECIAL]


@pytest.fixture(scope="module")
def corpus_text(data_dir):
    files = sorted((data_dir / "corpus").glob("*.txt"))
    assert files, f"no corpus text files in {data_dir / 'corpus'}"
    # The start of each file: a few hundred KB train and test in well under a second.
    parts = []
    for path in files:
        with open(path, encoding="utf-8") as file:
            parts.append(file.read(80_000))
    return parts


def train(corpus_text, pre_tokenizer, **trainer_options):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False, **trainer_options)
    tokenizer.train_from_iterator(corpus_text, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], [tuple(pair) for pair in model["merges"]]


def sentencepiece_vocab(trained, missing_bytes=()):
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for byte in range(256):
        if byte not in missing_bytes:
            vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token in sorted(trained, key=trained.get):
        vocab.setdefault(token, len(vocab))
    return vocab


def save(folder, model, *, specials, not_special=(), normalizer=None, pre_tokenizer=None,
         decoder=None, template=False):
    """A tokenizer.json: the model and the added tokens as tokenizers writes them, the other parts
    as the JSON given."""
    tokenizer = Tokenizer(model)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in specials])
    tokenizer.add_tokens([AddedToken(token, special=False) for token in not_special])
    data = json.loads(tokenizer.to_str())
    data["normalizer"] = normalizer
    data["pre_tokenizer"] = pre_tokenizer
    data["decoder"] = decoder
    data["post_processor"] = bos_template(tokenizer.token_to_id("<s>")) if template else None
    folder.mkdir()
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory, corpus_text):
    tmp = tmp_path_factory.mktemp("spm_tokenizers")
    # Characters outside the 90 most frequent are not in the vocabulary: byte fallback or <unk>.
    trained, merges = train(
        corpus_text,
        pre_tokenizers.Metaspace(replacement=BAR, prepend_scheme="always", split=True),
        limit_alphabet=90,
    )

    def spm(name, *, byte_fallback=True, unk="<unk>", fuse_unk=True, ignore_merges=False,
            missing_bytes=(), specials=("<unk>", "<s>", "</s>"), **parts):
        model = models.BPE(vocab=sentencepiece_vocab(trained, missing_bytes), merges=merges,
                           unk_token=unk, fuse_unk=fuse_unk, byte_fallback=byte_fallback,
                           ignore_merges=ignore_merges)
        return save(tmp / name, model, specials=list(specials), **parts)

    legacy = {"normalizer": LLAMA2_NORMALIZER, "decoder": LLAMA2_DECODER, "template": True}
    byte_trained, byte_merges = train(
        corpus_text, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False)]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    return {
        "llama2": spm("llama2", not_special=[NOT_SPECIAL], **legacy),
        "mistral-v0.3": spm("mistral-v0.3", specials=("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
                            pre_tokenizer=MISTRAL_V03_PRE_TOKENIZER, decoder=LLAMA2_DECODER,
                            template=True),
        "metaspace": spm("metaspace", byte_fallback=False, fuse_unk=False, ignore_merges=True,
                         pre_tokenizer=METASPACE_PRE_TOKENIZER, decoder=METASPACE_DECODER),
        "partial-bytes": spm("partial-bytes", missing_bytes=(0x80, 0x81, 0x98, 0xA9, 0xF0),
                             **legacy),
        "no-unk": spm("no-unk", byte_fallback=False, unk=None, **legacy),
        "smollm": save(tmp / "smollm", models.BPE(vocab=byte_trained, merges=byte_merges),
                       specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                       pre_tokenizer=SMOLLM_PRE_TOKENIZER, decoder=BYTE_LEVEL_DECODER),
    }


KINDS = ["llama2", "mistral-v0.3", "metaspace", "partial-bytes", "no-unk", "smollm"]


def pack(records):
    return b"".join(struct.pack("<I", len(record) // size) + record for record, size in records)


def unpack(data, size):
    records, position = [], 0
    while position < len(data):
        (count,) = struct.unpack_from("<I", data, position)
        position += 4
        records.append(data[position:position + count * size])
        position += count * size
    return records


class HfEncodeTool:
    """Runs layup_hf_encode_tool --batch: one run per tokenizer and mode."""

    def __init__(self, path, scratch):
        self.path, self.scratch = path, scratch

    def _run(self, tokenizer, flags, data):
        source, result = self.scratch / "input", self.scratch / "output"
        source.write_bytes(data)
        command = [str(self.path), "--batch", *flags, str(tokenizer), str(source), str(result)]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({finished.returncode}): {finished.stderr}")
        return result.read_bytes()

    def encode(self, tokenizer, texts, special=False, template=False):
        flags = (["--special"] if special else []) + (["--template"] if template else [])
        output = self._run(tokenizer, flags, pack([(text, 1) for text in texts]))
        return [np.frombuffer(ids, dtype="<i4").tolist() for ids in unpack(output, 4)]

    def decode(self, tokenizer, id_lists):
        data = pack([(np.asarray(ids, dtype="<i4").tobytes(), 4) for ids in id_lists])
        return unpack(self._run(tokenizer, ["--decode"], data), 1)


@pytest.fixture(scope="module")
def tool(build_dir, tmp_path_factory):
    path = build_dir / "layup_hf_encode_tool"
    if not path.is_file():
        pytest.fail(
            f"{path} does not exist; build it with: "
            f"cmake --build {build_dir} --target layup_hf_encode_tool"
        )
    return HfEncodeTool(path, tmp_path_factory.mktemp("hf_encode_tool"))


def assert_same(actual, expected, texts, what):
    for got, want, text in zip(actual, expected, texts):
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
            pytest.fail(
                f"{what}, text {text[:40]!r}: {len(got)} from layup, {len(want)} from tokenizers; "
                f"first difference at {first}: layup {got[first:first + 5]!r}, tokenizers "
                f"{want[first:first + 5]!r}"
            )
    assert len(actual) == len(expected)


def check(tool, path, texts, special=False, template=False):
    """Encodes `texts` on both sides, then decodes the ids on both sides."""
    reference = Tokenizer.from_file(str(path))
    reference.encode_special_tokens = not special
    expected = [reference.encode(text, add_special_tokens=template).ids for text in texts]
    ids = tool.encode(path, [text.encode("utf-8") for text in texts], special, template)
    what = f"{path.parent.name} special={special} template={template}"
    assert_same(ids, expected, texts, what + ": ids")
    decoded = tool.decode(path, ids)
    expected_text = [reference.decode(each, skip_special_tokens=False).encode("utf-8")
                     for each in ids]
    assert_same(decoded, expected_text, texts, what + ": decoded")


def test_shapes_are_the_published_ones(tokenizer_files):
    """The files hold the JSON above, read back by tokenizers as the types it names."""
    llama2 = json.loads(tokenizer_files["llama2"].read_text(encoding="utf-8"))
    assert llama2["normalizer"] == LLAMA2_NORMALIZER and llama2["pre_tokenizer"] is None
    assert {key: llama2["model"][key] for key in ("unk_token", "fuse_unk", "byte_fallback")} == {
        "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True}
    vocab = llama2["model"]["vocab"]
    assert [vocab[token] for token in ("<unk>", "<s>", "</s>", "<0x00>", "<0xFF>")] == [
        0, 1, 2, 3, 258]
    reference = Tokenizer.from_file(str(tokenizer_files["mistral-v0.3"]))
    assert type(reference.pre_tokenizer).__name__ == "Metaspace"
    assert reference.pre_tokenizer.prepend_scheme == "first" and not reference.pre_tokenizer.split
    # What the kinds are for: they tell apart what they stress.
    text = "<s>hi \U0001F600"
    ids = {kind: Tokenizer.from_file(str(tokenizer_files[kind])).encode(text).ids
           for kind in ("llama2", "mistral-v0.3", "partial-bytes", "no-unk")}
    assert len(set(map(tuple, ids.values()))) == 4, ids


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("special", [False, True], ids=["text-is-text", "special-recognised"])
def test_texts_match_tokenizers(tool, tokenizer_files, kind, special):
    check(tool, tokenizer_files[kind], TEXTS, special=special)


@pytest.mark.parametrize("kind", ["llama2", "mistral-v0.3"])
def test_template_adds_bos(tool, tokenizer_files, kind):
    check(tool, tokenizer_files[kind], ["hello", "<s>hello", " x"], special=True, template=True)


@pytest.mark.parametrize("kind", KINDS)
def test_corpus_and_random_text_match_tokenizers(tool, tokenizer_files, corpus_text, kind):
    rng = random.Random(7)
    fragments = FRAGMENTS + SPECIALS + [BAR, " " + BAR, "\U0001F600", "<0x41>", "1", "23"]
    mixtures = ["".join(rng.choice(fragments) for _ in range(3000)) for _ in range(2)]
    for special in (False, True):
        check(tool, tokenizer_files[kind], corpus_text + mixtures, special=special)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_of_any_ids_matches_tokenizers(tool, tokenizer_files, kind):
    """Ids as no encoding gives them: byte tokens that are not UTF-8, special tokens anywhere."""
    path = tokenizer_files[kind]
    reference = Tokenizer.from_file(str(path))
    size = reference.get_vocab_size()
    rng = random.Random(11)
    byte_ids = [reference.token_to_id(f"<0x{byte:02X}>") for byte in range(256)]
    byte_ids = [each for each in byte_ids if each is not None] or list(range(size))
    id_lists = [[], [0], [1, 1], [2, 0, 1]]
    id_lists += [[rng.choice(byte_ids if rng.random() < 0.5 else range(size))
                  for _ in range(rng.randint(1, 30))] for _ in range(300)]
    decoded = tool.decode(path, id_lists)
    if kind == "smollm":
        # A byte-level model decodes to the tokens' bytes, so that decode(encode(x)) == x for any
        # bytes; tokenizers' ByteLevel decoder replaces bytes that are not UTF-8, as Python's
        # errors="replace" does (one U+FFFD per maximal ill-formed subsequence).
        decoded = [text.decode("utf-8", errors="replace").encode("utf-8") for text in decoded]
    expected = [reference.decode(ids, skip_special_tokens=False).encode("utf-8")
                for ids in id_lists]
    assert_same(decoded, expected, [str(ids) for ids in id_lists], f"{kind}: decoded")


def test_tokenize_command_puts_bos_between_documents(build_dir, tokenizer_files, tmp_path):
    """`layup tokenize --tokenizer` with Llama 2's shape: <s> before each document, then its ids
    with special tokens taken as text."""
    path = tokenizer_files["llama2"]
    text = tmp_path / "doc.txt"
    text.write_text("Some text with <s> and </s> inside, 12 \U0001F600.\n" * 30, encoding="utf-8")
    out = tmp_path / "shards"
    command = [str(build_dir / "layup"), "tokenize", str(text), "--out", str(out),
               "--tokenizer", str(path.parent)]
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    reference = Tokenizer.from_file(str(path))
    reference.encode_special_tokens = True
    expected = reference.encode(text.read_text(encoding="utf-8"), add_special_tokens=True).ids
    assert expected[0] == reference.token_to_id("<s>")
    data = (out / "train_000000.bin").read_bytes() + (out / "val_000000.bin").read_bytes()[1024:]
    assert np.frombuffer(data[1024:], dtype="<u2").tolist() == expected


def test_unsupported_parts_are_refused(tool, tokenizer_files, tmp_path):
    data = json.loads(tokenizer_files["llama2"].read_text(encoding="utf-8"))
    data["normalizer"]["normalizers"].append({"type": "Strip", "strip_left": True,
                                              "strip_right": True})
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    finished = subprocess.run(
        [str(tool.path), str(path), str(path), str(tmp_path / "out")], capture_output=True,
        text=True,
    )
    assert finished.returncode == 1
    expected = f"{path}: normalizer.normalizers[2].type is \"Strip\"; layup implements"
    assert expected in finished.stderr
