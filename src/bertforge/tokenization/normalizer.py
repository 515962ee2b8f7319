"""Google BERT's character classes and per-word text normalisation, with an alignment map.

This module owns the character-level rules of Google's original `tokenization.py` (BasicTokenizer):

* text cleaning: NUL, U+FFFD and control characters of category ``Cc``/``Cf`` (except tab, newline and
  carriage return) are dropped; whitespace (space, tab, newline, CR and category ``Zs``) becomes a space;
* the CJK ideograph ranges whose characters become single-character words;
* Google's punctuation class (all non-alphanumeric printable ASCII, plus unicode category ``P*``);
* lower-casing followed by accent stripping (NFD, then drop ``Mn``).

Unlike Google's code, `Normalizer.normalize_word` also returns, for every output character, the index of the
input character it came from, so tokens can carry exact character offsets into the original string even when
normalisation changes the length ('İ'.lower() is two characters, NFD splits 'é' into 'e' + U+0301, cleaning
drops zero-width characters).

Two deliberate differences from the Hugging Face "legacy" Python port: it drops every ``C*`` category
(unassigned, private use and surrogates too) and applies NFC before splitting; Google does neither.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

# Google's table of "Chinese characters" (CJK Unified Ideographs and extensions, compatibility ideographs).
# The Rust `tokenizers` library uses 0x2B920 for the start of the sixth block; Google uses 0x2B820.
CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)

# Google counts every printable non-alphanumeric ASCII character as punctuation, although "$", "^", "`" and
# others are symbols (S*) in unicode.
ASCII_PUNCTUATION = "".join(
    chr(cp) for cp in range(128) if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
)

# Every whitespace character (by Google's rule or Python's str.split) lies below U+3001; scanning that range
# once at import keeps the table exact for whatever unicode version this Python carries.
_WHITESPACE_SCAN_LIMIT = 0x3001


def is_cjk(cp: int) -> bool:
    """Whether code point `cp` is in Google's CJK ideograph ranges (each such character is its own word)."""
    for low, high in CJK_RANGES:
        if low <= cp <= high:
            return True
    return False


def is_whitespace(char: str) -> bool:
    """Google's whitespace: space, tab, newline, carriage return, or unicode category ``Zs``."""
    if char in " \t\n\r":
        return True
    return unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
    """Google's control characters: categories ``Cc`` and ``Cf``, except tab, newline and carriage return."""
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def is_removed(char: str) -> bool:
    """Whether Google's text cleaning deletes `char` (NUL, U+FFFD, or a control character)."""
    return char == "\x00" or char == "\ufffd" or is_control(char)


def is_blank_char(char: str) -> bool:
    """Whether `char` is nothing the tokenizer reads: whitespace (Python's or Google's) or a character text
    cleaning deletes. A text of only such characters is blank (`is_blank`)."""
    return char.isspace() or is_whitespace(char) or is_removed(char)


def is_blank(text: str) -> bool:
    """Whether `text` holds nothing the tokenizer reads (empty, whitespace, zero-width or control characters):
    such a text would run as [CLS] [SEP] alone, so inputs refuse it."""
    return all(is_blank_char(char) for char in text)


@lru_cache(maxsize=1)
def blank_characters() -> tuple[tuple[int, int], ...]:
    """The code point ranges (first, last) of every blank character (`is_blank_char`), for a pattern that
    describes non-blank text (the server's OpenAPI document). Scans all of unicode once (about 0.3 s)."""
    ranges: list[tuple[int, int]] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or not is_blank_char(chr(cp)):
            continue
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return tuple(ranges)


def is_punctuation(char: str) -> bool:
    """Google's punctuation: non-alphanumeric printable ASCII, or unicode category ``P*``."""
    if char in ASCII_PUNCTUATION:
        return True
    return unicodedata.category(char).startswith("P")


