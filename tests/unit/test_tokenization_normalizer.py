"""Tests for `bertforge.tokenization.normalizer` and `pretokenizer`: Google's character rules, alignment."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.tokenization.normalizer import (
    Normalizer,
    is_cjk,
    is_control,
    is_punctuation,
    is_removed,
    is_whitespace,
    separator_characters,
)
from bertforge.tokenization.pretokenizer import PreTokenizer


def google_normalize_word(word: str, lower: bool, strip: bool) -> str:
    """Reference: Google's cleaning, lower() and _run_strip_accents applied to one whitespace token."""
    text = "".join(char for char in word if not is_removed(char))
    if lower:
        text = text.lower()
    if strip:
        text = "".join(
            char for char in unicodedata.normalize("NFD", text) if unicodedata.category(char) != "Mn"
        )
    return text


def test_normalizer_character_classes_follow_google():
    assert all(is_punctuation(char) for char in "$^`~+<=>|")  # ASCII symbols count as punctuation
    assert is_punctuation("。") and is_punctuation("“") and not is_punctuation("€")
    assert is_whitespace("\u3000") and is_whitespace("\t") and not is_whitespace("\u200b")
    assert is_control("\u200b") and is_control("\x07") and not is_control("\n") and not is_control("\ue000")
    assert is_removed("\x00") and is_removed("\ufffd") and not is_removed(" ")
    assert is_cjk(0x4E00) and is_cjk(0x2B820) and not is_cjk(0x3042)


def test_normalizer_separators_are_what_google_splits_on():
    separators = separator_characters()
    assert {" ", "\t", "\n", "\r", "\xa0", "\u3000", "\u2028", "\u2029"} <= set(separators)
    # Whitespace to Python, but deleted by cleaning before Google splits: they join their neighbours.
    assert not {"\x0b", "\x0c", "\x1c", "\x85"} & set(separators)


@pytest.mark.parametrize(
    ("lower", "strip", "word", "expected", "sources"),
    [
        (True, True, "Café", "cafe", [0, 1, 2, 3]),
        (True, True, "cafe\u0301", "cafe", [0, 1, 2, 3]),
        (True, False, "İx", "i\u0307x", [0, 0, 1]),
        (True, True, "İx", "ix", [0, 1]),
        (True, True, "a\u200bb\x00c", "abc", [0, 2, 4]),
        (True, True, "ΟΔΟΣ", "οδος", [0, 1, 2, 3]),
        (False, False, "Ǆ", "Ǆ", [0]),
    ],
)
def test_normalizer_normalize_word_maps_each_character_to_its_source(lower, strip, word, expected, sources):
    assert Normalizer(lower, strip).normalize_word(word) == (expected, sources)


def test_normalizer_strip_accents_defaults_to_casing():
    assert Normalizer(True, None).strip_accents is True
    assert Normalizer(False, None).strip_accents is False
    assert Normalizer(False, True).strip_accents is True


WORD_CHARS = st.characters(
    codec="utf-8", categories=["L", "M", "N", "Cf", "Cc", "Co", "So"], exclude_characters="\t\n\r"
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(word=st.text(alphabet=WORD_CHARS, max_size=12), lower=st.booleans(), strip=st.booleans())
def test_normalizer_normalize_word_equals_google_and_aligns(word, lower, strip):
    text, sources = Normalizer(lower, strip).normalize_word(word)
    assert text == google_normalize_word(word, lower, strip)
    assert len(sources) == len(text)
    for char, source in zip(text, sources):
        assert 0 <= source < len(word)
        assert not is_removed(word[source])
        # Each output character comes from normalising its source character on its own (sigma aside).
        alone = google_normalize_word(word[source], lower, strip)
        assert char in alone or (char == "ς" and "σ" in alone) or unicodedata.combining(char)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    pieces=st.lists(
        st.sampled_from(["a", "\u0301", "\u0323", "\u0345", "\U0001d165", "\U0001d16d", "e\u0301"]),
        max_size=8,
    )
)
def test_normalizer_canonical_reordering_across_characters(pieces):
    word = "".join(pieces)
    text, sources = Normalizer(False, True).normalize_word(word)
    assert text == google_normalize_word(word, False, True)
    assert len(sources) == len(text)


def test_pretokenizer_splits_on_punctuation_and_cjk_with_offsets():
    pretokenizer = PreTokenizer(Normalizer(True, None))
    text = "Hello, 世界! Don't"
    assert pretokenizer.pre_tokenize(text) == [
        ("hello", 0, 5), (",", 5, 6), ("世", 7, 8), ("界", 8, 9), ("!", 9, 10),
        ("don", 11, 14), ("'", 14, 15), ("t", 15, 16),
    ]  # fmt: skip
    assert pretokenizer.words(text) == [word for word, _, _ in pretokenizer.pre_tokenize(text)]


def test_pretokenizer_chunk_of_only_deleted_characters_gives_no_words():
    pretokenizer = PreTokenizer(Normalizer(True, None))
    assert pretokenizer.pre_tokenize("a \u200b\x00 b") == [("a", 0, 1), ("b", 5, 6)]
    assert pretokenizer.pre_tokenize("\u0301") == []
