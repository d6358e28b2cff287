"""layup's tokenizer.json BPE against Hugging Face's tokenizers, on byte-level BPEs trained here.

Each tokenizer is trained with the `tokenizers` library on the shipped corpus (no network), saved
as tokenizer.json, and then both sides encode the same text; the ids must be identical. The C++
side runs through layup_hf_encode_tool (bytes in, little-endian int32 ids out; --decode back), and
`layup tokenize --tokenizer` for the token shards. Kinds of tokenizer:
  - llama3: a Split with Llama 3's pattern, then ByteLevel without its own regex; ignore_merges;
    <|begin_of_text|> added by a TemplateProcessing post-processor; special tokens and one added
    token that is not special;
  - llama3-shuffled: the same file with its merged tokens' ids shuffled, so that a merge's rank
    (its line) is no longer its token's id;
  - gpt2: ByteLevel with GPT-2's regex, merges saved as "a b" strings (the older serialisation);
  - qwen2: Qwen2's split pattern (single digits) and its NFC normalizer; nfkc: GPT-2's ByteLevel
    with an NFKC normalizer;
  - big: llama3 with 70,000 reserved special tokens, so <|begin_of_text|> gets an id above 65,535
    and `layup tokenize` writes uint32 shards.
Special tokens: layup's default (text is text) is compared with tokenizers' encode_special_tokens
= True, and layup's recognize_special_tokens with tokenizers' default.
"""

import json
import random
import subprocess

import numpy as np
import pytest

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import normalizers, processors, trainers
except ImportError as error:
    raise ImportError(
        f"the tokenizer.json oracle needs Hugging Face's tokenizers: pip install tokenizers ({error})"
    ) from error

from test_tokenizer import FRAGMENTS, HARD_STRINGS

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
NOT_SPECIAL = "<tool_call>"
VOCAB_SIZE = 3000
RESERVED = 70000

MORE_STRINGS = [
    # special and added tokens amid text, adjacent, repeated, cut short
    "<|begin_of_text|>Hello<|end_of_text|>",
    "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_start|><|im_start|>b <|im_end|>c",
    "<|im_start <|im_end|x <|im_|>",
    "call <tool_call>{\"x\": 1}<tool_call>",
    "<tool_call><|im_start|><tool_call>",
    # digit runs (Llama 3 cuts them in threes), \r\n, white space of every kind
    "1 12 123 1234 12345 123456 1234567 3.14159265358979",
    "٣٤٥٦٧ ¹²³⁴ 一二三 ①②③④",
    "line\r\nline\r\n\r\n\r\nend\r\n",
    "tabs\t\t\tand\u000bvertical\u000cfeed\u0085nel\u2028ls\u2029ps",
    "a\u180eb\u200bc\ufeffd\u3000e",
    # emoji sequences, CJK, combining marks, scripts without spaces
    "👨‍👩‍👧‍👦👍🏽🏳️‍🌈 👋🏿x",
    "東京は日本の首都です。中文、한국어、ภาษาไทย",
    "Z\u0351\u0352a\u0353l\u0354g\u0355o e\u0301\u0301\u0301",
    # contractions in odd cases, and the long s and Kelvin sign that case folding reaches
    "IT'S THEY'LL we'D You'Re don'T 'ſ 'K",
]


def train(tmp_path, name, pre_tokenizer, *, ignore_merges, template, corpus, reserved=0,
          specials=SPECIALS, normalizer=None):
    # Reserved tokens first, so that with many of them the named ones get large ids.
    special = [f"<|reserved_special_token_{i}|>" for i in range(reserved)] + specials
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([str(path) for path in corpus], trainer)
    tokenizer.add_tokens([AddedToken(NOT_SPECIAL, special=False)])
    tokenizer.add_special_tokens(special)
    if template:
        bos = tokenizer.token_to_id("<|begin_of_text|>")
        tokenizer.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
                ),
            ]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    folder = tmp_path / name
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def shuffled_ids(path, seed):
    """The tokenizer at `path` with its merged tokens' ids shuffled (bytes and added tokens keep
    theirs): the same tokenizer, but with ranks that are not ids."""
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    merged = sorted((token for token in vocab if vocab[token] >= 256), key=vocab.get)
    ids = [vocab[token] for token in merged]
    random.Random(seed).shuffle(ids)
    vocab.update(zip(merged, ids))
    out = path.parent.parent / "llama3-shuffled"
    out.mkdir()
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out / "tokenizer.json"


def as_string_merges(path):
    data = json.loads(path.read_text())
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def corpus(data_dir):
    files = sorted((data_dir / "corpus").glob("*.txt"))
    assert files, f"no corpus text files in {data_dir / 'corpus'}"
    return files


