"""Fine-tuning data files as people have them: opening, decoding, rows with line numbers, the bad-row policy.

Every fine-tuning reader (`classification`, `tagging`, `question_answering`, `multiple_choice`) and
`bertforge predict` take their files through this module, so a quirk is handled once, the same way:

- A UTF-8 byte-order mark at the very start of a file is skipped (GLUE's MRPC files begin with one); one in
  the middle of a file (two files concatenated) is data, or in JSON Lines an error naming the line.
- Any line ending (``\\n``, ``\\r\\n``).
- A file that is not UTF-8 (Latin-1, cp1252, UTF-16) is one `DataError` naming the file, the first line
  that does not decode and the conversion command (`not_utf8`).
- An empty or header-only file is a `DataError` (`no_rows`), not an empty training set.
- Tables: TSV (tab-separated, no quoting: `csv.QUOTE_NONE` semantics), CSV (standard quoting, fields may
  span lines) and JSON Lines, read as (1-based line, row) pairs (`iter_rows`); columns named by header name
  (JSON key) or 0-based index (`parse_column`, `cell`); a row-id column found by its usual names
  (`ID_COLUMNS`, `default_id_column`).
- A malformed row is a `DataError` naming file and line, or with ``on_invalid="skip"`` is dropped and
  counted in the `DataReport` as ``skipped_<reason>`` (`invalid`).

What a row means (texts, labels, tags, answers) is each reader's.
"""

from __future__ import annotations

import codecs
import csv
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError

ON_INVALID = ("error", "skip")
# Header names (JSON keys) of a row-id column, taken as the id when no id column is named: GLUE's test files
# have `index` (QQP `id`), ChnSentiCorp `qid`.
ID_COLUMNS = ("index", "id", "idx", "qid", "guid")
FILE_FORMATS = ("tsv", "csv", "jsonl")
BOM = "\ufeff"

Column = int | str


def check_on_invalid(on_invalid: str) -> None:
    """ConfigError unless `on_invalid` is one of `ON_INVALID`."""
    if on_invalid not in ON_INVALID:
        raise ConfigError(f"on_invalid={on_invalid!r}; use one of {ON_INVALID}")


def invalid(report: DataReport, on_invalid: str, reason: str, message: str, path: str | os.PathLike,
            line: int | None) -> None:
    """Raise a DataError for a bad row, or count it as skipped (`on_invalid="skip"`)."""
    if on_invalid == "error":
        raise DataError(message + " (pass on_invalid='skip' / --on-invalid skip to drop such rows, counted)",
                        path, line)
    report.note(f"skipped_{reason}", f"{os.fspath(path)}:{line}")


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


def open_text(path: str | os.PathLike, newline: str | None = None) -> TextIO:
    """Open a fine-tuning data file as UTF-8 text, skipping a byte-order mark at its very start.

    "utf-8-sig" drops U+FEFF only as the first character of the stream, so a BOM in the middle of a file
    (two files concatenated) stays data. `newline=None` (universal newlines) reads ``\\r\\n`` as ``\\n``;
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


def undecodable_line(path: str | os.PathLike) -> int | None:
    """The 1-based line of the first byte sequence that is not UTF-8 (read again in chunks; error path only).
    Lines end at "\n", "\r\n" or a lone "\r", as universal newlines read them."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as error:
                    return line + _line_ends(chunk[: error.start])
                line += _line_ends(chunk)
    except OSError:
        return None
    return None


def _line_ends(data: bytes) -> int:
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


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
                     undecodable_line(path))


def read_text(path: str | os.PathLike) -> str:
    """The whole file as text: a byte-order mark at the start skipped, not-UTF-8 and empty files refused."""
    with open_text(path) as handle:
        try:
            raw = handle.read()
        except UnicodeDecodeError as error:
            raise not_utf8(path, error) from None
    if not raw.strip():
        raise no_rows(path)
    return raw


