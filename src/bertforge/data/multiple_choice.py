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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bertforge.data.files import ID_COLUMNS, check_on_invalid, detect_format, invalid, iter_rows, no_rows
from bertforge.data.finetuning import DataReport
from bertforge.errors import DataError

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
    check_on_invalid(on_invalid)
    report = report if report is not None else DataReport()
    file_format = detect_format(path, file_format)
    columns = _ChoiceColumns(context_column, start_column, label_column,
                             list(ending_columns) if ending_columns is not None else None)
    header: list[str] | None = None
    header_line: int | None = None
    records = 0
    examples: list[ChoiceExample] = []
    for line, row in iter_rows(path, file_format):  # a leading byte-order mark is skipped there
        if isinstance(row, list) and header is None:
            header_line, header = line, [name.strip() for name in row]
            columns.check_header(path, line, header)
            continue
        records += 1
        example, problem = _example(row, header, columns, f"{os.fspath(path)}:{line}")
        if problem is not None:
            invalid(report, on_invalid, *problem, path, line)
            continue
        examples.append(example)
        report.note("rows")
    if not records:
        raise no_rows(path, header_line)
    return examples


def _endings(names: Iterable[str]) -> list[str]:
    """The names of the form ``ending<N>``, in number order."""
    return [name for _, name in sorted((int(m.group(1)), m.string) for m in map(_ENDING.match, names) if m)]


def _record(row: list[str] | dict, header: list[str] | None,
            columns: _ChoiceColumns) -> tuple[dict | None, tuple[str, str] | None]:
    """(record, problem): a row as {column: value}, or why it cannot be one. The endings of a JSON file
    without a header (and without ending columns given) come from its first object's keys."""
    if isinstance(row, list):
        if len(row) != len(header):
            return None, ("column_count", f"{len(row)} columns where the header has {len(header)}")
        return dict(zip(header, row)), None
    if isinstance(row, dict):
        if columns.endings is None:
            columns.endings = _endings(row)
        return row, None
    return None, ("not_an_object", "expected a JSON object per line")


def _example(row: list[str] | dict, header: list[str] | None, columns: _ChoiceColumns,
             where: str) -> tuple[ChoiceExample | None, tuple[str, str] | None]:
    """(example, problem): a data row as a question, or the (reason, message) that makes it malformed."""
    record, problem = _record(row, header, columns)
    if record is None:
        return None, problem
    return columns.example(record, where)


@dataclass
class _ChoiceColumns:
    """The columns a multiple-choice row is read from; `endings` None until known (given, from the header,
    or from the first JSON object)."""

    context: str
    start: str | None
    label: str | None
    endings: list[str] | None

    def check_header(self, path: str | os.PathLike, line: int, header: list[str]) -> None:
        """Take the endings from the header unless given; DataError for a column the header lacks."""
        if self.endings is None:
            self.endings = _endings(header)
        wanted = [self.context, self.start, self.label, *self.endings]
        missing = [name for name in wanted if name is not None and name not in header]
        if missing or not self.endings:
            raise DataError(f"columns {missing or ['ending0', '...']} not in the header {header}", path, line)

    def example(self, record: dict, where: str) -> tuple[ChoiceExample | None, tuple[str, str] | None]:
        """(example, problem): the record as a question, or why it is malformed (empty text, bad label)."""
        context = record.get(self.context)
        start = record.get(self.start, "") if self.start is not None else ""
        choices = [record.get(name) for name in self.endings or []]
        if not isinstance(context, str) or not context.strip():
            return None, ("empty_text", f"{self.context} is missing or empty")
        if len(choices) < 2 or any(not isinstance(c, str) or not c.strip() for c in choices):
            return None, ("empty_text", "a choice is missing or empty (need at least two)")
        label = None
        if self.label is not None:
            try:
                label = int(str(record.get(self.label)).strip())
            except ValueError:
                label = -1
            if not 0 <= label < len(choices):
                return None, ("bad_label", f"label {record.get(self.label)!r} is not a choice index "
                              f"in [0, {len(choices)})")
        ids = (str(record[name]).strip() for name in CHOICE_ID_COLUMNS if record.get(name) not in (None, ""))
        row_id = next(ids, "")
        return ChoiceExample(context, str(start or ""), choices, label, where, row_id), None
