"""Sentence-embedding training data as people have it: (anchor, positive) pairs, (anchor, positive, negative)
triplets, and scored pairs (STS style), in TSV, CSV or JSON Lines.

Owns `TextGroup` (the texts of one training example, in role order, and its score), `read_text_groups`,
the one reader of such tables, and `write_text_groups`, their writer (mined triplets, teacher margins). Files go through `data.files` (byte-order marks, line ends, non-UTF-8, empty
files, the bad-row policy), so the official STS-B TSV reads as shipped: its `sentence1`, `sentence2` and
`score` columns by name. What the texts are for (in-batch negatives, CoSENT) is the embedding family's.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bertforge.data.files import (
    Column,
    cell,
    check_on_invalid,
    default_id_column,
    detect_format,
    invalid,
    iter_rows,
    no_rows,
    parse_column,
)
from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError
from bertforge.storage import open_atomic


@dataclass(frozen=True)
class TextGroup:
    """One training example: `texts` in role order (anchor, positive, then hard negatives; or the two
    sentences of a scored pair), its `score` (scored pairs, margins; a tuple of one per candidate after the
    anchor for distillation by KL; None otherwise), where it came from ("file:line")
    and its id."""

    texts: tuple[str, ...]
    score: float | tuple[float, ...] | None
    source: str
    id: str = ""


def _score(raw: object) -> float | None:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_text_groups(path: str | os.PathLike, *, texts: Sequence[Column],
                     score: Column | Sequence[Column] | None = None,
                     header: bool | None = None, file_format: str | None = None, on_invalid: str = "error",
                     report: DataReport | None = None, id_column: Column | None = None) -> list[TextGroup]:
    """Read a table of text groups.

    Args:
        path: the file (.tsv/.txt: tab-separated, no quoting; .csv; .jsonl).
        texts: the text columns in role order (header names, JSON keys or 0-based indices), at least two.
        score: the score column of scored pairs or margins (a number), or a list of them (a score per
            candidate, read as a tuple); None for pairs and triplets.
        header: whether the first row names the columns; None: yes when a column is given by name (JSONL
            always has names).
        on_invalid: "error" raises at the first malformed row; "skip" drops it, counted as `skipped_<reason>`.
        id_column: each row's id column; None: a column named index/id/... when present, else "file:line".

    Raises:
        DataError: a missing, empty or non-UTF-8 file, an unknown column name (the message lists the file's
            columns), or with on_invalid="error" a malformed row (empty text, a score that is not a number).
    """
    check_on_invalid(on_invalid)
    if len(texts) < 2:
        raise ConfigError("an embedding file needs at least two text columns (anchor and positive)")
    report = report if report is not None else DataReport()
    file_format = detect_format(path, file_format)
    columns = [parse_column(c) for c in texts]
    several = isinstance(score, list | tuple)
    score_columns = [parse_column(c) for c in (score if several else [score] if score is not None else [])]
    id_given = parse_column(id_column)
    named = [c for c in (*columns, *score_columns, id_given) if isinstance(c, str)]
    header = (bool(named) and file_format != "jsonl") if header is None else header
    names: dict[str, int] | None = None
    width = header_line = None
    groups: list[TextGroup] = []
    records = 0
    for line, row in iter_rows(path, file_format):
        if header and names is None:
            names = {str(name).strip(): i for i, name in enumerate(row)}
            width, header_line = len(row), line
            for column in named:
                if column not in names:
                    raise DataError(f"no column named {column!r}; the header has {list(names)} (name the columns "
                                    "with --text-a / --text-b / --negative-column / --label)", path, line)
            continue
        records += 1
        if isinstance(row, list):
            width = width or len(row)
            if len(row) != width:
                invalid(report, on_invalid, "column_count", f"{len(row)} columns where the file has {width}",
                        path, line)
                continue
        elif not isinstance(row, dict):
            invalid(report, on_invalid, "not_an_object", "expected a JSON object per line", path, line)
            continue
        values = [cell(row, column, names) for column in columns]
        empty = next((i for i, v in enumerate(values) if not isinstance(v, str) or not v.strip()), None)
        if empty is not None:
            missing = "missing" if values[empty] is None else "empty"
            keys = f" (this line has keys {sorted(row)})" if isinstance(row, dict) else ""
            invalid(report, on_invalid, "empty_text", f"text column {texts[empty]!r} is {missing}{keys}", path, line)
            continue
        values_read = [_score(cell(row, c, names)) for c in score_columns]
        bad = next((i for i, v in enumerate(values_read) if v is None), None)
        if bad is not None:
            invalid(report, on_invalid, "bad_label", f"score {cell(row, score_columns[bad], names)!r} (column "
                    f"{score_columns[bad]!r}) is not a finite number", path, line)
            continue
        value = tuple(values_read) if several else values_read[0] if values_read else None
        ident_column = id_given if id_given is not None else default_id_column(
            row if isinstance(row, dict) else (names or {}), {"text": None})
        ident = cell(row, ident_column, names) if ident_column is not None else None
        where = f"{os.fspath(path)}:{line}"
        groups.append(TextGroup(tuple(values), value, where, "" if ident is None else str(ident).strip() or where))
        report.note("rows")
    if not records:
        raise no_rows(path, header_line)
    return groups


def _one_line(text: str) -> str:
    return " ".join(text.replace("\t", " ").splitlines())


def write_text_groups(path: str | os.PathLike, columns: Sequence[str], rows: Iterable[Sequence[str | float]]) -> int:
    """Write rows under a header of `columns`, atomically, in the format the name says: .jsonl (one object per
    row), .csv (standard quoting) or else TSV (tabs and line breaks inside a text become spaces: TSV has no
    quoting). Numbers are written as Python prints them (round-trip exact). Returns the rows written."""
    file_format = detect_format(path)
    count = 0
    with open_atomic(path, newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n") if file_format == "csv" else None
        if writer is not None:
            writer.writerow(columns)
        elif file_format == "tsv":
            handle.write("\t".join(columns) + "\n")
        for row in rows:
            if len(row) != len(columns):
                raise ValueError(f"a row of {len(row)} values for {len(columns)} columns")
            if writer is not None:
                writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
            elif file_format == "jsonl":
                handle.write(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n")
            else:
                handle.write("\t".join(repr(v) if isinstance(v, float) else _one_line(v) for v in row) + "\n")
            count += 1
    return count
