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


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    """(one line naming the first problem and its field, the top-level field) of pydantic's errors."""
    if not errors:
        return "invalid request body", None
    first = errors[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(location) or "body"
    kinds = sorted({".".join(str(p) for p in e.get("loc", ()) if p != "body") for e in errors} - {field})
    more = f" (also: {', '.join(kinds[:3])})" if kinds else ""
    return f"{field}: {first.get('msg', 'invalid')}{more}", location[0] if location else None


def check_body(model: type[BaseModel], body: Any, status: int = 422) -> Any:
    """`body` validated as `model`; RequestError(`status`) with one line naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"expected a JSON object ({model.__name__}), got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, param = validation_message(error.errors(include_url=False))
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
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


# Request models by name, filled by `register` (the route modules register theirs at import).
REQUEST_MODELS: dict[str, type[BaseModel]] = {}


def register(model: type[BaseModel]) -> type[BaseModel]:
    """Class decorator: a request model `with_wire_schemas` can describe."""
    REQUEST_MODELS[model.__name__] = model
    return model
