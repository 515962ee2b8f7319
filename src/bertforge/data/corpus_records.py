"""Corpus files as (id, text) records, for embedding a corpus (`retrieval.embed_corpus`): which files an input
names, how each kind is read, and the shards records are grouped in.

Records: the non-blank lines of text, TSV and JSON Lines files, the non-empty rows of CSV files (headers
excepted), file after file in `data.text_files.resolve_inputs` order (folders recursively, sorted). A
record's id is its id column / field, else its line ("LINE" for one input file, "PATH:LINE" relative to an
input folder; blank lines count). Shard k holds records k*S .. k*S+S-1 (S = the shard size), whatever the
number of processes reading them. A bad record is one `DataError` naming file and line and the fix.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.data.files import not_utf8, open_text, parse_column
from bertforge.data.text_files import iter_lines, resolve_inputs
from bertforge.errors import ConfigError, DataError

INPUT_FORMATS = ("auto", "text", "tsv", "csv", "jsonl")
FORMATS_BY_SUFFIX = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
DEFAULT_TEXT_COLUMN = "text"
DEFAULT_ID_COLUMN = "id"

Record = tuple["SourceFile", int, Any]  # (file, 1-based line, the line or row, not parsed yet)


@dataclass(frozen=True)
class CorpusSettings:
    """How the input files' records become texts and ids.

    Attributes:
        file_format: "auto" (by file name: .csv, .tsv, .jsonl/.json/.ndjson; anything else one text per
            line) or one of "text", "tsv", "csv", "jsonl" for every file.
        text_column: the TSV/CSV header name (or 0-based index) or JSONL field holding the text.
        id_column: the column or field holding each record's id, required in every record when given;
            None: "id" where a record has one, else the record's line.
    """

    file_format: str = "auto"
    text_column: str | int = DEFAULT_TEXT_COLUMN
    id_column: str | int | None = None

    def __post_init__(self) -> None:
        if self.file_format not in INPUT_FORMATS:
            raise ConfigError(f"input format {self.file_format!r} is not supported; use one of {INPUT_FORMATS}")
        object.__setattr__(self, "text_column", parse_column(self.text_column))
        object.__setattr__(self, "id_column", parse_column(self.id_column))

    def format_of(self, path: Path) -> str:
        return self.file_format if self.file_format != "auto" else FORMATS_BY_SUFFIX.get(path.suffix.lower(), "text")


@dataclass
class SourceFile:
    """One input file: where it is, how ids name it, its format and (tables) its header, read with it."""

    path: Path
    name: str
    file_format: str
    header: dict[str, int] | None = None


def source_files(inputs: str | os.PathLike, settings: CorpusSettings) -> list[SourceFile]:
    """The input's files in reading order; named relative to the input folder (a single file: its name)."""
    root = Path(inputs)
    return [SourceFile(path, path.relative_to(root).as_posix() if root.is_dir() else path.name,
                       settings.format_of(path)) for path in resolve_inputs(inputs)]


def read_records(sources: Sequence[SourceFile], settings: CorpusSettings) -> Iterator[Record]:
    """Every record of every file, in order, unparsed (a table's header is read and checked on the way)."""
    for source in sources:
        yield from (_csv_records if source.file_format == "csv" else _line_records)(source, settings)


def _line_records(source: SourceFile, settings: CorpusSettings) -> Iterator[Record]:
    table = source.file_format == "tsv"
    source.header = None
    for number, line in enumerate(iter_lines(source.path), start=1):
        if not line.strip():
            continue
        if table and source.header is None:
            source.header = check_header(line.split("\t"), settings, source, number)
            continue
        yield source, number, line  # a TSV line is split when parsed: other ranks' lines never are


def _csv_records(source: SourceFile, settings: CorpusSettings) -> Iterator[Record]:
    source.header = None
    with open_text(source.path, newline="") as handle:
        reader = csv.reader(handle)
        start = 1
        try:
            for row in reader:
                # A quoted field may span lines: a row's line is the one it starts on.
                number, start = start, reader.line_num + 1
                if not any(value.strip() for value in row):
                    continue
                if source.header is None:
                    source.header = check_header(row, settings, source, number)
                    continue
                yield source, number, row
        except UnicodeDecodeError as error:
            raise not_utf8(source.path, error) from None
        except csv.Error as error:
            raise DataError(f"malformed CSV ({error}); check the quoting of this row", source.path,
                            reader.line_num) from None


def check_header(row: list[str], settings: CorpusSettings, source: SourceFile, line: int) -> dict[str, int]:
    """A table's column name -> index, with the named text (and id) columns checked against it."""
    header = {name.strip(): index for index, name in enumerate(row)}
    for role, column, flag in (("text", settings.text_column, "--text-column"), ("id", settings.id_column,
                                                                                   "--id-column")):
        if isinstance(column, str) and column not in header:
            raise DataError(f"the header has no {role} column {column!r} (columns: {', '.join(header)}); "
                            f"name one with {flag} NAME (or a 0-based index)", source.path, line)
    return header


