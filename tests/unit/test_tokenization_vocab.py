"""Tests for `bertforge.tokenization.vocab`: vocab.txt reading, writing and lookups."""

from __future__ import annotations

import os
import stat

import pytest

from bertforge.errors import DataError
from bertforge.tokenization import Vocab

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##s", "中"]


def test_vocab_load_ids_are_line_numbers(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join(TOKENS).encode("utf-8") + b"\n")
    vocab = Vocab.load(path)
    assert len(vocab) == len(TOKENS)
    assert vocab["the"] == 5 and vocab.token_to_id("中") == 7 and vocab.token_to_id("nope") is None
    assert vocab.id_to_token(6) == "##s" and vocab.unk_id == 1
    assert "##s" in vocab and list(vocab) == TOKENS


def test_vocab_load_accepts_crlf_and_missing_final_newline(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\r\n".join(TOKENS).encode("utf-8"))
    assert Vocab.load(path).tokens == TOKENS


def test_vocab_save_round_trip_is_atomic_and_readable(tmp_path):
    path = tmp_path / "sub" / "vocab.txt"
    Vocab(TOKENS).save(path)
    assert path.read_text(encoding="utf-8") == "".join(token + "\n" for token in TOKENS)
    assert Vocab.load(path) == Vocab(TOKENS)
    assert os.listdir(path.parent) == ["vocab.txt"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the vocabulary file is empty"),
        (b"[UNK]\na\nb\na\n", r"vocab.txt:4: duplicate token 'a' \(first on line 2\)"),
        (b"[UNK]\n\nb\n", r"vocab.txt:2: empty line"),
        (b"a\nb\n", r"vocab.txt: the vocabulary has no unknown token '\[UNK\]'"),
        (b"[UNK]\nok\n\xff\xfe\n", r"vocab.txt:3: the vocabulary file is not valid UTF-8"),
    ],
)
def test_vocab_load_errors_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        Vocab.load(path)


def test_vocab_load_missing_file_and_directory(tmp_path):
    with pytest.raises(DataError, match="vocabulary file not found"):
        Vocab.load(tmp_path / "absent.txt")
    with pytest.raises(DataError, match="is a directory"):
        Vocab.load(tmp_path)


def test_vocab_constructor_validates():
    with pytest.raises(DataError, match="duplicate token 'x'"):
        Vocab(["[UNK]", "x", "x"])
    with pytest.raises(DataError, match="no unknown token"):
        Vocab(["x"])
    with pytest.raises(IndexError, match="outside the vocabulary"):
        Vocab(TOKENS).id_to_token(len(TOKENS))
