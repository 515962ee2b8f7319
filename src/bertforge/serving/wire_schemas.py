"""Request and response models of the wire-format routes (OpenAI, text-embeddings-inference, Cohere) as
pydantic models, and their place in `/openapi.json`.

A route reads its body itself (`model_service.read_body`: size limit, the untrusted-JSON decoder) and then
validates it with `check_body` against a strict model (unknown fields refused, no coercion of "1" to 1 or
of 1 to true); the model also describes the body in the OpenAPI document (`request_body` points at it,
`with_wire_schemas` puts it in the components), so generated clients and fuzzers learn every field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertforge.serving.envelopes import RequestError, serve_extra_missing

try:
    from fastapi import FastAPI
    from pydantic import BaseModel, ConfigDict, ValidationError
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise serve_extra_missing(missing) from None

WIRE_CONFIG = ConfigDict(extra="forbid", strict=True)
SCHEMA_REF = "#/components/schemas/{model}"


class WireModel(BaseModel):
    """A strict request or response of a wire route."""

    model_config = WIRE_CONFIG


# pydantic's names for the branches of a union and for wrapped types, which appear in an error's location
# (`inputs.constrained-str`, `input.list[str]`): never shown to a client.
BRANCH_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "object", "tuple", "bytes"})
# What a field must be, in our words, for each kind of pydantic error (the context fills the braces).
EXPECTED = {
    "string_type": "must be a string", "int_type": "must be an integer", "int_parsing": "must be an integer",
    "int_from_float": "must be an integer, not a fraction", "float_type": "must be a number",
    "bool_type": "must be true or false", "list_type": "must be a list", "dict_type": "must be an object",
    "model_type": "must be an object", "model_attributes_type": "must be an object",
    "finite_number": "must be a finite number (no NaN or Infinity)", "none_required": "must be null",
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "string_pattern_mismatch": "must match {pattern}",
}
# Errors about a value of the right type out of its bounds: in a union, the branch the client meant.
CONSTRAINTS = frozenset({"greater_than_equal", "greater_than", "less_than_equal", "less_than", "too_long",
                         "string_too_long", "string_pattern_mismatch", "finite_number"})


def error_path(location: Sequence[Any]) -> str:
    """An error's location as the request's own path (`inputs[1]`, `inputs[0].text`), without pydantic's union
    branch names."""
    path = ""
    for part in location:
        if part == "body":
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif (isinstance(part, str) and part not in BRANCH_TAGS and not part[:1].isupper()
              and not any(char in part for char in "[-,.")):
            path += f".{part}" if path else part
    return path or "body"


def json_kind(value: Any) -> str:
    """What a client sent, in JSON's words (`an empty string`, `a list of 3 items`, `the number 0`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "an empty string" if not value else repr(value) if len(value) <= 40 else f"a string of {len(value)} characters"
    if isinstance(value, list):
        return "an empty list" if not value else f"a list of {len(value)} item{'s' * (len(value) != 1)}"
    if isinstance(value, dict):
        return "an empty object" if not value else "an object"
    return type(value).__name__