def parse_record(record: Record, settings: CorpusSettings, single_file: bool) -> tuple[str, str]:
    """(id, text) of one record.

    Raises:
        DataError: invalid JSON, a missing field or column, a text that is not a string; names file:line.
    """
    source, number, payload = record
    line_id = str(number) if single_file else f"{source.name}:{number}"
    if source.file_format == "text":
        return line_id, payload
    if source.file_format == "jsonl":
        row = _json_object(source, number, payload)
    else:
        row = payload.split("\t") if isinstance(payload, str) else payload
    text = _value(row, settings.text_column, source, number, "--text-column / --text-field")
    if not isinstance(text, str):
        raise DataError(f"the text ({settings.text_column!r}) must be a string, got {type(text).__name__}; "
                        "fix the record", source.path, number)
    named = settings.id_column is not None  # a named id column must be in every record; "id" where it is
    ident = _value(row, settings.id_column if named else DEFAULT_ID_COLUMN, source, number,
                   "--id-column / --id-field" if named else None)
    return (line_id if not named and ident in (None, "") else _id_text(ident, source, number)), text


def record_field(record: Record, column: str | int, flag: str, *, required: bool = True) -> Any:
    """The value in `column` (a header name or 0-based index; a JSON Lines field) of one record of a table or
    JSON Lines file, e.g. a label to colour a map of the corpus by; a record without it: None unless `required`.

    Raises:
        DataError: a text file (no columns), a column the header lacks (naming the columns), a record without
            it, invalid JSON; naming file:line and `flag`, the option that chose the column.
    """
    source, number, _ = record
    row = _columns_row(record, [column], flag, " (or a 0-based index)")
    return _value(row, column, source, number, flag if required else None)


def record_fields(record: Record, columns: Sequence[str], flag: str) -> list[Any]:
    """The values in `columns` (header names, JSON Lines keys) of one record of a table or JSON Lines file, the
    record parsed once (None where a JSON Lines record lacks the key; `bertforge embed --field`).

    Raises:
        DataError: a text file, a table whose header lacks a column (naming the columns), invalid JSON; naming
            file:line and `flag`.
    """
    source, number, _ = record
    row = _columns_row(record, columns, flag, "")
    return [_value(row, column, source, number, None) for column in columns]


def _columns_row(record: Record, columns: Sequence[str | int], flag: str, alternative: str) -> dict | list[str]:
    """A table or JSON Lines record parsed, after checking that a table's header has `columns`."""
    source, number, payload = record
    if source.file_format == "text":
        raise DataError(f"a text file has no columns for {flag}; use a TSV, CSV or JSON Lines input", source.path,
                        number)
    for column in columns:
        if isinstance(column, str) and source.header is not None and column not in source.header:
            raise DataError(f"the header has no column {column!r} (columns: {', '.join(source.header)}); name one "
                            f"with {flag} NAME{alternative}", source.path, number)
    if source.file_format == "jsonl":
        return _json_object(source, number, payload)
    return payload.split("\t") if isinstance(payload, str) else payload


def _json_object(source: SourceFile, number: int, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"not valid JSON ({error.msg}); a .jsonl file holds one JSON object per line: fix or "
                        "remove the line", source.path, number) from None
    if not isinstance(value, dict):
        raise DataError(f"expected a JSON object, got {type(value).__name__}; write one {{\"text\": ...}} per "
                        "line", source.path, number)
    return value


def _value(row: dict | list[str], column: str | int, source: SourceFile, number: int, flag: str | None) -> Any:
    """The row's value in `column`; a missing one is None when `flag` is None, else a DataError."""
    if isinstance(row, dict):
        present = isinstance(column, str) and column in row
        value = row.get(column) if present else None
    else:
        index = source.header.get(column) if isinstance(column, str) and source.header else column
        present = isinstance(index, int) and -len(row) <= index < len(row)
        value = row[index] if present else None
    if present or flag is None:
        return value
    fields = f"fields: {', '.join(sorted(row))}" if isinstance(row, dict) else f"{len(row)} columns"
    raise DataError(f"no {column!r} in this record ({fields}); fix the record or name another with {flag}",
                    source.path, number)


def _id_text(value: Any, source: SourceFile, number: int) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise DataError(f"an id must be a non-empty string or an integer, got {value!r}; fix the record",
                        source.path, number)
    return str(value)


def shard_chunks(records: Iterable[Record], shard_size: int,
                 wanted: Callable[[int], bool]) -> Iterator[tuple[int, int, list[Record] | None]]:
    """(shard index, record count, its records when `wanted(index)` else None) for every shard, in order;
    the records of unwanted shards are counted and dropped as they are read."""
    stream = iter(records)
    for index in itertools.count():
        chunk = list(itertools.islice(stream, shard_size)) if wanted(index) else None
        count = len(chunk) if chunk is not None else sum(1 for _ in itertools.islice(stream, shard_size))
        if not count:
            return
        yield index, count, chunk


