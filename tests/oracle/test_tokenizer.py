"""layup's GPT-2 tokenizer against tiktoken, built from the checked-in gpt2.tiktoken (no network).

The C++ side runs through layup_encode_tool, which encodes a file's bytes into little-endian int32
ids, and with --decode turns ids back into bytes. Compared: the whole corpus (with both tokenizer
file forms), hand-picked hard strings, bytes that are not UTF-8, and long random mixtures of all
of these.
"""

import random
import subprocess

import numpy as np
import pytest

try:
    import regex
    import tiktoken
except ImportError as error:
    raise ImportError(
        f"the tokenizer oracle needs tiktoken and regex: pip install tiktoken regex ({error})"
    ) from error

from oracle_util import EOT_TOKEN, GPT2_PATTERN, local_gpt2_encoding


HARD_STRINGS = [
    "",
    "hello world! Shakespeare's sonnets",
    # emoji, including ZWJ sequences, skin tones and variation selectors
    "👋",
    "👨‍👩‍👧‍👦 and 👩🏽‍💻",
    "🏳️‍🌈 flag, I ❤️ NY",
    "emoji👍🏿at the end👍",
    # CJK, Korean, Arabic, Hebrew, Devanagari
    "你好，世界！这是中文。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다",
    "مرحبا بالعالم، العربية ١٢٣",
    "שלום עולם",
    "नमस्ते दुनिया",
    # contractions in several cases, and apostrophes that are not contractions
    "they're they'RE THEY'RE They'Re",
    "don't DON'T Don'T I'll I'LL we'd've",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "it’s the dog’s ‘quoted’",
    "''' ' 'x 'sss",
    # runs of spaces, tabs and newlines, leading and trailing
    "a  b   c    d",
    "   leading spaces",
    "trailing spaces   ",
    " ",
    "\n",
    "\n\n\n",
    "line1\n\n\nline2\n",
    "\tindent\n\t\tdeeper\n",
    "windows\r\nline\r\n\r\nends",
    "mixed \t\n \t\n text",
    "  \n  \n  ",
    # digits mixed with letters
    "abc123def456",
    "3.14159 1,000,000 -42 +7",
    "x2 y3z 42nd 1st 2023-01-01",
    "0x1F600 007 1e-9",
    # accents and combining marks
    "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve",
    "Z\u0351\u0352a\u0353l\u0354g\u0355o",
    # the end-of-text marker is plain text for encode_ordinary
    "<|endoftext|>",
    "text<|endoftext|>more",
    " <|endoftext|> ",
    # white space that is not a space, and what \s does not match
    "a\u3000b\u00a0c\u2028d\u0085e",
    "a\x1cb\x1dc\x1ed\x1f",
    "zero\u200bwidth\ufeffmark",
    # controls, symbols, mathematical letters, number forms
    "\x00\x01\x7f nul",
    "€100 £5 ¥3 © ® ™",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
    "Ⅻ² ½ ①②",
    # long runs: one long piece each
    "a" * 3000,
    " " * 3000 + "x",
    "ab" * 1500,
    "!?" * 1000,
]

NOT_UTF8 = [
    b"\xff",
    b"abc\xffdef",
    b" \xfe\xff ",
    b"\xc0\xaf overlong slash",
    b"\xe2\x82 truncated euro",
    b"\xe2\x82 \xe2\x82\xac",
    b"\xed\xa0\x80 encoded surrogate",
    b"\xf4\x90\x80\x80 above U+10FFFF",
    b"\x80\x80\x80 lone continuations",
    b"word\xc3",
    b"caf\xc3\xa9 \xc3(",
    b"they\xff're",
    b"\xf0\x9f\x98 truncated emoji",
    b"  \xff  x",
    b"\n\xff\n",
    b"12\xff34",
]

