"""Listwise reranking data: a query, its documents and a relevance label per document, one list per JSON line,
as sentence-transformers' cross-encoder listwise losses take them (``{"query": ..., "docs": [...], "labels":
[...]}``).

Owns `RerankQuery` (a query and its candidate texts, with their labels when read for training) and
`read_rerank_lists`, the one reader of such files, which refuses a list it cannot train on (no document
labelled relevant, labels and documents of different lengths, fewer than two documents, an empty text, a label
that is not a number) naming its file and line. What the lists train (ListNet) is `families.reranking`'s.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from bertforge.data.files import check_on_invalid, detect_format, invalid, iter_rows, no_rows
from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError


@dataclass(frozen=True)
class RerankQuery:
    """One query and its candidate texts; `labels` (one per text, higher is more relevant), where it came from
    ("file:line") and its id when read from a training file."""

    query: str
    texts: tuple[str, ...]
    labels: tuple[float, ...] | None = None
    source: str = ""
    id: str = ""


def _label(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def read_rerank_lists(path: str | os.PathLike, *, query_column: str = "query", docs_column: str = "docs",
                      labels_column: str | None = "labels", file_format: str | None = None,
                      on_invalid: str = "error", report: DataReport | None = None,
                      relevant_required: bool = True) -> list[RerankQuery]:
    """The lists of a JSON Lines file, with their labels.

    Args:
        query_column, docs_column, labels_column: the keys of the query (a string), the documents (a list of
            strings) and their labels (a list of numbers, one per document; higher is more relevant). None
            reads no labels.
        on_invalid: "error" raises at the first bad list; "skip" drops it, counted as `skipped_<reason>`.
        relevant_required: refuse a list with no label above 0 (relevance labels); False for a teacher's
            scores (logits: any finite numbers, ColBERT distillation).

    Raises:
        DataError: a missing, empty or non-UTF-8 file, or with on_invalid="error" a bad list (see the module
            docstring).
    """
    check_on_invalid(on_invalid)
    report = report if report is not None else DataReport()
    if detect_format(path, file_format) != "jsonl":
        raise ConfigError(f"{os.fspath(path)}: rerank lists are JSON Lines (one {{\"{query_column}\": ..., "
                          f"\"{docs_column}\": [...], \"{labels_column}\": [...]}} per line, a .jsonl file)")
    lists, records = [], 0
    for line, row in iter_rows(path, "jsonl"):
        records += 1
        if not isinstance(row, dict):
            invalid(report, on_invalid, "not_an_object", "expected a JSON object per line", path, line)
            continue
        query, docs = row.get(query_column), row.get(docs_column)
        if not isinstance(query, str) or not query.strip():
            invalid(report, on_invalid, "empty_text", f"{query_column!r} must be a non-empty string (this line has "
                    f"keys {sorted(row)})", path, line)
            continue
        if not isinstance(docs, list) or len(docs) < 2:
            invalid(report, on_invalid, "short_list", f"{docs_column!r} must be a list of at least two documents "
                    "(a softmax over one document is constant: nothing to learn)", path, line)
            continue
        empty = next((i for i, d in enumerate(docs) if not isinstance(d, str) or not d.strip()), None)
        if empty is not None:
            invalid(report, on_invalid, "empty_text", f"{docs_column}[{empty}] is not a non-empty string", path, line)
            continue
        labels = None
        if labels_column is not None:
            given = row.get(labels_column)
            if not isinstance(given, list) or len(given) != len(docs):
                count = len(given) if isinstance(given, list) else "no list of"
                invalid(report, on_invalid, "label_count", f"{count} {labels_column} for {len(docs)} {docs_column}: "
                        "give one label per document, in the same order", path, line)
                continue
            labels = [_label(v) for v in given]
            bad = next((i for i, v in enumerate(labels) if v is None), None)
            if bad is not None:
                invalid(report, on_invalid, "bad_label", f"{labels_column}[{bad}] = {given[bad]!r} is not a finite "
                        "number", path, line)
                continue
            if relevant_required and max(labels) <= 0:
                invalid(report, on_invalid, "no_positive", f"no document is labelled relevant (every "
                        f"{labels_column} value is <= 0): label the relevant ones above 0, or leave the list out",
                        path, line)
                continue
        where = f"{os.fspath(path)}:{line}"
        ident = row.get("id")
        lists.append(RerankQuery(query, tuple(docs), None if labels is None else tuple(labels), where,
                                 str(ident) if ident is not None else where))
        report.note("rows")
    if not records:
        raise no_rows(path)
    return lists
