"""Sentences in running text: splitting (English and Chinese), chapter headings, and format detection.

Text is split into sentences at English ``. ! ?`` with an abbreviation guard and at Chinese ``。！？；．…``
with their closing quotes (`split_sentences`); `is_heading` spots chapter headings (``CHAPTER IV``,
``第十回``), where a book's documents end; `detect_format` tells a one-sentence-per-line file from running
text by its first lines; `join_wrapped` glues a line wrapped over two (with a space, except in Chinese).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from itertools import islice

from bertforge.data.text_files import iter_lines
from bertforge.tokenization.normalizer import is_cjk

# Lines of a file that `detect_format` looks at.
DETECT_LINES = 2000

_CJK_TERMINALS = frozenset("。！？；．")
_TERMINALS = ".!?。！？；．…"
_CLOSERS = "\"'”’」』）)]》〕】»"
_OPENERS = "\"'“‘(「『《〔【[«"
_BOUNDARY = re.compile(f"[{re.escape(_TERMINALS)}]+[{re.escape(_CLOSERS)}]*")
# Words after which a period does not end a sentence (case-sensitive; "etc." is left out on purpose because
# it ends sentences as often as not).
_ABBREVIATIONS = frozenset(
    "Mr Mrs Ms Messrs Mme Mlle Dr Prof Rev Hon St Jr Sr Esq Mt Gen Col Capt Lt Sgt Cpl Maj Adm Gov Sen Rep "
    "Pres Supt Insp No Nos Vol Vols Fig Figs Ch Chap Sec Art Inc Ltd Co Corp Bros Jan Feb Mar Apr Jun Jul Aug "
    "Sep Sept Oct Nov Dec Mon Tue Wed Thu Fri Sat Sun vs viz cf al approx ca pp p op cit ibid ed eds".split()
)
_HEADING = re.compile(
    r"(?:(?:chapter|book|part|volume|act|scene|stave|letter|canto)\s+"
    r"(?:[ivxlcdm]+|\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last)\b.{0,80}"
    r"|(?:prologue|epilogue|preface|introduction)\.?"
    r"|第[0-9０-９零〇一二三四五六七八九十百千两兩]+[回章节節卷部篇集幕].{0,60})",
    re.IGNORECASE,
)


def is_heading(line: str) -> bool:
    """Whether a stripped line looks like a chapter heading (``CHAPTER IV.``, ``Book One: 1805``, ``第十回 ...``)."""
    return len(line) <= 100 and _HEADING.fullmatch(line) is not None


def _starts_sentence(char: str) -> bool:
    return char.isupper() or char.isdigit() or char in _OPENERS or is_cjk(ord(char))


def _is_abbreviation(text: str, period: int) -> bool:
    """Whether the period at `period` closes an abbreviation or an initial rather than a sentence."""
    start = period
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    word = text[start:period].lstrip(_OPENERS)
    if not word:
        return False
    if word in _ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper():
        return True  # an initial: "J. R. R. Tolkien"
    # "e.g.", "i.e.", "U.S.": periods inside the word.
    return "." in word and any(char.isalpha() for char in word)


def _skip_spaces(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences (English and Chinese punctuation), each stripped and non-empty.

    A Chinese terminal (``。！？；．``, also ``…`` and ``!?`` right after a CJK character) ends a sentence
    together with any closing quotes after it (``”’」』``). An English terminal (``. ! ?``, ``...``) ends a
    sentence only when whitespace and a sentence start follow (an upper-case letter, a digit, an opening
    quote or a CJK character), and a period after an abbreviation (``Mr.``, ``e.g.``) or an initial does not.

    Args:
        text: any text; newlines inside it count as spaces.

    Returns:
        The sentences in order ([] for blank text).
    """
    sentences = []
    begin = 0
    length = len(text)
    for match in _BOUNDARY.finditer(text):
        start, end = match.span()
        if end >= length:
            break
        terminal = match.group().rstrip(_CLOSERS)
        previous = text[start - 1] if start else ""
        after = _skip_spaces(text, end)
        if after < length and after > end and text[after] in _CLOSERS:
            # A closing quote set off by a space ("He left ! '' Then") still belongs to this sentence.
            quote_end = after
            while quote_end < length and text[quote_end] in _CLOSERS:
                quote_end += 1
            if quote_end >= length or text[quote_end].isspace():
                end = quote_end
                after = _skip_spaces(text, end)
        if after >= length:
            break
        following = text[after]
        cjk_before = bool(previous) and (is_cjk(ord(previous)) or previous in _CJK_TERMINALS)
        if any(char in _CJK_TERMINALS for char in terminal):
            boundary = True
        elif cjk_before and (after == end or is_cjk(ord(following))):
            boundary = True  # "好!他" or "说……他": Chinese text with ASCII or ellipsis punctuation
        elif after == end:
            boundary = False  # "3.14", "e.g.the", "Yahoo!com"
        else:
            boundary = _starts_sentence(following) and not (terminal == "." and _is_abbreviation(text, start))
        if boundary:
            _append_sentence(sentences, text[begin:end].strip())
            begin = after
    _append_sentence(sentences, text[begin:].strip())
    return sentences


def _append_sentence(sentences: list[str], sentence: str) -> None:
    if not sentence:
        return
    if sentences and not any(char.isalnum() for char in sentence):
        # Stray closing punctuation ("He left ! ''" in tokenised text) belongs to the sentence before it.
        sentences[-1] = sentences[-1] + " " + sentence
    else:
        sentences.append(sentence)


def _ends_sentence(line: str) -> bool:
    stripped = line.rstrip(_CLOSERS + " \t")
    return bool(stripped) and stripped[-1] in _TERMINALS


def detect_format(path: str | os.PathLike, lines: Iterable[str] | None = None) -> str:
    """Guess whether a file is one sentence per line (``"sentences"``) or running text (``"text"``).

    One sentence per line means most lines end with sentence punctuation and few hold two sentences; wrapped
    text fails the first test, a paragraph per line the second. Blank lines are then trusted to separate
    documents, however short: merging real documents would give wrong next-sentence labels, while
    paragraphs taken for documents only make more random pairs (and `CorpusStats` warns when most
    documents have one sentence). Force ``format=`` when the guess is wrong.

    Args:
        path: the file (read only for its first `DETECT_LINES` lines unless `lines` is given).
        lines: the first lines of the file, when the caller already has them.

    Returns:
        ``"sentences"``, ``"text"``, or ``"empty"`` for a file without text.
    """
    sample = list(islice(iter_lines(path), DETECT_LINES)) if lines is None else list(lines)
    texts = [line.strip() for line in sample if line.strip()]
    if not texts:
        return "empty"
    ending = sum(_ends_sentence(line) for line in texts) / len(texts)
    several = sum(len(split_sentences(line)) > 1 for line in texts) / len(texts)
    return "sentences" if ending >= 0.5 and several <= 0.2 else "text"


def join_wrapped(carry: str, line: str) -> str:
    """`line` appended to the text before it (`carry`) where a sentence wraps over lines."""
    if not carry:
        return line
    if is_cjk(ord(carry[-1])) or carry[-1] in _CJK_TERMINALS or is_cjk(ord(line[0])):
        return carry + line  # Chinese does not put a space where a line wraps
    return carry + " " + line
