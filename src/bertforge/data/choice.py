"""Multiple-choice data (SWAG style): the reader and its examples.

SWAG's CSV has a header with `sent1` (the context), `sent2` (the start of the next sentence), `ending0` ...
`ending3` and `label` (the right ending's index). Any CSV/TSV/JSONL with such columns reads the same way;
the ending columns are every column named ``ending<N>`` unless given. The features (one ``[CLS] context
[SEP] start + ending [SEP]`` row per choice, a long context windowed the same for every choice) are built
by `families.multiple_choice`. An example's id (what evaluate's predictions carry) is the row's `index`, `id`,
... column (`CHOICE_ID_COLUMNS`; SWAG's is its unnamed first column), else its "file:line".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from bertforge.data.classification import ID_COLUMNS, ON_INVALID, detect_format, invalid, iter_rows, no_rows
from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError

_ENDING = re.compile(r"^ending(\d+)$")
# SWAG's CSV (written by pandas) keeps its row ids in a first column without a name.
CHOICE_ID_COLUMNS = (*ID_COLUMNS, "")


@dataclass
class ChoiceExample:
    """One question: the context, the shared start of every choice, the endings, the right ending's index,
    where it came from ("file:line") and its id (the row's id column, else the source)."""

    context: str
    start: str
    endings: list[str]
    label: int | None
    source: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or self.source


def read_choice(
    path: str | os.PathLike,
    *,
    context_column: str = "sent1",
    start_column: str | None = "sent2",
    ending_columns: Sequence[str] | None = None,
    label_column: str | None = "label",
    file_format: str | None = None,
    on_invalid: str = "error",
    report: DataReport | None = None,
) -> list[ChoiceExample]:
    """Read a SWAG-style multiple-choice file (a header row naming the columns; JSONL: keys).

    Args:
        path: the file (.csv default quoting; .tsv; .jsonl).
        context_column: the context (first segment).
        start_column: text every choice starts with (prepended to each ending), or None.
        ending_columns: the choice columns; None: every column named ending0, ending1, ... in number order.
        label_column: index of the right ending (None for unlabeled files).
        file_format: "csv", "tsv" or "jsonl" (default from the name).
        on_invalid: "error" or "skip" for malformed rows (empty text, bad label, wrong column count).
        report: gets `rows` and `skipped_*`.

    Raises:
        DataError: missing file or column, a file that is not UTF-8, an empty or header-only file, or a
            malformed row with on_invalid="error".
    """
    if on_invalid not in ON_INVALID:
        raise ConfigError(f"on_invalid={on_invalid!r}; use one of {ON_INVALID}")
    report = report if report is not None else DataReport()
    file_format = detect_format(path, file_format)
    header: list[str] | None = None
    header_line: int | None = None
    records = 0
    endings = list(ending_columns) if ending_columns is not None else None
    examples: list[ChoiceExample] = []
    for line, row in iter_rows(path, file_format):  # a leading byte-order mark is skipped there
        if isinstance(row, list) and header is None:
            header_line = line
            header = [name.strip() for name in row]
            if endings is None:
                endings = [name for _, name in sorted((int(m.group(1)), m.string) for m in map(_ENDING.match, header)
                                                      if m)]
            wanted = [context_column, start_column, label_column, *endings]
            missing = [name for name in wanted if name is not None and name not in header]
            if missing or not endings:
                raise DataError(f"columns {missing or ['ending0', '...']} not in the header {header}", path, line)
            continue
        records += 1
        if isinstance(row, list):
            if len(row) != len(header):
                invalid(report, on_invalid, "column_count", f"{len(row)} columns where the header has "
                        f"{len(header)}", path, line)
                continue
            record = dict(zip(header, row))
        elif isinstance(row, dict):
            record = row
            if endings is None:
                endings = [name for _, name in sorted((int(m.group(1)), m.string) for m in map(_ENDING.match, row)
                                                      if m)]
        else:
            invalid(report, on_invalid, "not_an_object", "expected a JSON object per line", path, line)
            continue
        context = record.get(context_column)
        start = record.get(start_column, "") if start_column is not None else ""
        choices = [record.get(name) for name in endings or []]
        if not isinstance(context, str) or not context.strip():
            invalid(report, on_invalid, "empty_text", f"{context_column} is missing or empty", path, line)
            continue
        if len(choices) < 2 or any(not isinstance(c, str) or not c.strip() for c in choices):
            invalid(report, on_invalid, "empty_text", "a choice is missing or empty (need at least two)", path, line)
            continue
        label = None
        if label_column is not None:
            try:
                label = int(str(record.get(label_column)).strip())
            except ValueError:
                label = -1
            if not 0 <= label < len(choices):
                invalid(report, on_invalid, "bad_label", f"label {record.get(label_column)!r} is not a choice index "
                        f"in [0, {len(choices)})", path, line)
                continue
        row_id = next((str(record[name]).strip() for name in CHOICE_ID_COLUMNS if record.get(name) not in (None, "")), "")
        examples.append(ChoiceExample(context, str(start or ""), choices, label, f"{os.fspath(path)}:{line}", row_id))
        report.note("rows")
    if not records:
        raise no_rows(path, header_line)
    return examples