@pytest.fixture(scope="module")
def corpus_slices(corpus, tmp_path_factory):
    """The corpus files' first megabyte each, cut at a line end: prose, verse, numbers and
    punctuation of both books, encoded in a quarter of the whole files' time (the tokenizers are
    still trained on the whole files)."""
    folder = tmp_path_factory.mktemp("corpus_slices")
    slices = []
    for path in corpus:
        data = path.read_bytes()[: 1 << 20]
        (folder / path.name).write_bytes(data[: data.rfind(b"\n") + 1])
        slices.append(folder / path.name)
    return slices


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("hf_tokenizers")
    llama3_steps = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    llama3 = train(tmp, "llama3", llama3_steps, ignore_merges=True, template=True, corpus=corpus)
    gpt2 = train(
        tmp,
        "gpt2",
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ignore_merges=False,
        template=False,
        corpus=corpus,
    )
    big = train(
        tmp, "big", llama3_steps, ignore_merges=True, template=True, reserved=RESERVED,
        corpus=corpus,
    )
    qwen2 = train(
        tmp,
        "qwen2",
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
        ignore_merges=False,
        template=False,
        corpus=corpus,
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        normalizer=normalizers.NFC(),
    )
    nfkc = train(
        tmp,
        "nfkc",
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ignore_merges=False,
        template=False,
        corpus=corpus,
        normalizer=normalizers.NFKC(),
    )
    return {
        "llama3": llama3,
        "llama3-shuffled": shuffled_ids(llama3, seed=3),
        "gpt2": as_string_merges(gpt2),
        "qwen2": qwen2,
        "nfkc": nfkc,
        "big": big,
    }


class HfEncodeTool:
    """Runs layup_hf_encode_tool on bytes and ids kept in a scratch directory."""

    def __init__(self, path, scratch):
        self.path, self.scratch = path, scratch

    def _run(self, tokenizer, flags, data):
        source, result = self.scratch / "input", self.scratch / "output"
        source.write_bytes(data)
        command = [str(self.path), *flags, str(tokenizer), str(source), str(result)]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({finished.returncode}): {finished.stderr}")
        return result.read_bytes()

    def encode(self, tokenizer, data, special=False, template=False):
        flags = (["--special"] if special else []) + (["--template"] if template else [])
        return np.frombuffer(self._run(tokenizer, flags, data), dtype="<i4").tolist()

    def decode(self, tokenizer, ids):
        return self._run(tokenizer, ["--decode"], np.asarray(ids, dtype="<i4").tobytes())


@pytest.fixture(scope="module")
def tool(build_dir, tmp_path_factory):
    path = build_dir / "layup_hf_encode_tool"
    if not path.is_file():
        pytest.fail(
            f"{path} does not exist; build it with: "
            f"cmake --build {build_dir} --target layup_hf_encode_tool"
        )
    return HfEncodeTool(path, tmp_path_factory.mktemp("hf_encode_tool"))


def reference_ids(path, text, special=False, template=False):
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = not special
    return tokenizer.encode(text, add_special_tokens=template).ids


def assert_same_ids(actual, expected, what):
    if actual == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), None)
    if first is None:
        first = min(len(actual), len(expected))
    pytest.fail(
        f"{what}: {len(actual)} ids from layup, {len(expected)} from tokenizers; first "
        f"difference at index {first}: layup {actual[first:first + 5]}, tokenizers "
        f"{expected[first:first + 5]}"
    )


KINDS = ["llama3", "llama3-shuffled", "gpt2", "qwen2", "nfkc"]
NORMALIZED = {"qwen2", "nfkc"}  # these decode to the normalized text


def assert_decodes(tool, tokenizer_files, kind, ids, data):
    decoded = tool.decode(tokenizer_files[kind], ids)
    reference = Tokenizer.from_file(str(tokenizer_files[kind]))
    assert decoded == reference.decode(ids, skip_special_tokens=False).encode("utf-8")
    if kind not in NORMALIZED:
        assert decoded == data


def test_shuffled_ids_change_the_ids_not_the_text(tokenizer_files):
    text = "It is a truth universally acknowledged"
    plain = reference_ids(tokenizer_files["llama3"], text)
    shuffled = reference_ids(tokenizer_files["llama3-shuffled"], text)
    assert plain != shuffled
    decode = Tokenizer.from_file(str(tokenizer_files["llama3-shuffled"])).decode
    assert decode(shuffled) == text


@pytest.mark.parametrize("kind", KINDS)
def test_corpus_matches_tokenizers(tool, tokenizer_files, corpus_slices, kind):
    for path in corpus_slices:
        data = path.read_bytes()
        ids = tool.encode(tokenizer_files[kind], data)
        assert_same_ids(ids, reference_ids(tokenizer_files[kind], data.decode("utf-8")), path.name)
        assert_decodes(tool, tokenizer_files, kind, ids, data)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("special", [False, True], ids=["text-is-text", "special-recognised"])
