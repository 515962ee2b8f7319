"""Sequence-labelling (NER) data: CoNLL-style and character-per-line readers, tag lists and checks.

Readers:
- `read_tagged` reads one token per line with its tag in a column (CoNLL-2003: ``token POS chunk NER``,
  space separated, ``-DOCSTART-`` lines and blank lines between sentences; MSRA NER: ``char<TAB>TAG``, one
  character per line). Tags in IOBES are converted to BIO on reading (`metrics.tagging`), so
  examples always hold BIO; a model may still be trained on IOBES labels (`tag_scheme="IOBES"`).
- A BIO sequence with an I- that follows O or another type is ill-formed. Policy (`bio_errors`): "warn"
  (default) keeps the tags as they are — the entity scorer reads them as conlleval does, an entity starting
  at the I- — and logs each with file:line, counted as `bio_problems`; "error" raises a DataError.

Label alignment to sub-tokens, windows and decoding are the tagging family's (`families.tagging`).
Entities map back to character offsets of the sentence text (words joined by `separator`: " " for CoNLL,
"" for character-per-line Chinese).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from bertforge.data.classification import sorted_labels, unknown_label_message
from bertforge.data.files import check_on_invalid, invalid, iter_lines, no_rows
from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError, InputError
from bertforge.metrics.tagging import bio_to_iobes, check_tags, iobes_to_bio

log = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"
BIO_ERROR_POLICIES = ("warn", "error")
LABEL_POLICIES = ("first", "all")
TAG_SCHEMES = ("BIO", "IOBES")


@dataclass
class TaggingExample:
    """One sentence: its words (tokens or characters), BIO tags (None if unlabeled), how the words join into
    the sentence text, and where it starts ("file:line").

    A sentence that came as raw text (predict, the server) keeps that text in `original` and each word's
    character span in it in `spans`, so entities point into the text the user sent.
    """

    words: list[str]
    tags: list[str] | None
    separator: str
    source: str
    original: str | None = None
    spans: list[tuple[int, int]] | None = None

    @property
    def text(self) -> str:
        return self.original if self.original is not None else self.separator.join(self.words)

    def word_spans(self) -> list[tuple[int, int]]:
        """(start, end) character span of each word in `text`."""
        if self.spans is not None:
            return list(self.spans)
        spans = []
        position = 0
        for word in self.words:
            spans.append((position, position + len(word)))
            position += len(word) + len(self.separator)
        return spans


def _split_line(text: str) -> list[str]:
    # Tab-separated files may hold a space as a token (a character-per-line file); otherwise any whitespace.
    return text.split("\t") if "\t" in text else text.split()


def read_tagged(
    path: str | os.PathLike,
    *,
    token_column: int = 0,
    tag_column: int | None = -1,
    separator: str = " ",
    bio_errors: str = "warn",
    on_invalid: str = "error",
    report: DataReport | None = None,
) -> list[TaggingExample]:
    """Read a one-token-per-line tagged file (CoNLL-2003, MSRA character-per-line BIO, and the like).

    Args:
        path: the file.
        token_column, tag_column: 0-based columns (negative from the end); `tag_column=None` reads tokens only.
        separator: how words join into the sentence text (" " for words, "" for characters).
        bio_errors: "warn" or "error" for ill-formed BIO (an I- after O or another type).
        on_invalid: "error" or "skip" for a line without the needed columns (skip drops the whole sentence).
        report: gets `rows` (sentences), `bio_problems`, `converted_from_iobes`, `skipped_*`.

    Returns:
        The sentences (documents markers and empty sentences dropped), tags converted to BIO.

    Raises:
        DataError: missing file, a file that is not UTF-8 or holds no token line, malformed line (with
            on_invalid="error"), tags outside BIO/IOBES, or ill-formed BIO with bio_errors="error".
    """
    if bio_errors not in BIO_ERROR_POLICIES:
        raise ConfigError(f"bio_errors={bio_errors!r}; use one of {BIO_ERROR_POLICIES}")
    check_on_invalid(on_invalid)
    report = report if report is not None else DataReport()
    sentences: list[TaggingExample] = []
    sentence = _Sentence()

    def finish() -> None:
        nonlocal sentence
        if sentence.words and not sentence.broken:
            sentences.append(_checked(path, sentence.words, sentence.tags if tag_column is not None else None,
                                      sentence.lines, separator, bio_errors, report))
        sentence = _Sentence()

    # A byte-order mark at the start is skipped (else "\ufeff-DOCSTART-" would be a word); CRLF reads as LF.
    token_lines = 0
    for number, text in iter_lines(path):
        columns = _split_line(text) if text.strip() else []
        if not columns or columns[0] == DOCSTART:
            finish()
            continue
        token_lines += 1
        problem = _line_problem(text, columns, token_column, tag_column)
        if problem is not None:
            invalid(report, on_invalid, *problem, path, number)
            sentence.broken = True
            continue
        sentence.words.append(columns[token_column])
        sentence.lines.append(number)
        if tag_column is not None:
            sentence.tags.append(columns[tag_column].strip())
    finish()
    if not token_lines:
        raise no_rows(path)
    return sentences


@dataclass
class _Sentence:
    """The token lines read since the last sentence break; `broken` once one of them was malformed (skipped
    with on_invalid="skip": the whole sentence goes)."""

    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    broken: bool = False


def _line_problem(text: str, columns: list[str], token_column: int,
                  tag_column: int | None) -> tuple[str, str] | None:
    """(reason, message) of a token line without the needed columns or with an empty token, else None."""
    needed = [token_column] + ([tag_column] if tag_column is not None else [])
    out_of_range = any(not -len(columns) <= c < len(columns) for c in needed)
    if len(columns) < 2 and tag_column is not None or out_of_range:
        return ("column_count", f"expected a token and a tag, got {text!r}")
    if not columns[token_column]:
        return ("empty_text", "empty token")
    return None


def _checked(path, words: list[str], tags: list[str] | None, lines: list[int], separator: str, bio_errors: str,
             report: DataReport) -> TaggingExample:
    where = f"{os.fspath(path)}:{lines[0]}"
    report.note("rows")
    if tags is None:
        return TaggingExample(list(words), None, separator, where)
    tags = list(tags)
    if any(tag[:2] in ("E-", "S-") for tag in tags):
        try:
            tags = iobes_to_bio(tags)
        except InputError as error:
            raise DataError(f"tags are neither BIO nor IOBES: {error}", path, lines[0]) from None
        report.note("converted_from_iobes", where)
    for problem in check_tags(tags, "BIO"):
        line = lines[problem.index]
        if problem.message.startswith("not a"):
            raise DataError(f"tag {problem.tag!r} is {problem.message}", path, line)
        if bio_errors == "error":
            raise DataError(f"ill-formed BIO: {problem.message} (pass bio_errors='warn' to keep it, read as "
                            "conlleval does)", path, line)
        report.note("bio_problems", f"{os.fspath(path)}:{line}")
        log.debug("%s:%d: ill-formed BIO: %s", os.fspath(path), line, problem.message)
    return TaggingExample(list(words), tags, separator, where)


def tag_list(examples: Sequence[TaggingExample], tag_scheme: str = "BIO") -> list[str]:
    """The label names a model predicts: "O" first, then the tags seen (in `tag_scheme`), sorted."""
    if tag_scheme not in TAG_SCHEMES:
        raise ConfigError(f"tag_scheme={tag_scheme!r}; use one of {TAG_SCHEMES}")
    seen: set[str] = set()
    for example in examples:
        if example.tags is not None:
            seen.update(bio_to_iobes(example.tags) if tag_scheme == "IOBES" else example.tags)
    if not seen:
        raise DataError("no tagged sentences; a training file needs a tag column")
    seen.discard("O")
    return ["O", *sorted_labels(list(seen))]


def scheme_tags(tags: Sequence[str], tag_scheme: str = "BIO") -> list[str]:
    """A given tag set (a named task's, or --labels) as the model's labels in `tag_scheme`: as given (its order
    is the label ids), except that a BIO set for an IOBES model becomes every type's B-, I-, E-, S- in
    `tag_list` order."""
    names = [t for t in tags if t != "O"]
    if tag_scheme != "IOBES" or any(t.startswith(("E-", "S-")) for t in names):
        return list(tags)
    types = {t[2:] for t in names if t[:2] in ("B-", "I-")}
    return ["O", *sorted_labels([f"{prefix}-{kind}" for kind in types for prefix in "BIES"])]


def check_tag_labels(examples: Sequence[TaggingExample], label2id: dict[str, int], tag_scheme: str = "BIO",
                     origin: str = "training") -> None:
    """DataError for the first tag the model does not know (e.g. an entity type absent from training); the
    fix the message gives follows where the known tags came from (`origin`)."""
    for example in examples:
        if example.tags is None:
            continue
        tags = bio_to_iobes(example.tags) if tag_scheme == "IOBES" else example.tags
        for offset, tag in enumerate(tags):
            if tag not in label2id:
                path, _, line = example.source.rpartition(":")
                if origin == "training":
                    raise DataError(f"tag {tag!r} was never seen in training (known: {sorted(label2id)}); fix the "
                                    "line or add training sentences with it", path, int(line) + offset)
                found = sorted({t for e in examples if e.tags for t in e.tags})
                raise DataError(unknown_label_message(tag, list(label2id), found, origin, "tag"), path,
                                int(line) + offset)
