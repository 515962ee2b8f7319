"""Greedy longest-match-first WordPiece over a vocabulary (Google's `WordpieceTokenizer`).

A word is cut left to right: at each position take the longest vocabulary entry that matches (spelled with
the ``##`` prefix when it does not start the word). If some position has no match, or the word is longer than
`max_input_chars_per_word` characters, the whole word becomes the unknown token. Google's cap is 200
characters; the Hugging Face port uses 100.
"""

from __future__ import annotations

from collections.abc import Mapping

CONTINUATION_PREFIX = "##"


class WordPiece:
    """WordPiece segmentation of single (already normalised, punctuation-split) words.

    Args:
        vocab: token -> id.
        unk_id: id emitted for a word that cannot be segmented.
        max_input_chars_per_word: words longer than this become `unk_id` (Google: 200).
    """

    def __init__(self, vocab: Mapping[str, int], unk_id: int, max_input_chars_per_word: int = 200):
        self.unk_id = unk_id
        self.max_input_chars_per_word = max_input_chars_per_word
        self._initial = dict(vocab)
        prefix = len(CONTINUATION_PREFIX)
        self._continuation = {
            token[prefix:]: index for token, index in vocab.items() if token.startswith(CONTINUATION_PREFIX)
        }
        # No entry is longer than these, so Google's search from the end of the word may start here instead;
        # the result is the same and long words stop costing quadratic time.
        self._max_initial = max((len(token) for token in self._initial), default=0)
        self._max_continuation = max((len(token) for token in self._continuation), default=0)

    def whole(self, word: str) -> int | None:
        """The id of `word` when it is one vocabulary entry within the length cap: then the greedy longest
        match is the word itself, one piece (`tokenize` gives ``[(id, 0, len(word))]``); else None."""
        if len(word) > self.max_input_chars_per_word:
            return None
        return self._initial.get(word)

    def tokenize(self, word: str) -> list[tuple[int, int, int]]:
        """Segment one word.

        Args:
            word: a normalised word without whitespace or punctuation.

        Returns:
            ``(id, start, end)`` per piece, where ``word[start:end]`` is the piece's text (without ``##``).
            A word that cannot be segmented gives ``[(unk_id, 0, len(word))]``.
        """
        length = len(word)
        if length > self.max_input_chars_per_word:
            return [(self.unk_id, 0, length)]
        pieces = []
        start = 0
        table = self._initial
        longest = self._max_initial
        while start < length:
            end = min(length, start + longest)
            while end > start:
                index = table.get(word[start:end])
                if index is not None:
                    break
                end -= 1
            else:
                return [(self.unk_id, 0, length)]
            pieces.append((index, start, end))
            start = end
            table = self._continuation
            longest = self._max_continuation
        return pieces
