"""The metadata fields a vector folder stores with every record (`bertforge embed --field NAME[:TYPE]`), what
filters are evaluated on (`filters`).

Owns: the field types (`FIELD_TYPES`, `FieldSpec`: a name and a type, as the manifest's "fields" lists them),
the one rule that turns a value into a field's typed value (`typed_value`: a record's JSON value or table cell,
and a filter's value alike), a shard's metadata as an Arrow table (`shard_metadata`: one row per vector row, a
chunk's row holding its record's values) and its bytes in Apache Parquet (`parquet_bytes`, `read_parquet`).
Which file holds them is `store`'s (one Parquet file a shard, checksummed like the other shard files); how a
record's columns are read is `data.corpus_records.record_fields`.

Types, and how a value is read (a JSON value of the type as it is; text, i.e. a TSV/CSV cell or a JSON string,
by the type's syntax):
- string (the default): text as it is;
- int (Arrow int64): a JSON integer (or a number with no fraction), or text "2020";
- float (Arrow float64): a JSON number, or text "0.25"; finite only;
- bool: a JSON true/false, or text true/false/1/0 (any case);
- date (Arrow date32): text "2024-05-01" (ISO 8601);
- datetime (Arrow timestamp[us, UTC]): text "2024-05-01T12:30:00+02:00" (ISO 8601); without an offset it is
  taken as UTC, a date alone as its midnight.
Dates are typed, not strings: a filter compares them as dates and times (`year>=2020` on an int, `published
>= 2024-01-01` on a date), and a value of another syntax is refused when the folder is written, not compared
wrongly later. A record without the field, a JSON null and an empty cell (or empty string, for a type other
than string) hold no value (null): they match no filter condition but `!=` and `not in`.

pyarrow is imported only where fields are used (the search extra); a folder without fields never needs it.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bertforge.data.corpus_records import Record, record_fields
from bertforge.errors import ConfigError, DataError, InputError

FIELD_TYPES = ("string", "int", "float", "bool", "date", "datetime")
DEFAULT_FIELD_TYPE = "string"
# Characters a filter clause uses around a field name (`cli` syntax of `filters`): a field name has none.
RESERVED = re.compile(r"[=!<>{}\[\]]")
EXTRA = "pip install 'bertforge[search]' (pyarrow)"
INTEGER = re.compile(r"^[+-]?\d+$")
TRUE, FALSE = ("true", "1"), ("false", "0")
# What a value of each type looks like, for the messages that refuse one.
SYNTAX = {"string": "a string", "int": "a 64-bit integer (e.g. 2020)", "float": "a number (e.g. 0.25)",
          "bool": "true or false", "date": "an ISO date (e.g. 2024-05-01)",
          "datetime": "an ISO date-time (e.g. 2024-05-01T12:30:00+02:00)"}


def import_pyarrow() -> Any:
    """pyarrow (with its compute and parquet modules loaded), or one error naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.compute  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError(f"metadata fields are stored and filtered with pyarrow: {EXTRA}") from None
    return pyarrow


@dataclass(frozen=True)
class FieldSpec:
    """One metadata field: its name (a JSON Lines key, a TSV/CSV header name) and type (`FIELD_TYPES`)."""

    name: str
    type: str = DEFAULT_FIELD_TYPE

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or self.name != self.name.strip():
            raise ConfigError(f"a field name must be a non-blank name without spaces around it, got {self.name!r}")
        if RESERVED.search(self.name):
            raise ConfigError(f"field name {self.name!r} holds one of = ! < > {{ }} [ ], which filters use; rename "
                              "the key or column")
        if self.type not in FIELD_TYPES:
            raise ConfigError(f"field {self.name!r}: type {self.type!r} is not one of {', '.join(FIELD_TYPES)}; "
                              f"declare it as --field {self.name}:TYPE (a name holding ':' ends with its type, "
                              f"e.g. --field {self.name}:{self.type}:string)")

    def __str__(self) -> str:
        return f"{self.name}:{self.type}"

    def record(self) -> dict[str, str]:
        """The manifest's entry: {"name", "type"}."""
        return {"name": self.name, "type": self.type}

    def arrow_type(self) -> Any:
        pa = import_pyarrow()
        return {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
                "date": pa.date32(), "datetime": pa.timestamp("us", tz="UTC")}[self.type]


def parse_field(text: str | FieldSpec) -> FieldSpec:
    """`--field NAME[:TYPE]` as a `FieldSpec` (TYPE one of `FIELD_TYPES`, default string; a name holding ':'
    is given with its type, e.g. "a:b:string").

    Raises:
        ConfigError: a type that is not one of `FIELD_TYPES`, a bad name.
    """
    if isinstance(text, FieldSpec):
        return text
    name, sep, kind = str(text).rpartition(":")
    return FieldSpec(name, kind) if sep else FieldSpec(str(text))


def parse_fields(given: Sequence[str | FieldSpec] | None) -> tuple[FieldSpec, ...]:
    """The fields of `--field` flags, each name once.

    Raises:
        ConfigError: a bad name or type, or a name given twice.
    """
    specs = tuple(parse_field(item) for item in given or ())
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"field {twice[0]!r} is given twice; give each --field once")
    return specs