# Pieces for random mixtures: every class, every kind of boundary, multi-byte characters.
FRAGMENTS = [
    "the", " the", "The", "THE", "word", " quick", "x", "'s", "'t", "'re", "'ve", "'m", "'ll",
    "'d", "'", "'S", "’", " ", "  ", "\t", "\n", "\r\n", "\n\n", "\u3000", "\u00a0", "0", "12",
    " 345", "3.14", ",", ".", "!", " ?", "--", "(", ")", '"', "é", "e\u0301", "ß", "你", "好",
    " 世界", "テ", "한", "ب", "١", "Ⅻ", "²", "👋", "🏽", "\u200d", "👩", "❤️", "<|endoftext|>",
    "\x00", "\x1c", "_", "#", "@user", "https://example.com/a?b=c",
]
NOT_UTF8_FRAGMENTS = [b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f"]


@pytest.fixture(scope="session")
def tokenizer_dir(data_dir):
    return data_dir / "gpt2-tokenizer"


@pytest.fixture(scope="session")
def reference():
    return local_gpt2_encoding()


class EncodeTool:
    """Runs layup_encode_tool on bytes and ids kept in a scratch directory."""

    def __init__(self, path, scratch, tokenizer):
        self.path, self.scratch, self.tokenizer = path, scratch, tokenizer

    def _run(self, flags, data, tokenizer):
        source, result = self.scratch / "input", self.scratch / "output"
        source.write_bytes(data)
        tokenizer = str(tokenizer or self.tokenizer)
        command = [str(self.path), *flags, tokenizer, str(source), str(result)]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed ({finished.returncode}): {finished.stderr}")
        return result.read_bytes()

    def encode(self, data, tokenizer=None):
        return np.frombuffer(self._run([], data, tokenizer), dtype="<i4").tolist()

    def decode(self, ids, tokenizer=None):
        return self._run(["--decode"], np.asarray(ids, dtype="<i4").tobytes(), tokenizer)


@pytest.fixture(scope="session")
def tool(build_dir, tokenizer_dir, tmp_path_factory):
    path = build_dir / "layup_encode_tool"
    if not path.is_file():
        pytest.fail(
            f"{path} does not exist; build it with: "
            f"cmake --build {build_dir} --target layup_encode_tool"
        )
    return EncodeTool(path, tmp_path_factory.mktemp("encode_tool"), tokenizer_dir)


def reference_ids_of_bytes(reference, data):
    """GPT-2's ids for any bytes, valid UTF-8 or not.

    tiktoken takes only str. Bytes that are not UTF-8 could reach it only as lone surrogates
    (errors="surrogateescape"), and encode_ordinary replaces those with U+FFFD before encoding, so
    its ids would be those of "\ufffd", not of the bytes. So this does tiktoken's two steps by hand:
    split the surrogate-escaped text with the GPT-2 pattern (the `regex` module, as GPT-2's own
    encoder.py did; each bad byte is one lone surrogate, a code point of class "other"), and BPE
    each piece's original bytes with tiktoken's _encode_single_piece.
    """
    text = data.decode("utf-8", errors="surrogateescape")
    ids = []
    for piece in regex.findall(GPT2_PATTERN, text):
        ids.extend(reference._encode_single_piece(piece.encode("utf-8", errors="surrogateescape")))
    return ids


def assert_same_ids(actual, expected, reference, what):
    if actual == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), None)
    if first is None:
        first = min(len(actual), len(expected))
    context = expected[max(0, first - 3) : first + 5]
    pytest.fail(
        f"{what}: {len(actual)} ids from layup, {len(expected)} from the reference; first "
        f"difference at index {first}: layup {actual[first:first + 5]}, reference "
        f"{expected[first:first + 5]} (reference text there: {reference.decode_bytes(context)!r})"
    )


def random_mixture(seed, fragments, count):
    rng = random.Random(seed)
    return type(fragments[0])().join(rng.choice(fragments) for _ in range(count))


@pytest.mark.parametrize("form", ["gpt2.tiktoken", "encoder.json+vocab.bpe"])
@pytest.mark.parametrize("name", ["austen.txt", "kjv.txt"])
def test_corpus_matches_tiktoken(tool, reference, data_dir, tokenizer_dir, name, form):
    data = (data_dir / "corpus" / name).read_bytes()
    tokenizer = tokenizer_dir / "gpt2.tiktoken"
    if form == "encoder.json+vocab.bpe":
        tokenizer = f"{tokenizer_dir / 'encoder.json'},{tokenizer_dir / 'vocab.bpe'}"
    ids = tool.encode(data, tokenizer)
    assert_same_ids(ids, reference.encode_ordinary(data.decode("utf-8")), reference, name)
    assert tool.decode(ids, tokenizer) == data


def test_check_string(tool, reference):
    # Pins the reference too: a reference built wrong cannot then agree with a wrong layup.
    text = "hello world! Shakespeare's sonnets"
    expected = [31373, 995, 0, 22197, 338, 3367, 45938]
    assert reference.encode_ordinary(text) == expected
    assert tool.encode(text.encode("utf-8")) == expected


@pytest.mark.parametrize("text", HARD_STRINGS, ids=range(len(HARD_STRINGS)))
def test_hard_string_matches_tiktoken(tool, reference, text):
    data = text.encode("utf-8")
    expected = reference.encode_ordinary(text)
    # The by-hand reference used for invalid UTF-8 must agree with tiktoken where both apply.
    assert reference_ids_of_bytes(reference, data) == expected
    ids = tool.encode(data)
    assert_same_ids(ids, expected, reference, repr(text[:40]))
    assert tool.decode(ids) == data


@pytest.mark.parametrize("data", NOT_UTF8, ids=range(len(NOT_UTF8)))
def test_invalid_utf8_matches_reference(tool, reference, data):
    ids = tool.encode(data)
    assert_same_ids(ids, reference_ids_of_bytes(reference, data), reference, repr(data))
    assert tool.decode(ids) == data


def test_random_text_matches_tiktoken(tool, reference):
    text = random_mixture(1, FRAGMENTS, 40000)
    data = text.encode("utf-8")
    ids = tool.encode(data)
    assert_same_ids(ids, reference.encode_ordinary(text), reference, "random text")
    assert tool.decode(ids) == data


def test_random_bytes_match_reference(tool, reference):
    fragments = [fragment.encode("utf-8") for fragment in FRAGMENTS] + NOT_UTF8_FRAGMENTS
    data = random_mixture(2, fragments, 40000)
    ids = tool.encode(data)
    assert_same_ids(ids, reference_ids_of_bytes(reference, data), reference, "random bytes")
    assert tool.decode(ids) == data


def test_decode_of_end_of_text(tool):
    assert tool.decode([31373, EOT_TOKEN, 995]) == b"hello<|endoftext|> world"