def separator_characters() -> str:
    """The characters that separate words once Google's cleaning has run.

    Cleaning turns Google-whitespace into spaces and deletes control characters; Google then splits with
    Python's ``str.split()``, which also splits on U+2028 and U+2029 (categories Zl/Zp, which cleaning keeps).
    Characters such as U+000B or U+001C are whitespace to Python but are deleted as controls first, so they
    join their neighbours instead of separating them.

    Returns:
        Every such character, in code point order.
    """
    chars = []
    for cp in range(_WHITESPACE_SCAN_LIMIT):
        char = chr(cp)
        if (is_whitespace(char) or char.isspace()) and not is_removed(char):
            chars.append(char)
    return "".join(chars)


@lru_cache(maxsize=65536)
def _decompose(char: str) -> tuple[tuple[str, int], ...]:
    """NFD of one character as (character, canonical combining class) pairs."""
    return tuple((part, unicodedata.combining(part)) for part in unicodedata.normalize("NFD", char))


@lru_cache(maxsize=65536)
def _is_nonspacing_mark(char: str) -> bool:
    return unicodedata.category(char) == "Mn"


class Normalizer:
    """Google's per-word normalisation (cleaning, lower-casing, accent stripping) with an alignment map.

    Args:
        do_lower_case: lower-case every word (Python's ``str.lower`` on the whole word, as Google does, so the
            Greek final sigma comes out right).
        strip_accents: drop accents (NFD, then remove category ``Mn``). None follows `do_lower_case`, which is
            Google's behaviour; True or False sets it independently of casing.
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: bool | None = None):
        self.do_lower_case = do_lower_case
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents

    def clean(self, text: str) -> str:
        """Google's `_clean_text`: drop NUL, U+FFFD and controls; map whitespace to a space."""
        out = []
        for char in text:
            if is_removed(char):
                continue
            out.append(" " if is_whitespace(char) else char)
        return "".join(out)

    def normalize_word(self, word: str) -> tuple[str, list[int]]:
        """Normalise one whitespace-free word and say where each output character came from.

        Args:
            word: a run of characters containing no separator (see `separator_characters`). It may contain
                characters that cleaning removes.

        Returns:
            The normalised word (cleaned, lower-cased and accent-stripped as configured) and, for each of its
            characters, the index in `word` of the character it was produced from (non-decreasing except
            where canonical reordering moves combining marks).
        """
        chars = []
        sources = []
        for index, char in enumerate(word):
            if not is_removed(char):
                chars.append(char)
                sources.append(index)
        text = "".join(chars)
        if self.do_lower_case:
            lowered = text.lower()
            if len(lowered) != len(text):
                # Only a few characters (U+0130 'İ' today) lower-case to several; their pieces all map to the
                # source character. The content still comes from the whole-word lower() for final sigma.
                sources = [source for char, source in zip(text, sources) for _ in range(len(char.lower()))]
            text = lowered
        if self.strip_accents and not text.isascii():
            text, sources = self._strip_accents(text, sources)
        return text, sources

    @staticmethod
    def _strip_accents(text: str, sources: list[int]) -> tuple[str, list[int]]:
        """NFD then drop ``Mn``, carrying source indices through decomposition and canonical reordering."""
        pairs: list[tuple[str, int, int]] = []
        reorder = False
        for char, source in zip(text, sources):
            for part, ccc in _decompose(char):
                # Canonical ordering sorts runs of non-starters (ccc > 0) by class; it can only cross a
                # character boundary when a non-starter follows another non-starter of a higher class.
                if ccc and pairs and pairs[-1][2] > ccc:
                    reorder = True
                pairs.append((part, source, ccc))
        if reorder:
            pairs = _canonical_order(pairs)
        out_chars = []
        out_sources = []
        for part, source, _ in pairs:
            if not _is_nonspacing_mark(part):
                out_chars.append(part)
                out_sources.append(source)
        return "".join(out_chars), out_sources


def _canonical_order(pairs: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """Unicode canonical ordering: stable sort of each maximal run of non-starters by combining class."""
    out: list[tuple[str, int, int]] = []
    run: list[tuple[str, int, int]] = []
    for item in pairs:
        if item[2]:
            run.append(item)
            continue
        if run:
            out.extend(sorted(run, key=lambda entry: entry[2]))
            run = []
        out.append(item)
    if run:
        out.extend(sorted(run, key=lambda entry: entry[2]))
    return out
