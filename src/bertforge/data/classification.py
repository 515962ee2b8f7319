"""Sentence and sentence-pair classification/regression data: the table reader, labels and their checks.

Reads a table (`data.files`: GLUE-style TSV, CSV or JSON Lines, with or without a header; a leading
byte-order mark, CRLF line ends, non-UTF-8 and empty files handled there) into `ClassificationExample`s:
columns by header name (or JSON key) or 0-based index, labels as names, numbers (regression) or lists
(multi-label), ids from an id column. Every malformed row (wrong column count, empty text, empty or
unparsable label) is a `DataError` naming file and line, or — with `on_invalid="skip"` — is dropped and
counted in the `DataReport`.

Features (``[CLS] A [SEP] (B [SEP])``, long inputs windowed) and decoding are the classification family's
(`families.classification`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
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

Label = str | float | tuple[str, ...]
# The names a role's column has in the files people export, tried in order when the role's own default name
# (`text_a`, `text_b`, `label`) is not in the file: a multi-label JSONL of {"text": ..., "labels": [...]}, a
# CSV with a `sentence` column, reads without flags. Used only where exactly one alias is present.
COLUMN_ALIASES = {"text_a": ("text", "sentence", "sentence1", "question1"),
                  "text_b": ("text_pair", "sentence2", "question2"), "label": ("labels", "label_id", "target")}
# The flag that names each role's column.
ROLE_FLAGS = {"text_a": "--text-a", "text_b": "--text-b", "label": "--label", "id": "--id-column"}
# (reason, message) of a malformed row: the `skipped_<reason>` kind and the error's text.
Problem = tuple[str, str]


@dataclass
class ClassificationExample:
    """One row: text_a, optional text_b, the raw label (str; float for regression; a tuple of label names for
    multi-label, possibly empty; None when unlabeled), where it came from ("file:line"), and its id: the
    value of the file's id column (`data.files.ID_COLUMNS`, or the one named), else the source (what
    evaluate's predictions carry, so a test-set file's predictions can be submitted by id)."""

    text_a: str
    text_b: str | None
    label: str | float | tuple[str, ...] | None
    source: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or self.source


@dataclass
class _Layout:
    """Where each role (text_a, text_b, label, id) is in a row, whether the id column was named, and the
    header's names and the row width once read (the first data row's width when there is no header)."""

    columns: dict[str, Column | None]
    header: bool
    id_named: bool
    names: dict[str, int] | None = None
    width: int | None = None
    header_line: int | None = None


@dataclass(frozen=True)
class _LabelRule:
    """How a label cell is read: a name, a number (regression) or a list of names (multi-label)."""

    regression: bool
    multi_label: bool
    separator: str


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
            (JSON key) in `data.files.ID_COLUMNS` that no other role uses, else each row's "file:line".
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
    check_on_invalid(on_invalid)
    report = report if report is not None else DataReport()
    file_format = detect_format(path, file_format)
    columns = {"text_a": parse_column(text_a), "text_b": parse_column(text_b), "label": parse_column(label),
               "id": parse_column(id_column)}
    layout = _layout(path, file_format, header, columns, id_named=id_column is not None)
    rule = _LabelRule(regression, multi_label, label_separator)
    records = 0
    examples: list[ClassificationExample] = []
    for line, row in iter_rows(path, file_format):
        if layout.header and layout.names is None:
            _read_header(path, line, row, layout)
            continue
        if not records and isinstance(row, dict):  # JSON Lines: the first object's keys decide the aliases
            layout.columns.update(use_aliases(layout.columns, list(row)))
        records += 1
        example, problem = _example(path, line, row, layout, rule, report)
        if problem is not None:
            invalid(report, on_invalid, *problem, path, line)
            continue
        examples.append(example)
        report.note("rows")
    if not records:
        raise no_rows(path, layout.header_line)
    return examples


def _layout(path: str | os.PathLike, file_format: str, header: bool | None, columns: dict[str, Column | None],
            *, id_named: bool) -> _Layout:
    """The columns checked against `header` (None: a header exactly when a column is named, JSONL aside)."""
    if columns["text_a"] is None:
        raise ConfigError("text_a column is required (a header name or a 0-based index)")
    named = [c for c in columns.values() if isinstance(c, str)]
    if header is None:
        header = bool(named) and file_format != "jsonl"
    if file_format != "jsonl" and named and not header:
        raise ConfigError(f"{path}: columns are given by name {named} "
                          "but header=False; give 0-based indices or set header=True")
    return _Layout(columns, header, id_named)


def use_aliases(columns: dict[str, Column | None], names: Sequence[str]) -> dict[str, str]:
    """For each role whose column is its own default name (`text_a` ...) and absent from `names`, the one
    alias of `COLUMN_ALIASES` that is present: {role: alias}; a role with no or several aliases present is left
    alone (the missing column is then reported, naming the file's columns and the flag)."""
    present = set(names)
    chosen = {}
    for role, aliases in COLUMN_ALIASES.items():
        if columns.get(role) == role and role not in present:
            found = [alias for alias in aliases if alias in present]
            if len(found) == 1:
                chosen[role] = found[0]
    return chosen


def _read_header(path: str | os.PathLike, line: int, row: list[str] | dict, layout: _Layout) -> None:
    """Take the header row's names and width (default column names the file spells another usual way are
    read under that name: `use_aliases`); the default id column; DataError for a column it lacks."""
    layout.header_line = line
    layout.names = {str(name).strip(): i for i, name in enumerate(row)}
    layout.columns.update(use_aliases(layout.columns, list(layout.names)))
    if layout.columns["id"] is None:
        layout.columns["id"] = default_id_column(layout.names, layout.columns)
    layout.width = len(row)
    for role, column in layout.columns.items():
        if isinstance(column, str) and column not in layout.names:
            raise DataError(f"no column named {column!r} for {role}; the header has {list(layout.names)}: name "
                            f"the column with {ROLE_FLAGS[role]} (e.g. {ROLE_FLAGS[role]} {next(iter(layout.names))})",
                            path, line)


def _shape_problem(row: list[str] | dict, layout: _Layout) -> Problem | None:
    """A table row with the wrong number of cells (or too few for an index), or a JSON line that is no object."""
    if isinstance(row, list):
        if layout.width is None:
            layout.width = len(row)
        needed = [c for c in layout.columns.values() if isinstance(c, int)]
        if len(row) != layout.width or any(not -len(row) <= c < len(row) for c in needed):
            return ("column_count", f"{len(row)} columns where "
                    f"{'the header has' if layout.header else 'the first row has'} {layout.width} "
                    "(a stray tab or quote in the text?)")
        return None
    if not isinstance(row, dict):
        return ("not_an_object", "expected a JSON object per line")
    return None


def _text_problem(first: object, second: object, pair: bool, row: list[str] | dict) -> Problem | None:
    keys = f" (this line has keys {sorted(row)}: name the text's key with --text-a)" \
        if isinstance(row, dict) and first is None else ""
    if not isinstance(first, str) or not first.strip():
        return ("empty_text", f"text_a is missing or empty{keys}")
    if pair and (not isinstance(second, str) or not second.strip()):
        return ("empty_text", "text_b is missing or empty" + (f" (this line has keys {sorted(row)}: name the "
                                                              "second text's key with --text-b)"
                                                              if isinstance(row, dict) and second is None else ""))
    return None


def _label_value(raw: object, rule: _LabelRule) -> tuple[Label | None, Problem | None]:
    """(label, problem) of a label cell, read as `rule` says."""
    if rule.multi_label:
        return multi_label_value(raw, rule.separator)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None, ("empty_label", "the label is missing or empty")
    if not rule.regression:
        return (json.dumps(raw) if isinstance(raw, bool) else str(raw).strip()), None
    try:
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(raw)
    except (TypeError, ValueError):
        return None, ("bad_label", f"label {raw!r} is not a number (regression task)")
    return value, None


def _example(path: str | os.PathLike, line: int, row: list[str] | dict, layout: _Layout, rule: _LabelRule,
             report: DataReport) -> tuple[ClassificationExample | None, Problem | None]:
    """One data row as an example, or the problem that makes it malformed (a multi-label row without labels
    is counted as `rows_without_labels`)."""
    problem = _shape_problem(row, layout)
    if problem is not None:
        return None, problem
    columns = layout.columns
    values = {role: (None if column is None else cell(row, column, layout.names))
              for role, column in columns.items()}
    first, second = values["text_a"], values["text_b"]
    pair = columns["text_b"] is not None
    problem = _text_problem(first, second, pair, row)
    value: Label | None = None
    if problem is None and columns["label"] is not None:
        value, problem = _label_value(values["label"], rule)
    if problem is not None:
        return None, problem
    where = f"{os.fspath(path)}:{line}"
    if rule.multi_label and columns["label"] is not None and not value:
        report.note("rows_without_labels", where)
    if isinstance(row, dict) and not layout.id_named:
        values["id"] = row.get(default_id_column(row, columns) or "")
    row_id = "" if values["id"] is None else str(values["id"]).strip()
    return ClassificationExample(first, second if pair else None, value, where, row_id), None


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


def unknown_label_message(name: str, known: Sequence[str], found: Sequence[str], origin: str, what: str = "label"
                          ) -> str:
    """What to say of a `what` ("label", "tag") `name` outside `known`, given where `known` came from (`origin`:
    "training", "given" by --labels, a named "task"'s, or the saved "model") and the file's own names
    (`found`)."""
    if origin in ("given", "task"):
        where = "given with --labels / data.labels" if origin == "given" else "of the named task"
        return (f"{what} {name!r} is not among the labels {where} ({list(known)}); this file's labels are "
                f"{list(found)}: list those (--labels {','.join(found)}), or fix the file")
    if origin == "model":
        return (f"{what} {name!r} is not one the model was fine-tuned with ({list(known)}); this file's labels are "
                f"{list(found)}: evaluate a file with the model's labels, or fine-tune on these")
    return (f"{what} {name!r} was never seen in training (known: {sorted(known)}); fix the row, add training "
            f"examples of it, or list every label in --labels")


def check_labels(examples: Sequence[ClassificationExample], label2id: dict[str, int], origin: str = "training"
                 ) -> None:
    """Raise a DataError for the first label that the model does not know (e.g. a dev label absent in train);
    the message's fix follows where the known labels came from (`unknown_label_message`)."""
    for example in examples:
        names = example.label if isinstance(example.label, tuple) else (example.label,)
        for name in names:
            if name is not None and name not in label2id:
                path, _, line = example.source.rpartition(":")
                raise DataError(unknown_label_message(name, list(label2id), label_list(examples), origin), path,
                                int(line))
