"""Pretraining text: files to documents of sentences, streamed, with a sanity report on the corpus.

This module owns the first hop of pretraining data (see DESIGN.md, "Data flow"): it turns a file, a folder or
a glob into a stream of `Document`s (lists of sentences), never holding more than one document in memory.

Formats, detected per file from its first lines (`detect_format`), or forced with ``format=``:

- ``"sentences"``: one sentence per line, a blank line between documents (the format of Google's
  `create_pretraining_data.py`). Lines are used as they are.
- ``"text"``: running text, e.g. a book: a line holds several sentences, or a sentence wraps over several
  lines. Text is split into sentences (`split_sentences`: English ``. ! ?`` with an abbreviation guard, Chinese
  ``。！？；．…`` with their closing quotes). Blank lines only separate paragraphs; a document ends at a
  chapter heading (``CHAPTER IV``, ``第十回``) or after `max_document_sentences` sentences.
- ``"documents"``: running text as above, but a blank line ends the document (e.g. one article per line).

Any line ending is accepted (``\\n``, ``\\r\\n``, ``\\r``) and a UTF-8 byte-order mark is skipped. A file that is
not UTF-8 text raises `DataError` with its file and line and the fix. What usually goes wrong silently is
counted in `CorpusStats` and turned into warnings: empty files, a "sentences" file without any blank line (so
the whole file would be one document), duplicated sentences (a known cause of an MLM loss stuck near 7), and
mostly one-sentence documents (their NSP pairs can only be random).
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import io
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from bertforge.errors import ConfigError, DataError
from bertforge.tokenization.normalizer import is_cjk

log = logging.getLogger(__name__)

FORMATS = ("auto", "sentences", "text", "documents")
# A book chapter is typically 100-300 sentences; the cap bounds memory on text with no document structure.
DEFAULT_MAX_DOCUMENT_SENTENCES = 500
# A run of text with no sentence punctuation is cut here so that memory stays bounded on odd input.
MAX_SENTENCE_CHARS = 4096
# Lines of a file that `detect_format` looks at.
DETECT_LINES = 2000
# Sentences shorter than this are not checked for duplicates: "Yes." and "CHAPTER I" repeat naturally.
DUPLICATE_MIN_CHARS = 20
# Above this share of duplicated sentences the corpus gets a warning (books have a few by nature).
DUPLICATE_WARN_RATIO = 0.01
SINGLE_SENTENCE_WARN_RATIO = 0.3

_CJK_TERMINALS = frozenset("。！？；．")
_TERMINALS = ".!?。！？；．…"
_CLOSERS = "\"'”’」』）)]》〕】»"
_OPENERS = "\"'“‘(「『《〔【[«"
# Separator lines ("*   *   *") repeat by design; they are not counted as duplicated text.
_NO_WORDS = re.compile(r"[\W_]+")
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


@dataclass
class Document:
    """One document: its sentences (non-empty, stripped) and where it starts, for messages.

    Attributes:
        sentences: the sentences in order.
        path: the file it came from.
        line: 1-based line of its first sentence.
    """

    sentences: list[str]
    path: str
    line: int


@dataclass
class CorpusStats:
    """What reading a corpus found; `warnings()` turns the suspicious parts into messages.

    Counts are filled in while documents stream out of `read_documents`, so they are complete only once the
    stream is exhausted.
    """

    files: int = 0
    bytes: int = 0
    lines: int = 0
    sentences: int = 0
    documents: int = 0
    single_sentence_documents: int = 0
    # Documents cut at `max_document_sentences` in files whose format promised blank lines between documents.
    forced_splits: int = 0
    checked_sentences: int = 0
    duplicate_sentences: int = 0
    first_duplicate: str | None = None
    formats: dict[str, str] = field(default_factory=dict)
    empty_files: list[str] = field(default_factory=list)
    files_without_breaks: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """Human-readable warnings, each naming the problem, where it is and what to do."""
        found = []
        for path in self.empty_files:
            found.append(f"{path}: empty file (no text); it was skipped")
        if self.files_without_breaks:
            names = ", ".join(self.files_without_breaks[:3]) + (", ..." if len(self.files_without_breaks) > 3 else "")
            found.append(
                f"{len(self.files_without_breaks)} files have one sentence per line but no blank line between "
                f"documents ({names}); documents were cut at chapter headings and every "
                "max_document_sentences sentences. Put a blank line between documents so next-sentence pairs "
                "come from real document boundaries"
            )
        if self.checked_sentences and self.duplicate_sentences > DUPLICATE_WARN_RATIO * self.checked_sentences:
            share = 100.0 * self.duplicate_sentences / self.checked_sentences
            found.append(
                f"{self.duplicate_sentences} of {self.checked_sentences} sentences ({share:.1f}%) are exact "
                f"duplicates (first at {self.first_duplicate}); duplicated text is a known cause of an MLM "
                "loss stuck near 7: deduplicate the corpus (count is an estimate from a fixed-size filter)"
            )
        if self.documents and self.single_sentence_documents > SINGLE_SENTENCE_WARN_RATIO * self.documents:
            share = 100.0 * self.single_sentence_documents / self.documents
            found.append(
                f"{self.single_sentence_documents} of {self.documents} documents ({share:.0f}%) have one "
                "sentence: their next-sentence pairs can only be random. If blank lines separate paragraphs, "
                "not documents, read the files with format='text'"
            )
        if self.forced_splits:
            found.append(
                f"{self.forced_splits} documents were longer than max_document_sentences and were cut; "
                "check that blank lines separate documents"
            )
        return found

    def to_dict(self) -> dict:
        """A JSON-able summary (counts, formats per file and warnings)."""
        return {
            "files": self.files,
            "bytes": self.bytes,
            "lines": self.lines,
            "sentences": self.sentences,
            "documents": self.documents,
            "single_sentence_documents": self.single_sentence_documents,
            "forced_splits": self.forced_splits,
            "checked_sentences": self.checked_sentences,
            "duplicate_sentences": self.duplicate_sentences,
            "formats": dict(self.formats),
            "warnings": self.warnings(),
        }


class DuplicateFilter:
    """Counts repeated sentences in fixed memory (a Bloom filter), however large the corpus.

    A sentence seen before is always counted; an unseen one is miscounted as a duplicate with probability
    about (1 - exp(-k n / m))^k, below 1e-4 for the first million distinct sentences with the defaults
    (m = 2^27 bits = 16 MiB, k = 3), so the count is an estimate that never misses real duplicates.
    The hash is blake2b, so counts do not depend on Python's per-process string hash seed.
    """

    def __init__(self, bits_log2: int = 27, hashes: int = 3):
        self._mask = (1 << bits_log2) - 1
        self._hashes = hashes
        self._bits = bytearray(1 << (bits_log2 - 3))

    def seen(self, text: str) -> bool:
        """Record `text`; return whether it was (probably) recorded before."""
        digest = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest(), "little")
        present = True
        for _ in range(self._hashes):
            position = digest & self._mask
            digest >>= 40
            byte, bit = position >> 3, 1 << (position & 7)
            if not self._bits[byte] & bit:
                present = False
                self._bits[byte] |= bit
        return present


def resolve_inputs(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Expand files, folders (recursively, files in sorted order, hidden files skipped) and glob patterns.

    Args:
        inputs: one path or pattern, or several.

    Returns:
        The files, in the order given (each folder or pattern expanded in sorted order), without repeats.

    Raises:
        DataError: a path does not exist or a pattern matches no file.
    """
    items = [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs)
    if not items:
        raise DataError("no input files given; pass a file, a folder or a glob pattern")
    files: list[Path] = []
    for item in items:
        text = os.fspath(item)
        path = Path(text)
        if path.is_file():
            found = [path]
        elif path.is_dir():
            found = _folder_files(path)
            if not found:
                raise DataError("the folder holds no files", path)
        elif glob.has_magic(text):
            found = sorted(Path(match) for match in glob.glob(text, recursive=True) if Path(match).is_file())
            if not found:
                raise DataError(f"the pattern {text!r} matches no file")
        else:
            raise DataError("no such file or folder", path)
        files.extend(found)
    unique = list(dict.fromkeys(files))
    return unique