def iter_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line, text without its line end) for every line, blank ones included.

    A byte-order mark at the start of the file is skipped (`open_text`); line ends may be ``\\r\\n``.
    """
    with open_text(path) as handle:
        try:
            for number, text in enumerate(handle, start=1):
                yield number, text.rstrip("\r\n")
        except UnicodeDecodeError as error:
            raise not_utf8(path, error) from None


def _csv_rows(path: str | os.PathLike) -> Iterator[tuple[int, list[str]]]:
    # `newline=""` lets `csv` see the line ends, so a quoted field may hold one; a row's number is its last
    # line.
    with open_text(path, newline="") as handle:
        try:
            reader = csv.reader(handle)
            for row in reader:
                if row and any(cell.strip() for cell in row):
                    yield reader.line_num, row
        except UnicodeDecodeError as error:
            raise not_utf8(path, error) from None


# Untrusted JSON (a request body, a line of a user's file): how deep it may nest and how many digits a number
# may have. Python's decoder would otherwise overflow its stack on ~1,000 nested brackets and refuse integers of
# over 4,300 digits with a bare ValueError, both far from any input a model reads.
MAX_JSON_DEPTH = 64
MAX_NUMBER_DIGITS = 100


class UntrustedJson(ValueError):
    """JSON that `decode_json` refuses: malformed, too deep, a number too long, or a lone surrogate."""


# A JSON string literal (its escapes included): removed before counting brackets, which inside strings are text.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _json_depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings, counted without recursion (vectorised: a body of
    megabytes is measured in milliseconds)."""
    codes = np.frombuffer(_JSON_STRING.sub("", text).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    steps = np.isin(codes, (91, 123)).astype(np.int64) - np.isin(codes, (93, 125)).astype(np.int64)  # [{ ]}
    return int(np.cumsum(steps).max(initial=0))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _value_depth(value: Any) -> int:
    """The deepest nesting of lists and dicts in a decoded JSON value (iterative: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return deepest


def _number(text: str, kind: type) -> Any:
    if len(text) > MAX_NUMBER_DIGITS:
        raise UntrustedJson(f"a number of {len(text)} characters (at most {MAX_NUMBER_DIGITS})")
    return kind(text)


def _whole_or_float(text: str) -> Any:
    value = _number(text, float)
    return int(value) if value.is_integer() else value


def decode_json(text: str, unique_keys: bool = False, whole_numbers: bool = False) -> Any:
    """The value of untrusted JSON text, decided before anything else runs on it; with `unique_keys`, an object
    naming a key twice is refused (JSON leaves it undefined; Python keeps the last, silently). With
    `whole_numbers`, a number written with a fraction or exponent whose value is whole (`5.0`, `1e3`) is an int,
    as JSON Schema counts it (an "integer" field of an OpenAPI document takes `5.0`).

    Raises:
        UntrustedJson: malformed JSON; a key given twice in one object (`unique_keys`); nesting deeper than
            `MAX_JSON_DEPTH`; a number longer than
            `MAX_NUMBER_DIGITS`; a string holding a lone UTF-16 surrogate (JSON's "\\ud800" escape), which is
            not text, cannot be written back as UTF-8 and is refused rather than replaced.
    """
    # The C decoder itself stops at the interpreter's recursion limit; only then is the text measured (slowly),
    # for the message. Otherwise the decoded value is measured, which costs one step per container, not per
    # character: a body of megabytes of text is decided in milliseconds (an over-budget request must be).
    try:
        floats = _whole_or_float if whole_numbers else lambda s: _number(s, float)
        value = json.loads(text, parse_int=lambda s: _number(s, int), parse_float=floats,
                           parse_constant=lambda name: _refuse_constant(name),
                           object_pairs_hook=_unique_object if unique_keys else None)
    except RecursionError:
        value, depth = None, _json_depth(text)
    except json.JSONDecodeError as error:
        raise UntrustedJson(f"not valid JSON ({error.msg}, line {error.lineno} column {error.colno})") from None
    else:
        depth = _value_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise UntrustedJson(f"JSON nested {depth} levels deep (at most {MAX_JSON_DEPTH})")
    # A lone surrogate can only come from a \\uD800-\\uDFFF escape (the text itself is decoded UTF-8).
    # A backslash is searched at memchr speed; the pattern only where escapes exist.
    if "\\" not in text or _SURROGATE_ESCAPE.search(text) is None:
        return value
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        bad = error.object[error.start:error.end].encode("unicode_escape").decode("ascii")
        raise UntrustedJson(f"a string holds a lone surrogate ({bad}), which is not a character; send valid "
                            "Unicode text") from None
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise UntrustedJson(f"the key {twice!r} appears twice in one object; give each key once")
    return value


def _refuse_constant(name: str) -> Any:
    raise UntrustedJson(f"{name} is not a JSON number; send a finite number or null")


def _json_row(path: str | os.PathLike, number: int, text: str) -> object:
    if text.startswith(BOM):
        raise DataError("a byte-order mark (U+FEFF) in the middle of the file (files joined together?); "
                        "remove it", path, number)
    try:
        return decode_json(text)
    except UntrustedJson as error:
        raise DataError(f"not a JSON object: {error}; a .jsonl file holds one JSON object per line", path,
                        number) from None


def iter_rows(path: str | os.PathLike, file_format: str) -> Iterator[tuple[int, list[str] | dict]]:
    """(1-based line, row) for every non-blank record: lists for TSV/CSV, dicts (or lists) for JSON Lines.

    A byte-order mark at the start of the file is skipped (`open_text`); line ends may be ``\\r\\n``.
    """
    if file_format == "csv":
        yield from _csv_rows(path)
        return
    for number, text in iter_lines(path):
        if not text.strip():
            continue
        if file_format == "jsonl":
            yield number, _json_row(path, number, text)
        else:
            yield number, text.split("\t")


def no_rows(path: str | os.PathLike, header_line: int | None = None) -> DataError:
    """The error for a file without a single data row: empty, or a header and nothing else."""
    if header_line is not None:
        return DataError("holds only the header row, no examples; is this the right file?", path, header_line)
    return DataError("the file is empty (no rows); is this the right file?", path)


def parse_column(spec: Column | None) -> Column | None:
    """A column given as a header name or a 0-based index; strings of digits (from a command line) are indices."""
    if spec is None or isinstance(spec, int):
        return spec
    spec = str(spec).strip()
    return int(spec) if spec.lstrip("-").isdigit() else spec


def cell(row: list[str] | dict, column: Column, header: dict[str, int] | None) -> object:
    """A row's value in `column` (a header name, JSON key or index), None where the row has no such cell."""
    if isinstance(row, dict):
        return row.get(column) if isinstance(column, str) else None
    index = header[column] if isinstance(column, str) else column
    return row[index] if -len(row) <= index < len(row) else None


def default_id_column(names: Iterable[str], columns: dict[str, Column | None]) -> str | None:
    """The first of `ID_COLUMNS` among a header's names (a JSON row's keys) that no other column role uses."""
    taken = {column for role, column in columns.items() if role != "id"}
    present = set(names)
    return next((name for name in ID_COLUMNS if name in present and name not in taken), None)
