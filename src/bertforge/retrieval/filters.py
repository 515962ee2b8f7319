"""Filters on a vector folder's metadata fields (`fields`): one typed description, parsed from the command line
(`bertforge search --filter`) or from JSON (`POST /search`'s "filter"), checked against the folder's fields, and
evaluated into a row mask that every search applies before its top-k (exact, approximate, sparse, hybrid), so a
filtered search answers the top-k of the rows that match.

Owns: `Filter` (conditions combined with AND; each a `Condition`: a field, an operator of `OPERATORS` and a
typed value, or a tuple of them for "in" / "not_in"), reading it (`parse_filter`, from either form) and
evaluating it on a metadata table (`Filter.mask`). An exporter to another engine translates a `Filter`
condition by condition.

The two forms (each value read by its field's type, `fields.typed_value`):
- clauses (`--filter`, repeatable, ANDed): `FIELD=VALUE`, `FIELD!=VALUE`, `FIELD>VALUE`, `FIELD>=VALUE`,
  `FIELD<VALUE`, `FIELD<=VALUE`, `FIELD in A,B,C`, `FIELD not in A,B,C` (the set as a JSON list, `FIELD in ["a,
  b", "c"]`, when a value holds a comma); a `--filter` that starts with "{" is the JSON form;
- JSON: an object of field -> a value (equality) or an object of operators -> values, e.g. {"source": "wiki",
  "year": {"gte": 2020, "lt": 2024}, "lang": {"in": ["en", "fr"]}}; every condition must hold.

Semantics: equality and sets on any type; ranges on int, float, date and datetime (not strings or booleans).
A row whose record has no value for the field matches `!=` and `not in` only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.errors import InputError
from bertforge.retrieval.fields import FieldSpec, import_pyarrow, typed_value

OPERATORS = ("eq", "ne", "in", "not_in", "gt", "gte", "lt", "lte")
RANGES = ("gt", "gte", "lt", "lte")
SETS = ("in", "not_in")
RANGE_TYPES = ("int", "float", "date", "datetime")
SYMBOLS = {"!=": "ne", ">=": "gte", "<=": "lte", "=": "eq", ">": "gt", "<": "lt"}  # longest first
CLAUSE = re.compile(r"^\s*(?P<field>[^=!<>]+?)\s*(?P<op>!=|>=|<=|=|>|<)\s*(?P<value>.*?)\s*$", re.S)
SET_CLAUSE = re.compile(r"^\s*(?P<field>[^=!<>\s][^=!<>]*?)\s+(?P<op>not\s+in|in)\s+(?P<value>.*?)\s*$", re.S | re.I)
SYNTAX = ("FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE (> < <=), FIELD in A,B or FIELD not in A,B, or the JSON form "
          "{\"FIELD\": VALUE, \"FIELD\": {\"gte\": VALUE}}")


@dataclass(frozen=True)
class Condition:
    """One condition on one field: `op` of `OPERATORS`; `value` typed as the field (`fields.typed_value`), a
    tuple of such values for "in" / "not_in"."""

    field: str
    op: str
    value: Any

    def describe(self) -> Any:
        """The condition's operator and value in the JSON form (dates as ISO text)."""
        def plain(value: Any) -> Any:
            return value.isoformat() if hasattr(value, "isoformat") else value

        return {self.op: [plain(v) for v in self.value] if self.op in SETS else plain(self.value)}


@dataclass(frozen=True)
class Filter:
    """Conditions on a folder's fields, all of which a row must meet."""

    conditions: tuple[Condition, ...]
    fields: tuple[FieldSpec, ...]  # the folder's, which the conditions were checked against

    def describe(self) -> dict[str, Any]:
        """The JSON form of the filter (what `parse_filter` reads back)."""
        described: dict[str, Any] = {}
        for condition in self.conditions:
            described.setdefault(condition.field, {}).update(condition.describe())
        return described

    def mask(self, table: Any) -> np.ndarray:
        """[rows] bool: the rows of a metadata table (`store.VectorFolder.metadata`) that meet every condition."""
        pa = import_pyarrow()
        pc = pa.compute
        types = {spec.name: spec.arrow_type() for spec in self.fields}
        keep = np.ones(table.num_rows, dtype=bool)
        for condition in self.conditions:
            column, kind = table.column(condition.field), types[condition.field]
            if condition.op in SETS:
                found = pc.is_in(column, value_set=pa.array(list(condition.value), type=kind))  # null: False
                matched = pc.invert(found) if condition.op == "not_in" else found
            else:
                compare = {"eq": pc.equal, "ne": pc.not_equal, "gt": pc.greater, "gte": pc.greater_equal,
                           "lt": pc.less, "lte": pc.less_equal}[condition.op]
                # a row without a value: only != holds for it
                matched = compare(column, pa.scalar(condition.value, type=kind)).fill_null(condition.op == "ne")
            keep &= matched.to_numpy(zero_copy_only=False).astype(bool)
        return keep


def refusal(message: str) -> InputError:
    return InputError(f"filter: {message}")


def field_named(name: str, fields: Sequence[FieldSpec]) -> FieldSpec:
    for spec in fields:
        if spec.name == name:
            return spec
    if not fields:
        raise refusal(f"no field {name!r}: this index stores no metadata fields; embed with --field NAME[:TYPE] "
                      "to filter on them")
    raise refusal(f"no field {name!r}; the index's fields: {', '.join(str(spec) for spec in fields)}")