def _folder_files(folder: Path) -> list[Path]:
    """Files under `folder` in sorted order, following symbolic links (but not a link back to a folder it is
    inside, which would loop), skipping hidden files and folders."""
    found = []
    for root, folders, names in os.walk(folder, followlinks=True):
        here = Path(root)
        ancestors = {os.path.realpath(folder / parent) for parent in here.relative_to(folder).parents}
        if os.path.realpath(here) in ancestors:
            folders[:] = []
            continue
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        found += [here / name for name in names if not name.startswith(".") and (here / name).is_file()]
    return sorted(found)


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a UTF-8 text file without their line endings (``\\n``, ``\\r\\n`` or ``\\r``).

    A byte-order mark is skipped at the start of the file only (the "utf-8-sig" decoder drops U+FEFF as the
    first character of the stream): a BOM further on, e.g. where two files were concatenated, is text.

    Raises:
        DataError: the file cannot be read, holds a NUL byte (binary or UTF-16), or is not valid UTF-8; the
            message names the line and how to convert the file.
    """
    path = Path(path)
    try:
        handle = open(path, "rb")  # closed by the TextIOWrapper below
    except OSError as error:
        raise DataError(f"cannot read the file ({error.strerror})", path) from None
    # newline=None: universal newlines, so "\r\n" and a lone "\r" both end a line.
    with io.TextIOWrapper(handle, encoding="utf-8-sig", errors="strict", newline=None) as text:
        try:
            for number, line in enumerate(text, 1):
                if "\x00" in line:
                    raise DataError(
                        "holds a NUL byte: this is a binary file or UTF-16 text, not UTF-8 text; convert it "
                        "(e.g. iconv -f UTF-16 -t UTF-8) or remove it from the inputs",
                        path,
                        number,
                    )
                yield line.rstrip("\n")
        except UnicodeDecodeError:
            raise DataError(
                "is not valid UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t UTF-8 for a Latin-1 or "
                "Windows-1252 file, iconv -f GBK -t UTF-8 for Chinese text saved as GBK)",
                path,
                _decode_error_line(path),
            ) from None


def _decode_error_line(path: Path) -> int:
    """The 1-based line holding the first byte sequence that is not UTF-8 (read again in chunks; only the
    error path pays for it)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                chunk = chunk[: error.start]
                return line + chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            line += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
    return line


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


