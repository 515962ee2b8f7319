"""Splitting text into words the way Google's BasicTokenizer does, keeping character offsets.

Google's order is: clean the text, put spaces around CJK ideographs, split on whitespace, normalise each
whitespace-separated token (lower-case, strip accents), then split it on punctuation. This module owns the
two splits:

* `PreTokenizer.find_chunks` cuts the raw text into *chunks*: runs of characters between separators, with
  every CJK ideograph a chunk of its own. A chunk is exactly one of Google's whitespace tokens before
  cleaning (characters that cleaning deletes stay inside the chunk, because deleting them joins their
  neighbours). Chunks are what the tokenizer caches on.
* `PreTokenizer.split_chunk` normalises one chunk and splits it on punctuation into *words*, the units that
  WordPiece sees and that `word_ids` count; each word carries the source span of every character.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from bertforge.tokenization.normalizer import (
    ASCII_PUNCTUATION,
    CJK_RANGES,
    Normalizer,
    is_cjk,
    is_punctuation,
    is_removed,
    separator_characters,
)

# In a control-free, separator-free ASCII chunk every character is a letter, a digit or punctuation, so
# these matches are exactly its punctuation-split words, and they tile the chunk.
ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[" + re.escape(ASCII_PUNCTUATION) + "]")


def is_plain_ascii(chunk: str) -> bool:
    """Whether a chunk is ASCII without characters that cleaning deletes (the fast path applies).

    A chunk holds no separators, so for ASCII "printable" means exactly "no control characters".
    """
    return chunk.isascii() and chunk.isprintable()


def _typographic_punctuation() -> str:
    """The characters among common typographic punctuation (curly quotes, dashes, ellipsis, guillemets,
    inverted marks, bullets, primes) that behave exactly as ASCII punctuation in Google's algorithm, checked
    with the normaliser's own rules: kept by cleaning, not a separator, unchanged by lower-casing, NFD and
    accent stripping, not a CJK ideograph, and punctuation (so each is a word of its own)."""
    candidates = ("\u00a1\u00ab\u00b7\u00bb\u00bf\u2010\u2011\u2012\u2013\u2014\u2015\u2018\u2019\u201a"
                  "\u201b\u201c\u201d\u201e\u201f\u2022\u2026\u2032\u2033\u2039\u203a")
    separators = separator_characters()
    return "".join(char for char in candidates
                   if is_punctuation(char) and not is_removed(char) and char not in separators
                   and char.lower() == char and unicodedata.normalize("NFD", char) == char
                   and unicodedata.category(char) != "Mn" and not is_cjk(ord(char)))


TYPOGRAPHIC_PUNCTUATION = _typographic_punctuation()
# Each typographic mark as an ASCII stand-in, so `str.isascii` (C code) can test a whole chunk.
_AS_ASCII = str.maketrans(dict.fromkeys(TYPOGRAPHIC_PUNCTUATION, "'"))
# In a `is_simple` chunk these matches are its punctuation-split words, and they tile it (as ASCII_WORD).
SIMPLE_WORD = re.compile(r"[A-Za-z0-9]+|[" + re.escape(ASCII_PUNCTUATION + TYPOGRAPHIC_PUNCTUATION) + "]")


def is_simple(chunk: str) -> bool:
    """Whether a chunk is plain ASCII (`is_plain_ascii`) save for `TYPOGRAPHIC_PUNCTUATION`: English prose's
    “quoted” and don’t chunks. Normalisation leaves such a chunk as it is (ASCII lower-casing aside) and its
    words are the `SIMPLE_WORD` matches, so the tokenizer takes its fast path on them."""
    return chunk.isprintable() and (chunk.isascii() or chunk.translate(_AS_ASCII).isascii())


# Chunks whose words `words` remembers before forgetting them all (bounded memory on large corpora).
MEMO_LIMIT = 500_000


def _char_class(chars: str) -> str:
    return "".join(f"\\U{ord(char):08x}" for char in chars)


def _cjk_class() -> str:
    return "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in CJK_RANGES)


@lru_cache(maxsize=2)
def chunk_pattern(tokenize_chinese_chars: bool) -> re.Pattern[str]:
    """The regular expression whose matches are the chunks of a text (see the module docstring)."""
    separators = _char_class(separator_characters())
    if not tokenize_chinese_chars:
        return re.compile(f"[^{separators}]+")
    cjk = _cjk_class()
    return re.compile(f"[{cjk}]|[^{separators}{cjk}]+")


@lru_cache(maxsize=65536)
def _punctuation(char: str) -> bool:
    return is_punctuation(char)


class Word:
    """One punctuation-split word of a chunk, normalised, with the chunk span of each character.

    Attributes:
        text: the normalised word (what WordPiece sees).
        starts: for each character of `text`, the index in the chunk of the character it came from.
        ends: for each character, the chunk index just past its source character and any characters
            right after it that normalisation deleted (a decomposed accent belongs to its letter).
    """

    __slots__ = ("text", "starts", "ends")

    def __init__(self, text: str, starts: list[int] | range, ends: list[int] | range):
        self.text = text
        self.starts = starts
        self.ends = ends

    def span(self, begin: int, end: int) -> tuple[int, int]:
        """Chunk span covered by characters ``text[begin:end]`` (canonical reordering may shuffle marks)."""
        return min(self.starts[begin:end]), max(self.ends[begin:end])


class PreTokenizer:
    """Chunking and punctuation splitting for one normalisation setting.

    Args:
        normalizer: lower-casing and accent-stripping rules.
        tokenize_chinese_chars: make every CJK ideograph its own word (Google's default since Nov 2018).
    """

    def __init__(self, normalizer: Normalizer, tokenize_chinese_chars: bool = True):
        self.normalizer = normalizer
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.chunk_re = chunk_pattern(tokenize_chinese_chars)
        self._chunk_words: dict[str, tuple[str, ...]] = {}

    def find_chunks(self, text: str) -> list[tuple[str, int]]:
        """The chunks of `text` with their start offsets."""
        return [(match.group(), match.start()) for match in self.chunk_re.finditer(text)]

    def split_chunk(self, chunk: str) -> list[Word]:
        """Normalise one chunk and split it on punctuation.

        Args:
            chunk: a match of `chunk_re` (no separators; possibly characters that cleaning deletes).

        Returns:
            The words, in order; empty when normalisation leaves nothing (a chunk of control characters).
        """
        if is_plain_ascii(chunk):
            # Fast path: ASCII lower-casing is one character to one, accents do not exist.
            text = chunk.lower() if self.normalizer.do_lower_case else chunk
            return [
                Word(
                    match.group(),
                    range(match.start(), match.end()),
                    range(match.start() + 1, match.end() + 1),
                )
                for match in ASCII_WORD.finditer(text)
            ]
        text, sources = self.normalizer.normalize_word(chunk)
        if not text:
            return []
        ends = _extended_ends(sources, len(chunk))
        words = []
        begin = 0
        for index, char in enumerate(text):
            if _punctuation(char):
                if begin < index:
                    words.append(Word(text[begin:index], sources[begin:index], ends[begin:index]))
                words.append(Word(char, sources[index : index + 1], ends[index : index + 1]))
                begin = index + 1
        if begin < len(text):
            words.append(Word(text[begin:], sources[begin:], ends[begin:]))
        return words

    def words(self, text: str) -> list[str]:
        """The normalised punctuation-split words of `text`, without offsets (memoised per chunk).

        This is what a vocabulary is trained on, so vocabulary and tokenizer see the same words.
        """
        memo = self._chunk_words
        out: list[str] = []
        for chunk in self.chunk_re.findall(text):
            found = memo.get(chunk)
            if found is None:
                if len(memo) >= MEMO_LIMIT:
                    memo.clear()
                found = memo[chunk] = tuple(word.text for word in self.split_chunk(chunk))
            out += found
        return out

    def pre_tokenize(self, text: str) -> list[tuple[str, int, int]]:
        """Google's basic tokenization of a whole text, with offsets.

        Returns:
            ``(word, start, end)`` for every punctuation-split word: the normalised word and its character
            span in `text`.
        """
        out = []
        for chunk, base in self.find_chunks(text):
            for word in self.split_chunk(chunk):
                start, end = word.span(0, len(word.text))
                out.append((word.text, base + start, base + end))
        return out


def _extended_ends(sources: list[int], length: int) -> list[int]:
    """For each output character, the end of its source character extended over deleted followers.

    Args:
        sources: source index of each output character.
        length: length of the source chunk.

    Returns:
        One end per output character: the next source index that produced output (or `length`).
    """
    kept = sorted(set(sources))
    next_kept = {index: following for index, following in zip(kept, kept[1:] + [length])}
    return [next_kept[source] for source in sources]
