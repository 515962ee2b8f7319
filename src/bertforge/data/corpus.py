"""Pretraining text: files to documents of sentences, streamed, with a sanity report on the corpus.

This module owns the first hop of pretraining data (see DESIGN.md, "Data flow"): it turns a file, a folder or
a glob into a stream of `Document`s (lists of sentences), never holding more than one document in memory.

Formats, detected per file from its first lines (`data.sentences.detect_format`), or forced with ``format=``:

- ``"sentences"``: one sentence per line, a blank line between documents (the format of Google's
  `create_pretraining_data.py`). Lines are used as they are.
- ``"text"``: running text, e.g. a book: a line holds several sentences, or a sentence wraps over several
  lines. Text is split into sentences (`data.sentences.split_sentences`). Blank lines only separate
  paragraphs; a document ends at a chapter heading (``CHAPTER IV``, ``第十回``) or after
  `max_document_sentences` sentences.
- ``"documents"``: running text as above, but a blank line ends the document (e.g. one article per line).

Files are found and read by `data.text_files` (any line ending, UTF-8 only, errors naming file and line).
What usually goes wrong silently is counted in `CorpusStats` and turned into warnings: empty files, a
"sentences" file without any blank line (so the whole file would be one document), duplicated sentences (a
known cause of an MLM loss stuck near 7), and mostly one-sentence documents (their NSP pairs can only be
random).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from bertforge.data.sentences import DETECT_LINES, detect_format, is_heading, join_wrapped, split_sentences
from bertforge.data.text_files import iter_lines, resolve_inputs
from bertforge.errors import ConfigError

log = logging.getLogger(__name__)

FORMATS = ("auto", "sentences", "text", "documents")
# A book chapter is typically 100-300 sentences; the cap bounds memory on text with no document structure.
DEFAULT_MAX_DOCUMENT_SENTENCES = 500
# A run of text with no sentence punctuation is cut here so that memory stays bounded on odd input.
MAX_SENTENCE_CHARS = 4096
# Sentences shorter than this are not checked for duplicates: "Yes." and "CHAPTER I" repeat naturally.
DUPLICATE_MIN_CHARS = 20
# Above this share of duplicated sentences the corpus gets a warning (books have a few by nature).
DUPLICATE_WARN_RATIO = 0.01
SINGLE_SENTENCE_WARN_RATIO = 0.3

# Separator lines ("*   *   *") repeat by design; they are not counted as duplicated text.
_NO_WORDS = re.compile(r"[\W_]+")


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
    if file_format == "sentences":
        number = yield from _sentence_line_documents(_chain(head, lines), builder, no_breaks)
    else:
        number = yield from _running_text_documents(_chain(head, lines), builder, file_format)
    stats.lines += number
    document = builder.finish()
    if document is not None:
        yield document


def _sentence_line_documents(lines: Iterator[str], builder: _DocumentBuilder,
                             no_breaks: bool) -> Generator[Document, None, int]:
    """Documents of a one-sentence-per-line file (blank lines end documents; without any blank line, chapter
    headings do); returns the number of lines read."""
    number = 0
    seen_blank = False
    for number, raw in enumerate(lines, 1):
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
    if not seen_blank and builder.stats.documents and number > 1:
        builder.stats.files_without_breaks.append(str(builder.path))
    return number


def _running_text_documents(lines: Iterator[str], builder: _DocumentBuilder,
                            file_format: str) -> Generator[Document, None, int]:
    """Documents of running text ("text" or "documents" format), split into sentences across line wraps;
    returns the number of lines read."""
    number = 0
    carry = ""
    carry_line = 0
    for number, raw in enumerate(lines, 1):
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
        pieces = split_sentences(join_wrapped(carry, line))
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
    return number


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