def fields_of(manifest: dict[str, Any]) -> tuple[FieldSpec, ...]:
    """The fields a manifest records (none for a folder embedded without --field)."""
    return tuple(FieldSpec(entry["name"], entry["type"]) for entry in manifest.get("fields") or ())


def typed_value(spec: FieldSpec, value: Any) -> Any:
    """`value` (a JSON value, or text: a cell, a JSON string, a filter's value) as a value of `spec`'s type
    (module docstring); None for a missing value (None, or an empty string for a type other than string).

    Raises:
        InputError: a value of another type or syntax, saying what the field's type reads.
    """
    if value is None or (value == "" and spec.type != "string"):
        return None
    kind, text = spec.type, value.strip() if isinstance(value, str) else None
    try:
        if kind == "string" and isinstance(value, str):
            return value
        if kind == "int":
            number = (value if isinstance(value, int) and not isinstance(value, bool)
                      else int(value) if isinstance(value, float) and value.is_integer()
                      else int(text) if text is not None and INTEGER.match(text) else None)
            if number is not None and -2**63 <= number < 2**63:  # Arrow int64
                return number
        elif kind == "float":
            number = (float(value) if isinstance(value, int | float) and not isinstance(value, bool)
                      else float(text) if text is not None else None)
            if number is not None and math.isfinite(number):
                return number
        elif kind == "bool":
            if isinstance(value, bool):
                return value
            if text is not None and text.lower() in TRUE + FALSE:
                return text.lower() in TRUE
        elif kind == "date" and text is not None:
            return dt.date.fromisoformat(text)
        elif kind == "datetime" and text is not None:
            moment = dt.datetime.fromisoformat(text)
            return (moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment).astimezone(dt.UTC)
    except (ValueError, OverflowError):
        pass
    raise InputError(f"{value!r} is not {SYNTAX[kind]}")


def record_values(record: Record, specs: Sequence[FieldSpec]) -> list[Any]:
    """One record's typed values of `specs` (None where it has none).

    Raises:
        DataError: a table whose header lacks a field, a value the field's type does not read; naming the
            file and line, the field and the fix.
    """
    raw = record_fields(record, [spec.name for spec in specs], "--field")
    values = []
    for spec, value in zip(specs, raw):
        try:
            values.append(typed_value(spec, value))
        except InputError as error:
            raise DataError(f"field {spec.name!r} ({spec.type}): {error}; fix the record, or declare the field's "
                            f"type to match (--field {spec.name}:TYPE, TYPE one of {', '.join(FIELD_TYPES)})",
                            record[0].path, record[1]) from None
    return values


def shard_metadata(specs: Sequence[FieldSpec], values: Sequence[Sequence[Any]], owners: Sequence[int]) -> Any:
    """A shard's metadata: a pyarrow Table with one column per field and one row per vector row, row i holding
    the values of record `owners[i]` (its place among `values`, the records' `record_values`; a chunked
    record's rows repeat them)."""
    pa = import_pyarrow()
    columns = {spec.name: pa.array([values[owner][column] for owner in owners], type=spec.arrow_type())
               for column, spec in enumerate(specs)}
    return pa.table(columns, schema=arrow_schema(specs))


def arrow_schema(specs: Sequence[FieldSpec]) -> Any:
    pa = import_pyarrow()
    return pa.schema([pa.field(spec.name, spec.arrow_type()) for spec in specs])


def parquet_bytes(table: Any) -> bytes:
    """A metadata table as the bytes of one Parquet file (the same table: the same bytes, so a resumed embed
    rewrites a shard as it was)."""
    pa = import_pyarrow()
    buffer = io.BytesIO()
    pa.parquet.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def read_parquet(path: Any, specs: Sequence[FieldSpec], rows: int) -> Any:
    """The metadata table of one shard's Parquet file, checked to hold exactly the fields `specs` name and
    `rows` rows.

    Raises:
        ValueError: an unreadable file or another schema (the caller names the shard and the fix).
    """
    pa = import_pyarrow()
    try:
        table = pa.parquet.read_table(path)
    except (OSError, pa.ArrowException) as error:
        raise ValueError(str(error)) from None
    if not table.schema.equals(arrow_schema(specs)):
        raise ValueError(f"it holds fields {table.schema.names}, the manifest records {[str(s) for s in specs]}")
    if table.num_rows != rows:
        raise ValueError(f"{table.num_rows} rows of metadata, the shard holds {rows}")
    return table


def joined_metadata(tables: Sequence[Any], specs: Sequence[FieldSpec]) -> Any:
    """Consecutive rows' metadata tables as one (an empty table of the fields for none)."""
    return import_pyarrow().concat_tables(tables) if tables else arrow_schema(specs).empty_table()


__all__ = ["DEFAULT_FIELD_TYPE", "FIELD_TYPES", "FieldSpec", "arrow_schema", "fields_of",
           "import_pyarrow", "joined_metadata", "parquet_bytes", "parse_field", "parse_fields", "read_parquet", "record_values",
           "shard_metadata", "typed_value"]