def _join(carry: str, line: str) -> str:
    if not carry:
        return line
    if is_cjk(ord(carry[-1])) or carry[-1] in _CJK_TERMINALS or is_cjk(ord(line[0])):
        return carry + line  # Chinese does not put a space where a line wraps
    return carry + " " + line


class _DocumentBuilder:
    """Collects the sentences of one file into documents and updates the corpus counts."""

    def __init__(self, path: Path, stats: CorpusStats, max_sentences: int, duplicates: DuplicateFilter | None,
                 warn_on_cut: bool):
        self.path = path
        self.stats = stats
        self.max_sentences = max_sentences
        self.duplicates = duplicates
        self.warn_on_cut = warn_on_cut
        self.sentences: list[str] = []
        self.line = 0
        # Sentences of the current document that are not headings: a heading after headings only (a table
        # of contents) does not start a new document.
        self.body = 0

    def add(self, sentence: str, line: int, heading: bool = False) -> Document | None:
        if not self.sentences:
            self.line = line
        self.sentences.append(sentence)
        self.body += not heading
        self.stats.sentences += 1
        if (self.duplicates is not None and len(sentence) >= DUPLICATE_MIN_CHARS
                and not _NO_WORDS.fullmatch(sentence)):
            self.stats.checked_sentences += 1
            if self.duplicates.seen(sentence):
                self.stats.duplicate_sentences += 1
                if self.stats.first_duplicate is None:
                    self.stats.first_duplicate = f"{self.path}:{line}"
        if len(self.sentences) >= self.max_sentences:
            if self.warn_on_cut:
                self.stats.forced_splits += 1
            return self.finish()
        return None

    def finish(self) -> Document | None:
        if not self.sentences:
            return None
        document = Document(self.sentences, str(self.path), self.line)
        self.sentences = []
        self.body = 0
        self.stats.documents += 1
        if len(document.sentences) == 1:
            self.stats.single_sentence_documents += 1
        return document


