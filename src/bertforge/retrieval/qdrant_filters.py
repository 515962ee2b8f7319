"""A checked metadata filter (`filters.Filter`) as Qdrant's filter, and metadata values as a Qdrant payload holds
them: what `qdrant_collection` sends with its searches and writes with its points.

Owns: `qdrant_filter` (condition by condition), `payload_value` (dates and times as ISO text) and `METADATA_KEY`
(the payload object that holds a record's metadata fields).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from bertforge.retrieval.fields import FieldSpec
from bertforge.retrieval.filters import RANGES, SETS, Filter

try:  # the `search` extra
    from qdrant_client import models
except ImportError:  # pragma: no cover - the extra is installed by `make install`
    models = None

METADATA_KEY = "metadata"  # the payload object of a record's metadata fields (`embed --field`)


def payload_value(value: Any) -> Any:
    """A metadata value as the payload holds it: dates and times as ISO text (Qdrant's datetime syntax)."""
    return value.isoformat() if hasattr(value, "isoformat") else value


def range_value(kind: str, value: Any) -> Any:
    """A range bound: a date as its midnight (UTC, as Qdrant reads a stored date), a datetime as it is."""
    if kind == "date":
        return dt.datetime.combine(value, dt.time(), tzinfo=dt.UTC)
    return value


def equal_condition(spec: FieldSpec, value: Any) -> Any:
    """A field equal to a value: a match of strings, integers and booleans, a one-point range of floats and
    dates (Qdrant matches those by range only)."""
    key = f"{METADATA_KEY}.{spec.name}"
    if spec.type in ("date", "datetime"):
        bound = range_value(spec.type, value)
        return models.FieldCondition(key=key, range=models.DatetimeRange(gte=bound, lte=bound))
    if spec.type == "float":
        return models.FieldCondition(key=key, range=models.Range(gte=value, lte=value))
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def qdrant_filter(given: Filter | None) -> Any:
    """The Qdrant filter of a checked `filters.Filter` (None: none), condition by condition: equality and sets
    as matches (or one-point ranges), ranges as Range / DatetimeRange, != and not in as must_not, so a point
    without the field matches those two only, as a row without a value does."""
    if given is None:
        return None
    specs = {spec.name: spec for spec in given.fields}
    must, must_not = [], []
    for condition in given.conditions:
        spec = specs[condition.field]
        if condition.op in RANGES:
            kind = models.DatetimeRange if spec.type in ("date", "datetime") else models.Range
            bound = range_value(spec.type, condition.value)
            must.append(models.FieldCondition(key=f"{METADATA_KEY}.{spec.name}", range=kind(**{condition.op: bound})))
            continue
        values = condition.value if condition.op in SETS else (condition.value,)
        if spec.type in ("string", "int") and condition.op in SETS:
            found = models.FieldCondition(key=f"{METADATA_KEY}.{spec.name}", match=models.MatchAny(any=list(values)))
        elif len(values) == 1:
            found = equal_condition(spec, values[0])
        else:
            found = models.Filter(should=[equal_condition(spec, value) for value in values])
        (must_not if condition.op in ("ne", "not_in") else must).append(found)
    return models.Filter(must=must or None, must_not=must_not or None)


__all__ = ["METADATA_KEY", "payload_value", "qdrant_filter"]
