"""Tests for `bertforge.tokenization.wordpiece`: Google's greedy longest-match-first segmentation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.tokenization.wordpiece import WordPiece

VOCAB = {token: index for index, token in enumerate(
    ["[UNK]", "un", "##aff", "##able", "a", "ab", "abc", "##a", "##b", "##c", "##bc", "b", "c", "##abc"]
)}  # fmt: skip


def google_wordpiece(word: str, vocab: dict[str, int], cap: int) -> list[int]:
    """Reference: Google's WordpieceTokenizer.tokenize for a single word, without the length shortcut."""
    if len(word) > cap:
        return [vocab["[UNK]"]]
    out = []
    start = 0
    while start < len(word):
        end = len(word)
        found = None
        while start < end:
            piece = ("##" if start > 0 else "") + word[start:end]
            if piece in vocab:
                found = vocab[piece]
                break
            end -= 1
        if found is None:
            return [vocab["[UNK]"]]
        out.append(found)
        start = end
    return out


def test_wordpiece_greedy_longest_match_with_spans():
    wordpiece = WordPiece(VOCAB, unk_id=0)
    assert wordpiece.tokenize("unaffable") == [(1, 0, 2), (2, 2, 5), (3, 5, 9)]
    assert wordpiece.tokenize("abcabc") == [(6, 0, 3), (13, 3, 6)]
    assert wordpiece.tokenize("abd") == [(0, 0, 3)]


def test_wordpiece_cap_counts_characters():
    wordpiece = WordPiece(VOCAB, unk_id=0, max_input_chars_per_word=4)
    assert wordpiece.tokenize("abab") == [(5, 0, 2), (7, 2, 3), (8, 3, 4)]
    assert wordpiece.tokenize("ababa") == [(0, 0, 5)]


def test_wordpiece_without_continuations_only_whole_words():
    wordpiece = WordPiece({"[UNK]": 0, "ab": 1}, unk_id=0)
    assert wordpiece.tokenize("ab") == [(1, 0, 2)]
    assert wordpiece.tokenize("abab") == [(0, 0, 4)]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(word=st.text(alphabet="abcunfle", min_size=1, max_size=14), cap=st.integers(1, 16))
def test_wordpiece_equals_google_reference(word, cap):
    wordpiece = WordPiece(VOCAB, unk_id=0, max_input_chars_per_word=cap)
    pieces = wordpiece.tokenize(word)
    assert [index for index, _, _ in pieces] == google_wordpiece(word, VOCAB, cap)
    if pieces[0][0] != 0:
        assert "".join(word[start:end] for _, start, end in pieces) == word