def _file_documents(path: Path, file_format: str, stats: CorpusStats, max_sentences: int,
                    duplicates: DuplicateFilter | None) -> Iterator[Document]:
    lines = iter_lines(path)
    head = list(islice(lines, DETECT_LINES))
    if file_format == "auto":
        file_format = detect_format(path, head)
    if file_format == "empty" or not any(line.strip() for line in head):
        stats.empty_files.append(str(path))
        stats.formats[str(path)] = "empty"
        return
    stats.formats[str(path)] = file_format
    no_breaks = file_format == "sentences" and not any(not line.strip() for line in head)
    builder = _DocumentBuilder(path, stats, max_sentences, duplicates,
                               warn_on_cut=file_format == "sentences" and not no_breaks)
    number = 0
    seen_blank = False
    if file_format == "sentences":
        for number, raw in enumerate(_chain(head, lines), 1):
            line = raw.strip()
            if not line:
                seen_blank = True
                document = builder.finish()
            elif no_breaks and is_heading(line):
                document = builder.finish() if builder.body else None
                if document is not None:
                    yield document
                document = builder.add(line, number, heading=True)
            else:
                document = builder.add(line, number)
            if document is not None:
                yield document
        if not seen_blank and stats.documents and number > 1:
            stats.files_without_breaks.append(str(path))
    else:
        carry = ""
        carry_line = 0
        for number, raw in enumerate(_chain(head, lines), 1):
            line = raw.strip()
            heading = bool(line) and file_format == "text" and is_heading(line)
            if not line or heading:
                if carry:
                    document = builder.add(carry, carry_line)
                    if document is not None:
                        yield document
                    carry = ""
                if (heading and builder.body) or (not line and file_format == "documents"):
                    document = builder.finish()
                    if document is not None:
                        yield document
                if heading:
                    document = builder.add(line, number, heading=True)
                    if document is not None:
                        yield document
                continue
            if not carry:
                carry_line = number
            pieces = split_sentences(_join(carry, line))
            # The last piece may continue on the next line, so it waits for it.
            carry = pieces.pop() if pieces else ""
            for piece in pieces:
                document = builder.add(piece, carry_line)
                carry_line = number
                if document is not None:
                    yield document
            if len(carry) > MAX_SENTENCE_CHARS:
                document = builder.add(carry, carry_line)
                carry = ""
                if document is not None:
                    yield document
        if carry:
            document = builder.add(carry, carry_line)
            if document is not None:
                yield document
    stats.lines += number
    document = builder.finish()
    if document is not None:
        yield document


def _chain(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from rest


def read_documents(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    format: str = "auto",
    max_document_sentences: int = DEFAULT_MAX_DOCUMENT_SENTENCES,
    stats: CorpusStats | None = None,
    count_duplicates: bool = True,
    log_warnings: bool = True,
) -> Iterator[Document]:
    """Stream the documents of a corpus, one at a time, in file order.

    Args:
        inputs: files, folders or glob patterns (see `resolve_inputs`).
        format: ``"auto"`` (detect per file), ``"sentences"``, ``"text"`` or ``"documents"`` (module docstring).
        max_document_sentences: a longer document is cut into pieces of this many sentences (bounds memory
            and gives running text documents of chapter size).
        stats: filled in while the stream is consumed (counts, duplicates, formats, warnings).
        count_duplicates: keep the fixed-size duplicate filter (16 MiB); off for a pass that only counts.
        log_warnings: log `CorpusStats.warnings` once the stream is exhausted.

    Yields:
        `Document`s with at least one sentence.

    Raises:
        ConfigError: an unknown format or a non-positive `max_document_sentences`.
        DataError: a missing input, or a file that is not UTF-8 text (names the file and line).
    """
    if format not in FORMATS:
        raise ConfigError(f"corpus format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(max_document_sentences, bool) or not isinstance(max_document_sentences, int) \
            or max_document_sentences < 1:
        raise ConfigError(f"max_document_sentences must be a positive integer, got {max_document_sentences!r}")
    files = resolve_inputs(inputs)
    stats = stats if stats is not None else CorpusStats()
    duplicates = DuplicateFilter() if count_duplicates else None
    for path in files:
        stats.files += 1
        stats.bytes += path.stat().st_size
        yield from _file_documents(path, format, stats, max_document_sentences, duplicates)
    if log_warnings:
        for warning in stats.warnings():
            log.warning(warning)


def assign_documents(documents: Iterable[Document], index: int, count: int) -> Iterator[Document]:
    """The documents of worker or rank `index` out of `count`: every `count`-th, starting at `index`.

    The split depends only on document order, so it is the same on every run and every machine.
    """
    if not 0 <= index < count:
        raise ConfigError(f"worker index must be in [0, {count}), got {index}")
    return islice(documents, index, None, count)