def described(schema: dict[str, Any], components: dict[str, Any], depth: int = 0) -> str:
    """What a JSON schema accepts, in words (`a non-empty string, or a list of 1 or more non-empty strings`)."""
    if depth > 4:
        return "a value"
    if "$ref" in schema:
        return described(components.get(schema["$ref"].rsplit("/", 1)[-1], {}), components, depth + 1)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return ", or ".join(described(branch, components, depth + 1) for branch in branches)
    if "enum" in schema:
        return "one of " + ", ".join(repr(value) for value in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    kind = schema.get("type")
    if kind == "string":
        return "a non-empty string" if schema.get("minLength", 0) >= 1 else "a string"
    if kind in ("integer", "number"):
        bounds = [f"at least {schema['minimum']}"] if "minimum" in schema else []
        bounds += [f"at most {schema['maximum']}"] if "maximum" in schema else []
        return ("an integer" if kind == "integer" else "a number") + (f" ({' and '.join(bounds)})" if bounds else "")
    if kind == "boolean":
        return "true or false"
    if kind == "null":
        return "null"
    if kind == "array":
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        count = (f"exactly {low}" if high == low else f"{low} to {high}" if high is not None
                 else f"{low} or more" if low else "any number of")
        return f"a list of {count} items, each {described(schema.get('items', {}), components, depth + 1)}"
    if kind == "object":
        fields = list(schema.get("properties", {}))
        return "an object" + (f" with the fields {', '.join(fields)}" if fields else "")
    return "a value"


def validation_message(errors: Sequence[Any], model: type[BaseModel] | None = None,
                       body: Any = None) -> tuple[str, str | None]:
    """(one line naming the first problem, its field and the fix, the top-level field) of pydantic's errors,
    in our words (never pydantic's messages or its union branch names). With the request `model` and `body`,
    a field of the wrong shape is answered with what the field accepts and what was sent."""
    if not errors:
        return "invalid request body", None
    # The most telling error first: an unknown or missing field, then an empty text or list anywhere (the
    # deepest location of a union's branches), then the first.
    order = {"extra_forbidden": 0, "missing": 1, **dict.fromkeys(CONSTRAINTS, 2)}
    first = min(errors, key=lambda e: (2 if is_empty(e) else order.get(e.get("type"), 3), errors.index(e)))
    location = [part for part in first.get("loc", ()) if part != "body"]
    top = next((part for part in location if isinstance(part, str)), None)
    path, kind = error_path(location), first.get("type", "")
    fields = list(model.model_fields) if model is not None else []
    if kind == "extra_forbidden":
        accepted = f"; this request takes {', '.join(fields)}" if fields and "." not in path and "[" not in path else ""
        return f"unknown field '{path}'{accepted} (remove it)", top
    if kind == "missing":
        accepts = field_description(model, top) if path == top else None
        return f"missing field '{path}'; add it" + (f" ({accepts})" if accepts else ""), top
    if is_empty(first):
        if isinstance(first.get("input"), str):
            return f"{path}: text is empty; give some text", top
        return f"{path}: the list is empty; send at least one item", top
    accepts = field_description(model, top) if top is not None and kind not in CONSTRAINTS else None
    if accepts is not None:
        sent = body.get(top) if isinstance(body, dict) else first.get("input")
        return f"{top} must be {accepts}; got {json_kind(sent)}", top
    context = first.get("ctx") or {}
    if kind == "literal_error":
        expected = f"must be one of {context.get('expected', 'the documented values')}"
    elif kind in ("too_short", "too_long"):
        expected = (f"must hold at least {context.get('min_length')} items" if kind == "too_short"
                    else f"must hold at most {context.get('max_length')} items")
    else:
        expected = EXPECTED.get(kind, "has a value this route does not take (see /openapi.json)")
        try:
            expected = expected.format(**context)
        except (KeyError, IndexError):
            pass
    return f"{path} {expected}; got {json_kind(first.get('input'))}", top


def is_empty(error: Any) -> bool:
    """Whether an error is about an empty text or an empty list."""
    return error.get("type") in ("string_too_short", "too_short") and error.get("input") in ("", [])


def field_description(model: type[BaseModel] | None, field: str) -> str | None:
    """What a top-level field of `model` accepts, in words (None: not a field of it)."""
    if model is None or field not in model.model_fields:
        return None
    schema = model.model_json_schema(ref_template=SCHEMA_REF)
    properties = schema.get("properties", {})
    return described(properties[field], schema.get("$defs", {})) if field in properties else None


def check_body(model: type[BaseModel], body: Any, status: int = 422) -> Any:
    """`body` validated as `model`; RequestError(`status`) with one line naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"expected a JSON object ({model.__name__}), got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, param = validation_message(error.errors(include_url=False), model, body)
        raise RequestError(status, message, param=param) from None


def request_body(model: type[BaseModel], example: Any = None) -> dict[str, Any]:
    """The `openapi_extra` of a route whose JSON body is `model` (added to the components by
    `with_wire_schemas`)."""
    content: dict[str, Any] = {"schema": {"$ref": SCHEMA_REF.format(model=model.__name__)}}
    if example is not None:
        content["example"] = example
    return {"requestBody": {"required": True, "content": {"application/json": content}},
            "x-request-model": model.__name__}


def with_wire_schemas(app: FastAPI) -> None:
    """Make `app.openapi()` hold the request models of every route declared with `request_body`."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                name = operation.pop("x-request-model", None) if isinstance(operation, dict) else None
                model = REQUEST_MODELS.get(name) if name else None
                if model is not None and name not in components:
                    described = model.model_json_schema(ref_template=SCHEMA_REF)
                    components.update(described.pop("$defs", {}))
                    components[name] = described
        document_guard_refusals(schema)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


# What the guards (`guards.Guards`) answer for any request with a body, before its route runs.
GUARD_REFUSALS = {
    "408": "the body did not arrive in time (fewer bytes than its Content-Length)",
    "413": "the body is larger than max_body_bytes",
    "415": "the body is not JSON: send 'Content-Type: application/json' (charset utf-8 or none)",
    "429": "refused unread: this address's last large body was too large (refusal_cooldown_s)",
    "503": "too many requests are still sending their bodies (max_incomplete_bodies), or the server is busy",
}
# A refusal in any of the server's envelopes: an object holding `error` (a message, or OpenAI's object).
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {}}}


def document_guard_refusals(schema: dict[str, Any]) -> None:
    """Every operation taking a body documents the guards' refusals (the statuses any such request may get)."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            if not isinstance(operation, dict) or "requestBody" not in operation:
                continue
            responses = operation.setdefault("responses", {})
            for status, description in GUARD_REFUSALS.items():
                responses.setdefault(status, {"description": description,
                                              "content": {"application/json": {"schema": ERROR_SCHEMA}}})


# Request models by name, filled by `register` (the route modules register theirs at import).
REQUEST_MODELS: dict[str, type[BaseModel]] = {}


def register(model: type[BaseModel]) -> type[BaseModel]:
    """Class decorator: a request model `with_wire_schemas` can describe."""
    REQUEST_MODELS[model.__name__] = model
    return model
