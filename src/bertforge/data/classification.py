"""Sentence and sentence-pair classification/regression data: table readers, labels and their checks.

Reads GLUE-style TSV (tab-separated, no quoting — `csv.QUOTE_NONE` semantics, with or without a header),
CSV (standard quoting) and JSON Lines files; columns are named by header name (or JSON key) or by 0-based
index. Every malformed row (wrong column count, empty text, empty or unparsable label) is a `DataError`
naming file and line, or — with `on_invalid="skip"` — is dropped and counted in the `DataReport`.

The files people have, as every fine-tuning reader (`classification`, `conll`, `squad`, `choice`) takes them:
a UTF-8 byte-order mark at the start of the file is skipped (GLUE's MRPC files begin with one; one in the
middle of a file is data); any line ending (``\n``, ``\r\n``); a file that is not UTF-8 (Latin-1, cp1252,
UTF-16) is one `DataError` naming the file, the line and the conversion (`open_text`, `not_utf8`); an empty
or header-only file is a `DataError`, not an empty training set.

Features (``[CLS] A [SEP] (B [SEP])``, long inputs windowed) and decoding are the classification family's
(`families.classification`).
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError

ON_INVALID = ("error", "skip")
# Header names (JSON keys) of a row-id column, taken as the id when no id column is named: GLUE's test files
# have `index` (QQP `id`), ChnSentiCorp `qid`.
ID_COLUMNS = ("index", "id", "idx", "qid", "guid")
FILE_FORMATS = ("tsv", "csv", "jsonl")
BOM = "\ufeff"


@dataclass
class ClassificationExample:
    """One row: text_a, optional text_b, the raw label (str; float for regression; a tuple of label names for
    multi-label, possibly empty; None when unlabeled), where it came from ("file:line"), and its id: the
    value of the file's id column (`ID_COLUMNS`, or the one named), else the source (what evaluate's
    predictions carry, so a test-set file's predictions can be submitted by id)."""

    text_a: str
    text_b: str | None
    label: str | float | tuple[str, ...] | None
    source: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or self.source


Column = int | str


def parse_column(spec: Column | None) -> Column | None:
    """A column given as a header name or a 0-based index; strings of digits (from a command line) are indices."""
    if spec is None or isinstance(spec, int):
        return spec
    spec = str(spec).strip()
    return int(spec) if spec.lstrip("-").isdigit() else spec


def detect_format(path: str | os.PathLike, file_format: str | None = None) -> str:
    """"tsv" (also .txt and anything unknown), "csv" or "jsonl" from the file name unless given."""
    if file_format is not None:
        if file_format not in FILE_FORMATS:
            raise ConfigError(f"file_format={file_format!r} is not supported; use one of {FILE_FORMATS}")
        return file_format
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "tsv"


def invalid(report: DataReport, on_invalid: str, reason: str, message: str, path, line: int | None) -> None:
    """Raise a DataError for a bad row, or count it as skipped (`on_invalid="skip"`)."""
    if on_invalid == "error":
        raise DataError(message + " (pass on_invalid='skip' / --on-invalid skip to drop such rows, counted)",
                        path, line)
    report.note(f"skipped_{reason}", f"{os.fspath(path)}:{line}")


def open_text(path: str | os.PathLike, newline: str | None = None):
    """Open a fine-tuning data file as UTF-8 text, skipping a byte-order mark at its very start.

    "utf-8-sig" drops U+FEFF only as the first character of the stream, so a BOM in the middle of a file
    (two files concatenated) stays data. `newline=None` (universal newlines) reads ``\r\n`` as ``\n``;
    the CSV reader passes ``""`` and lets `csv` handle line ends inside quoted fields.

    Raises:
        DataError: the file does not exist or cannot be read.
    """
    try:
        return open(path, encoding="utf-8-sig", newline=newline)
    except FileNotFoundError:
        raise DataError("file not found; check the path (or the task's data root)", path) from None
    except OSError as error:
        raise DataError(f"cannot read the file ({error.strerror})", path) from None