def condition_of(spec: FieldSpec, op: str, value: Any) -> Condition:
    """A checked condition on field `spec`; `value` raw (text, or a JSON value; a list of them for a set).

    Raises:
        InputError: an operator that does not apply to the field's type, a value its type does not read, an
            empty set; naming the field and the fix.
    """
    if op not in OPERATORS:
        raise refusal(f"field {spec.name!r}: unknown operator {op!r}; use one of {', '.join(OPERATORS)}")
    if op in RANGES and spec.type not in RANGE_TYPES:
        raise refusal(f"field {spec.name!r} is {spec.type}: a range ({op}) applies to {', '.join(RANGE_TYPES)} "
                      f"fields; compare it with = or in")

    def typed(raw: Any) -> Any:
        if raw is None or isinstance(raw, dict | list):
            raise refusal(f"field {spec.name!r} ({spec.type}): {op} takes a value, got {json.dumps(raw)}")
        try:
            value = typed_value(spec, raw)
        except InputError as error:
            raise refusal(f"field {spec.name!r} ({spec.type}): {error}; give a value of the field's type") from None
        if value is None:
            raise refusal(f"field {spec.name!r}: an empty value compares with nothing; give a value")
        return value

    if op in SETS:
        if not isinstance(value, list | tuple) or not value:
            raise refusal(f"field {spec.name!r}: {op} takes a non-empty list of values, e.g. {{\"{op}\": [\"a\", "
                          "\"b\"]}} or FIELD in a,b")
        return Condition(spec.name, op, tuple(dict.fromkeys(typed(raw) for raw in value)))
    return Condition(spec.name, op, typed(value))


def clause_condition(text: str, fields: Sequence[FieldSpec]) -> Condition:
    """One `--filter` clause (module docstring) as a condition."""
    matched = SET_CLAUSE.match(text)
    if matched is not None:
        items = matched["value"]
        if items.startswith("["):
            try:
                values = json.loads(items)
            except json.JSONDecodeError as error:
                raise refusal(f"{text!r}: the set is not a JSON list ({error.msg}); write FIELD in a,b or FIELD in "
                              "[\"a\", \"b\"]") from None
        else:
            values = [item.strip() for item in items.split(",") if item.strip()]
        op = "not_in" if matched["op"].lower().startswith("not") else "in"
        return condition_of(field_named(matched["field"].strip(), fields), op, values)
    matched = CLAUSE.match(text)
    if matched is None:
        raise refusal(f"{text!r} is not a condition; write {SYNTAX}")
    return condition_of(field_named(matched["field"], fields), SYMBOLS[matched["op"]], matched["value"])


def json_conditions(given: Mapping[str, Any], fields: Sequence[FieldSpec]) -> list[Condition]:
    """The JSON form (module docstring) as conditions."""
    conditions = []
    for name, value in given.items():
        spec = field_named(name, fields)
        if isinstance(value, Mapping):
            if not value:
                raise refusal(f"field {name!r}: an empty object holds no condition; give e.g. {{\"gte\": VALUE}}")
            conditions += [condition_of(spec, op, raw) for op, raw in value.items()]
        elif isinstance(value, list):
            raise refusal(f"field {name!r}: a list is a set: write {{\"{name}\": {{\"in\": {json.dumps(value)}}}}}")
        else:
            conditions.append(condition_of(spec, "eq", value))
    return conditions


def parse_filter(given: Filter | Mapping[str, Any] | str | Sequence[str] | None,
                 fields: Sequence[FieldSpec]) -> Filter | None:
    """A filter checked against a folder's `fields`, from the JSON form (an object, or its text), `--filter`
    clauses (a string or a list of strings, ANDed; one starting with "{" read as JSON) or a `Filter` (checked
    again); None when nothing is given (no filter).

    Raises:
        InputError: a field the folder does not store (naming those it does), a malformed clause, an operator
            that does not apply to a field's type, a value of another type; each naming the field and the fix.
    """
    if given is None:
        return None
    fields = tuple(fields)
    if isinstance(given, Filter):
        given = given.describe()
    if isinstance(given, str):
        given = [given]
    conditions: list[Condition] = []
    if isinstance(given, Mapping):
        conditions = json_conditions(given, fields)
    elif isinstance(given, Sequence):
        for clause in given:
            if not isinstance(clause, str):
                raise refusal(f"a clause is a string ({SYNTAX}), got {type(clause).__name__}")
            if clause.lstrip().startswith("{"):
                try:
                    value = json.loads(clause)
                except json.JSONDecodeError as error:
                    raise refusal(f"{clause!r} is not valid JSON ({error.msg}); write {SYNTAX}") from None
                if not isinstance(value, dict):
                    raise refusal(f"{clause!r}: the JSON form is an object; write {SYNTAX}")
                conditions += json_conditions(value, fields)
            else:
                conditions.append(clause_condition(clause, fields))
    else:
        raise refusal(f"expected an object of field conditions, got {type(given).__name__}; write {SYNTAX}")
    return Filter(tuple(conditions), fields) if conditions else None


__all__ = ["OPERATORS", "RANGE_TYPES", "Condition", "Filter", "parse_filter"]