def test_hard_strings_match_tokenizers(tool, tokenizer_files, kind, special):
    path = tokenizer_files[kind]
    for text in HARD_STRINGS + MORE_STRINGS:
        data = text.encode("utf-8")
        ids = tool.encode(path, data, special=special)
        assert_same_ids(ids, reference_ids(path, text, special=special), repr(text[:40]))
        assert_decodes(tool, tokenizer_files, kind, ids, data)


@pytest.mark.parametrize("kind", KINDS)
def test_random_text_matches_tokenizers(tool, tokenizer_files, kind):
    rng = random.Random(5)
    fragments = FRAGMENTS + SPECIALS + [NOT_SPECIAL, "<|endoftext|>", "\u180e", "\u0085", "ſ"]
    fragments += ["K", "'K", "e\u0301", "\u0301", "Å", "ﬁ", "①", "Ⅻ", "\u1100\u1161", "ｶ"]
    text = "".join(rng.choice(fragments) for _ in range(40000))
    path = tokenizer_files[kind]
    for special in (False, True):
        ids = tool.encode(path, text.encode("utf-8"), special=special)
        assert_same_ids(ids, reference_ids(path, text, special=special), f"special={special}")


def test_template_adds_begin_of_text(tool, tokenizer_files):
    path = tokenizer_files["llama3"]
    text = "<|im_start|>Hello world"
    for special in (False, True):
        ids = tool.encode(path, text.encode("utf-8"), special=special, template=True)
        expected = reference_ids(path, text, special=special, template=True)
        assert expected[0] == Tokenizer.from_file(str(path)).token_to_id("<|begin_of_text|>")
        assert_same_ids(ids, expected, f"special={special}")


def test_tokenize_command_writes_uint32_shards(build_dir, tokenizer_files, corpus_slices,
                                               tmp_path):
    """`layup tokenize --tokenizer DIR`: each file is <|begin_of_text|> and its text's ids, the
    last 5% for validation; with <|begin_of_text|> above 65,535 the shards hold uint32 ids."""
    path = tokenizer_files["big"]
    reference = Tokenizer.from_file(str(path))
    bos = reference.token_to_id("<|begin_of_text|>")
    assert bos > 65535
    out = tmp_path / "shards"
    command = [str(build_dir / "layup"), "tokenize", *map(str, corpus_slices), "--out", str(out),
               "--tokenizer", str(path.parent), "--val-fraction", "0.05"]
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr

    reference.encode_special_tokens = True
    train, val = [], []
    for file in corpus_slices:
        ids = [bos] + reference.encode(file.read_text(encoding="utf-8"),
                                       add_special_tokens=False).ids
        val_count = int(len(ids) * 0.05)
        train += ids[: len(ids) - val_count]
        val += ids[len(ids) - val_count :]
    for name, expected in (("train_000000.bin", train), ("val_000000.bin", val)):
        data = (out / name).read_bytes()
        header = np.frombuffer(data[:1024], dtype="<i4")
        assert header[:3].tolist() == [20240801, 7, len(expected)]
        assert not header[3:].any()
        assert_same_ids(np.frombuffer(data[1024:], dtype="<u4").tolist(), expected, name)


def test_tokenize_command_keeps_uint16_for_small_vocabularies(build_dir, tokenizer_files, tmp_path):
    path = tokenizer_files["gpt2"]
    text = tmp_path / "doc.txt"
    text.write_text("Some text with <|end_of_text|> inside it. " * 40)
    out = tmp_path / "shards"
    command = [str(build_dir / "layup"), "tokenize", str(text), "--out", str(out),
               "--tokenizer", str(path)]
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    reference = Tokenizer.from_file(str(path))
    reference.encode_special_tokens = True
    expected = [reference.token_to_id("<|end_of_text|>")]
    expected += reference.encode(text.read_text(), add_special_tokens=False).ids
    data = (out / "train_000000.bin").read_bytes() + (out / "val_000000.bin").read_bytes()[1024:]
    assert np.frombuffer(data[:1024], dtype="<i4")[:2].tolist() == [20240520, 1]
    assert np.frombuffer(data[1024:], dtype="<u2").tolist() == expected


def test_unsupported_file_is_refused(tool, tokenizer_files, tmp_path):
    data = json.loads(tokenizer_files["gpt2"].read_text())
    data["normalizer"] = {"type": "Lowercase"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    finished = subprocess.run(
        [str(tool.path), str(path), str(path), str(tmp_path / "out")], capture_output=True, text=True
    )
    assert finished.returncode == 1
    assert f"{path}: normalizer.type is \"Lowercase\"; layup implements the normalizers" in (
        finished.stderr
    )