def _undecodable_line(path: str | os.PathLike) -> int | None:
    """The 1-based line of the first byte sequence that is not UTF-8 (read again in chunks; error path only)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as error:
                    return line + chunk[: error.start].count(b"\n")
                line += chunk.count(b"\n")
    except OSError:
        return None
    return None


def not_utf8(path: str | os.PathLike, error: UnicodeDecodeError) -> DataError:
    """The one error for a data file that is not UTF-8 text: the file, the line, what it probably is, the fix."""
    name = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            start = handle.read(2)
    except OSError:
        start = b""
    if start in (b"\xff\xfe", b"\xfe\xff"):
        return DataError(f"UTF-16 text (e.g. Excel's 'Unicode Text'), not UTF-8; convert it: "
                         f"iconv -f UTF-16 -t UTF-8 {name} > {name}.utf8 (or save as 'CSV UTF-8')", path)
    return DataError(f"not UTF-8 text ({error.reason}); a Latin-1 or Windows-1252 file? convert it: "
                     f"iconv -f latin1 -t UTF-8 {name} > {name}.utf8 (for GBK: -f GBK)", path,
                     _undecodable_line(path))


def iter_rows(path: str | os.PathLike, file_format: str) -> Iterator[tuple[int, list[str] | dict]]:
    """(1-based line, row) for every non-blank record: lists for TSV/CSV, dicts (or lists) for JSON Lines.

    A byte-order mark at the start of the file is skipped (`open_text`); line ends may be ``\r\n``.
    """
    handle = open_text(path, newline="" if file_format == "csv" else None)
    with handle:
        try:
            if file_format == "csv":
                reader = csv.reader(handle)
                for row in reader:
                    if row and any(cell.strip() for cell in row):
                        yield reader.line_num, row
                return
            for number, text in enumerate(handle, start=1):
                text = text.rstrip("\r\n")
                if not text.strip():
                    continue
                if file_format == "jsonl":
                    if text.startswith(BOM):
                        raise DataError("a byte-order mark (U+FEFF) in the middle of the file (files joined "
                                        "together?); remove it", path, number)
                    try:
                        yield number, json.loads(text)
                    except json.JSONDecodeError as error:
                        raise DataError(f"not a JSON object ({error.msg}); a .jsonl file holds one object per "
                                        "line", path, number) from None
                else:
                    yield number, text.split("\t")
        except UnicodeDecodeError as error:
            raise not_utf8(path, error) from None


def no_rows(path: str | os.PathLike, header_line: int | None = None) -> DataError:
    """The error for a file without a single data row: empty, or a header and nothing else."""
    if header_line is not None:
        return DataError("holds only the header row, no examples; is this the right file?", path, header_line)
    return DataError("the file is empty (no rows); is this the right file?", path)


def _cell(row: list[str] | dict, column: Column, header: dict[str, int] | None) -> object:
    if isinstance(row, dict):
        return row.get(column) if isinstance(column, str) else None
    index = header[column] if isinstance(column, str) else column
    return row[index] if -len(row) <= index < len(row) else None


def read_classification(
    path: str | os.PathLike,
    *,
    text_a: Column,
    text_b: Column | None = None,
    label: Column | None = None,
    header: bool | None = None,
    regression: bool = False,
    file_format: str | None = None,
    on_invalid: str = "error",
    report: DataReport | None = None,
    multi_label: bool = False,
    label_separator: str = ",",
    id_column: Column | None = None,
) -> list[ClassificationExample]:
    """Read a classification/regression table.

    Args:
        path: the file (.tsv/.txt: tab-separated, no quoting; .csv; .jsonl).
        text_a, text_b, label: columns by header name (JSON key) or 0-based index (negative counts from the
            end, e.g. -1 for STS-B's score); `label=None` reads an unlabeled file (prediction only).
        header: whether the first row names the columns; None: yes exactly when a column is given by name.
        regression: parse labels as floats.
        file_format: "tsv", "csv" or "jsonl" (default from the file name).
        on_invalid: "error" (default) raises DataError at the first malformed row; "skip" drops it, counted
            in the report as `skipped_<reason>`.
        report: where counts go (a new one when None; read it from the returned examples' caller).
        id_column: the column of each row's id (header name, JSON key or index); None: the first header name
            (JSON key) in `ID_COLUMNS` that no other role uses, else each row's "file:line".
        multi_label: each row has any number of labels: a JSON list in JSONL (``"label": ["PER", "LOC"]``),
            else the cell split on `label_separator` ("PER,LOC"); an empty list or cell is a row without
            labels (counted as `rows_without_labels`).
        label_separator: what separates a multi-label cell's labels.

    Returns:
        The examples, in file order.

    Raises:
        DataError: a missing file, a file that is not UTF-8, an empty or header-only file, an unknown column
            name, or (with on_invalid="error") a malformed row.
    """
    if on_invalid not in ON_INVALID:
        raise ConfigError(f"on_invalid={on_invalid!r}; use one of {ON_INVALID}")
    report = report if report is not None else DataReport()
    file_format = detect_format(path, file_format)
    columns = {"text_a": parse_column(text_a), "text_b": parse_column(text_b), "label": parse_column(label),
               "id": parse_column(id_column)}
    if columns["text_a"] is None:
        raise ConfigError("text_a column is required (a header name or a 0-based index)")
    named = any(isinstance(c, str) for c in columns.values())
    if header is None:
        header = named and file_format != "jsonl"
    if file_format != "jsonl" and named and not header:
        raise ConfigError(f"{path}: columns are given by name {[c for c in columns.values() if isinstance(c, str)]} "
                          "but header=False; give 0-based indices or set header=True")
    names: dict[str, int] | None = None
    header_line: int | None = None
    width: int | None = None
    records = 0
    examples: list[ClassificationExample] = []
    for line, row in iter_rows(path, file_format):
        where = f"{os.fspath(path)}:{line}"
        if header and names is None:
            header_line = line
            names = {str(name).strip(): i for i, name in enumerate(row)}
            if columns["id"] is None:
                columns["id"] = default_id_column(names, columns)
            width = len(row)
            for role, column in columns.items():
                if isinstance(column, str) and column not in names:
                    raise DataError(f"no column named {column!r} for {role}; the header has {list(names)}", path, line)
            continue
        records += 1
        if isinstance(row, list):
            if width is None:
                width = len(row)
            needed = [c for c in columns.values() if isinstance(c, int)]
            if len(row) != width or any(not -len(row) <= c < len(row) for c in needed):
                invalid(report, on_invalid, "column_count",
                        f"{len(row)} columns where {'the header has' if header else 'the first row has'} {width} "
                        "(a stray tab or quote in the text?)", path, line)
                continue
        elif not isinstance(row, dict):
            invalid(report, on_invalid, "not_an_object", "expected a JSON object per line", path, line)
            continue
        values = {role: (None if column is None else _cell(row, column, names)) for role, column in columns.items()}
        problem = None
        first = values["text_a"]
        second = values["text_b"]
        if not isinstance(first, str) or not first.strip():
            problem = ("empty_text", "text_a is missing or empty")
        elif columns["text_b"] is not None and (not isinstance(second, str) or not second.strip()):
            problem = ("empty_text", "text_b is missing or empty")
        value: str | float | None = None
        if problem is None and columns["label"] is not None and multi_label:
            value, problem = multi_label_value(values["label"], label_separator)
            if problem is None and not value:
                report.note("rows_without_labels", where)
        elif problem is None and columns["label"] is not None:
            raw = values["label"]
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                problem = ("empty_label", "the label is missing or empty")
            elif regression:
                try:
                    value = float(raw)
                    if not math.isfinite(value):
                        raise ValueError(raw)
                except (TypeError, ValueError):
                    problem = ("bad_label", f"label {raw!r} is not a number (regression task)")
            else:
                value = json.dumps(raw) if isinstance(raw, bool) else str(raw).strip()
        if problem is not None:
            invalid(report, on_invalid, problem[0], problem[1], path, line)
            continue
        if isinstance(row, dict) and id_column is None:
            values["id"] = row.get(default_id_column(row, columns) or "")
        row_id = "" if values["id"] is None else str(values["id"]).strip()
        examples.append(ClassificationExample(first, second if columns["text_b"] is not None else None, value, where,
                                              row_id))
        report.note("rows")
    if not records:
        raise no_rows(path, header_line)
    return examples


def multi_label_value(raw: object, separator: str) -> tuple[tuple[str, ...], tuple[str, str] | None]:
    """(labels, problem) of a multi-label cell: a JSON list of names, or a string split on `separator`.
    Duplicates are dropped (order kept); a missing value is a problem, an empty list is none."""
    if raw is None:
        return (), ("empty_label", "the label is missing (a row without labels has [] or an empty cell)")
    if isinstance(raw, list):
        if not all(isinstance(x, str | int) and not isinstance(x, bool) and str(x).strip() for x in raw):
            return (), ("bad_label", f"label {raw!r}: a multi-label list holds label names (strings)")
        names = [str(x).strip() for x in raw]
    elif isinstance(raw, str | int) and not isinstance(raw, bool):
        names = [part.strip() for part in str(raw).split(separator) if part.strip()] if separator else [str(raw)]
    else:
        return (), ("bad_label", f"label {raw!r}: give a list of label names or a {separator!r}-separated string")
    return tuple(dict.fromkeys(names)), None


def default_id_column(names: Iterable[str], columns: dict[str, Column | None]) -> str | None:
    """The first of `ID_COLUMNS` among a header's names (a JSON row's keys) that no other column role uses."""
    taken = {column for role, column in columns.items() if role != "id"}
    present = set(names)
    return next((name for name in ID_COLUMNS if name in present and name not in taken), None)


def sorted_labels(labels: Sequence[str]) -> list[str]:
    """Distinct labels in a stable order: numerically when every label is an integer, else by string."""
    distinct = set(labels)
    if all(label.lstrip("-").isdigit() for label in distinct):
        return sorted(distinct, key=int)
    return sorted(distinct)


def label_list(examples: Sequence[ClassificationExample]) -> list[str]:
    """The label names seen in (training) examples, in `sorted_labels` order."""
    labels = [e.label for e in examples if e.label is not None]
    if not labels:
        raise DataError("no labelled examples; a training file needs a label column")
    names = [name for label in labels for name in (label if isinstance(label, tuple) else (label,))]
    if not names:
        raise DataError("no row of the training file has a label; a multi-label file needs some labels")
    return sorted_labels(names)


def check_labels(examples: Sequence[ClassificationExample], label2id: dict[str, int]) -> None:
    """Raise a DataError for the first label that the model does not know (e.g. a dev label absent in train)."""
    for example in examples:
        names = example.label if isinstance(example.label, tuple) else (example.label,)
        for name in names:
            if name is not None and name not in label2id:
                path, _, line = example.source.rpartition(":")
                raise DataError(f"label {name!r} was never seen in training (known labels: {sorted(label2id)}); "
                                "fix the row, add training examples of it, or list it in --labels", path, int(line))
