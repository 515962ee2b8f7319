"""Request and response models of the wire-format routes (OpenAI, text-embeddings-inference, Cohere) as
pydantic models, and their place in `/openapi.json`.

A route reads its body itself (`model_service.read_body`: size limit, the untrusted-JSON decoder) and then
validates it with `check_body` against a strict model (unknown fields refused, no coercion of "1" to 1 or
of 1 to true); the model also describes the body in the OpenAPI document (`request_body` points at it,
`with_wire_schemas` puts it in the components), so generated clients and fuzzers learn every field.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, get_args

from bertforge.serving.envelopes import RequestError, serve_extra_missing
from bertforge.serving.guards import note_ignored
from bertforge.tokenization.normalizer import blank_characters

try:
    from fastapi import FastAPI
    from pydantic import BaseModel, ConfigDict, Field, ValidationError
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise serve_extra_missing(missing) from None

WIRE_CONFIG = ConfigDict(extra="forbid", strict=True)
# The models of another server's routes (TEI's, Cohere's, Infinity's): fields they do not use are ignored, as
# those servers ignore them (the route lists them in X-Ignored-Fields: `unknown_fields`); types stay strict.
LENIENT_CONFIG = ConfigDict(extra="ignore", strict=True)
SCHEMA_REF = "#/components/schemas/{model}"
# A mark in a JSON schema for what the served models decide (`fit_to_models` replaces it by the bound).
FIT = "x-fit"
# A mark on an operation: the task its model must serve ("any": every model answers it).
SERVES = "x-serves"
ANY_MODEL = "any"
# The `SERVES` mark of a model's own route (`POST /`): its body is that of the model's kind.
ROOT = "root"


def fitted(kind: str) -> dict[str, Any]:
    """`json_schema_extra` of a field whose bounds the served models decide: "text" (not blank), "word" (not
    whitespace alone), "token-id" (in the vocabulary), "dimensions" (a width a model gives), "prompt-name" (one
    of the models' prompts), "layer" (a layer the models have), "items" (a request's inputs, at most
    `max_items`)."""
    return {FIT: kind}


# The wire routes' shared field types. A text: at least one character the tokenizer reads (an empty or blank
# text is refused); token ids of the served vocabulary; a vector width a served model gives.
Text = Annotated[str, Field(min_length=1, description="a text (not blank)", json_schema_extra=fitted("text"))]
TokenId = Annotated[int, Field(ge=0, json_schema_extra=fitted("token-id"))]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Dimensions = Annotated[int, Field(ge=1, json_schema_extra=fitted("dimensions"))]
# A request's list of inputs: at least one, at most the server's `max_items`.
INPUTS = Field(min_length=1, json_schema_extra=fitted("items"))


@lru_cache(maxsize=1)
def text_pattern() -> str:
    """A regular expression that finds one character the tokenizer reads (`normalizer.is_blank_char` is false
    for it): a text it matches is not blank. Characters beyond U+FFFF are written as themselves (the
    escapes for them differ between regular-expression dialects)."""
    def escape(cp: int) -> str:
        return f"\\u{cp:04x}" if cp <= 0xFFFF else chr(cp)

    ranges = "".join(escape(first) + ("" if first == last else "-" + escape(last)) for first, last in blank_characters())
    return f"[^{ranges}]"


@dataclass(frozen=True)
class ServedFacts:
    """What the served models decide about the requests the server takes, so the OpenAPI document describes
    exactly those (`fit_to_models`).

    Attributes:
        models: an operation's `SERVES` mark -> the model names its `/models/{model}` form answers for.
        unnamed: the `SERVES` marks whose path without a model name answers (one model serves the task).
        vocab_size: the smallest vocabulary of the served models (token ids are below it).
        dimensions: the vector widths `dimensions` may ask for (each model's own, and its Matryoshka widths).
        prompt_names: the sentence-transformers prompts `prompt_name` may name.
        layers: the fewest encoder layers of the served models (`layer` lies in [-layers - 1, layers]).
        max_items: the most inputs one request may hold.
        roots: each model's name -> the request model its own route (`POST /models/<name>`, `ROOT`) takes.
        keys: whether the server needs an API key; `open_paths`: the paths that do not.
        max_sparse_terms: the most terms a sparse vector may ask to keep (`max_terms`; 0: no cap).
    """

    models: Mapping[str, tuple[str, ...]]
    unnamed: frozenset[str]
    vocab_size: int
    dimensions: tuple[int, ...]
    prompt_names: tuple[str, ...]
    layers: int
    max_items: int
    roots: Mapping[str, str]
    keys: bool = False
    open_paths: tuple[str, ...] = ()
    max_sparse_terms: int = 0


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


def first_error(errors: Sequence[Any]) -> Any:
    """The most telling of pydantic's errors: an unknown or missing field, then an empty text or list anywhere
    (the deepest location of a union's branches), then the first."""
    order = {"extra_forbidden": 0, "missing": 1, **dict.fromkeys(CONSTRAINTS, 2)}
    return min(errors, key=lambda e: (2 if is_empty(e) else order.get(e.get("type"), 3), errors.index(e)))


def openai_code(error: Any) -> str | None:
    """OpenAI's `error.code` for the kind of a pydantic error, where its API names that refusal (an unknown
    field, a missing one, a value of the wrong JSON type); None otherwise, as OpenAI leaves it."""
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown_parameter"
    if kind == "missing":
        return "missing_required_parameter"
    if kind.endswith("_type"):
        return "invalid_type"
    return None


def validation_message(errors: Sequence[Any], model: type[BaseModel] | None = None,
                       body: Any = None) -> tuple[str, str | None]:
    """(one line naming the first problem, its field and the fix, the top-level field) of pydantic's errors,
    in our words (never pydantic's messages or its union branch names). With the request `model` and `body`,
    a field of the wrong shape is answered with what the field accepts and what was sent."""
    if not errors:
        return "invalid request body", None
    # The most telling error first: an unknown or missing field, then an empty text or list anywhere (the
    # deepest location of a union's branches), then the first.
    first = first_error(errors)
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
    accepts = field_description(model, location) if top is not None and kind not in CONSTRAINTS else None
    if accepts is not None:
        sent = body.get(top) if isinstance(body, dict) and path == top else first.get("input")
        return f"{path} must be {accepts}; got {json_kind(sent)}", top
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


def field_description(model: type[BaseModel] | None, location: str | Sequence[Any]) -> str | None:
    """What the field of `model` at `location` (a top-level name, or an error's location: `filter.source`,
    `inputs[2]`) accepts, in words; None where the schema does not say (not a field of it)."""
    parts = [location] if isinstance(location, str) else [part for part in location if error_path([part]) != "body"]
    if model is None or not parts or parts[0] not in model.model_fields:
        return None
    root = model.model_json_schema(ref_template=SCHEMA_REF)
    components, schema = root.get("$defs", {}), root
    for part in parts:
        while "$ref" in schema:
            schema = components.get(schema["$ref"].rsplit("/", 1)[-1], {})
        branches = [b for b in schema.get("anyOf") or schema.get("oneOf") or () if b.get("type") != "null"]
        if len(branches) == 1:  # an optional field: the schema of its value
            schema = branches[0]
        if isinstance(part, int) and schema.get("type") == "array":
            schema = schema.get("items", {})
        elif isinstance(part, str) and part in schema.get("properties", {}):
            schema = schema["properties"][part]
        elif isinstance(part, str) and isinstance(schema.get("additionalProperties"), dict):
            schema = schema["additionalProperties"]
        else:
            return None
    return described(schema, components)


def check_body(model: type[BaseModel], body: Any, status: int = 422) -> Any:
    """`body` validated as `model`; RequestError(`status`) with one line naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"expected a JSON object ({model.__name__}), got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        errors = error.errors(include_url=False)
        message, param = validation_message(errors, model, body)
        raise RequestError(status, message, param=param, code=openai_code(first_error(errors)) if errors else None
                           ) from None


def unknown_fields(model: type[BaseModel], body: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The fields of `body` that `model` does not have, by their path (`options`, `parameters.colour`), in
    order: what a lenient model (extra="ignore") drops without a word."""
    found = []
    for name, value in body.items():
        field = model.model_fields.get(name)
        if field is None:
            found.append(prefix + name)
            continue
        inner = [kind for kind in (field.annotation, *get_args(field.annotation))
                 if isinstance(kind, type) and issubclass(kind, BaseModel)]
        if inner and isinstance(value, Mapping):
            found += unknown_fields(inner[0], value, f"{prefix}{name}.")
    return found


def lenient_body(model: type[BaseModel], body: Any, request: Any) -> Any:
    """`body` validated as `model` (a lenient one, `LENIENT_CONFIG`), the fields it ignored noted for the
    answer's ``X-Ignored-Fields`` (`guards.note_ignored`)."""
    if isinstance(body, dict):
        note_ignored(request.scope, unknown_fields(model, body))
    return check_body(model, body)


def request_body(model: type[BaseModel] | tuple[type[BaseModel], ...], example: Any = None,
                 serves: str | None = None) -> dict[str, Any]:
    """The `openapi_extra` of a route whose JSON body is `model` (several: any of them, the route telling them
    apart, as lenient bodies may match more than one; added to the components by `with_wire_schemas`); `serves`:
    the task its model must serve (`SERVES`)."""
    bodies = model if isinstance(model, tuple) else (model,)
    refs = [{"$ref": SCHEMA_REF.format(model=one.__name__)} for one in bodies]
    content: dict[str, Any] = {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}
    if example is not None:
        content["example"] = example
    names = [one.__name__ for one in bodies]
    return {"requestBody": {"required": True, "content": {"application/json": content}},
            "x-request-model": names[0] if len(names) == 1 else names, **({SERVES: serves} if serves else {})}


def with_wire_schemas(app: FastAPI, facts: ServedFacts | None = None) -> None:
    """Make `app.openapi()` hold the request models of every route declared with `request_body`, fitted to
    the served models (`facts`, see `fit_to_models`)."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                names = operation.pop("x-request-model", None) if isinstance(operation, dict) else None
                for name in [names] if isinstance(names, str) else names or []:
                    model = REQUEST_MODELS.get(name) if name else None
                    if model is not None and name not in components:
                        described = model.model_json_schema(ref_template=SCHEMA_REF)
                        components.update(described.pop("$defs", {}))
                        components[name] = described
        document_guard_refusals(schema)
        if facts is not None:
            fit_to_models(schema, facts)
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


def fit_to_models(schema: dict[str, Any], facts: ServedFacts) -> None:
    """Make the document describe exactly the requests these models take (a generated valid request is
    answered, an invalid one refused):

    - an operation marked `SERVES` lists in its `{model}` parameter the models that answer it, and is left out
      where none does (TEI's /rerank without a reranker) or, without `{model}`, where the path alone names no
      model (several serve the task: the server answers 400 asking for a name);
    - each `FIT` mark becomes its bound: non-blank text, a token id below the vocabulary size, the widths
      `dimensions` may take, the prompt names, the layer range, the sparse terms a request may keep (a branch
      nothing can match is dropped);
    - with API keys, a bearer scheme and the 401 on every operation outside the open paths.
    """
    paths = schema.get("paths", {})
    own: dict[str, Any] = {}
    for path, item in list(paths.items()):
        for method, operation in list(item.items()):
            serves = operation.pop(SERVES, None) if isinstance(operation, dict) else None
            if serves == ROOT:
                del item[method]
                own.update(own_routes(path, method, operation, facts.roots))
                continue
            if serves is None:
                continue
            names = facts.models.get(serves, ())
            if "{model}" in path and names:
                for parameter in operation.get("parameters", []):
                    if parameter.get("in") == "path" and parameter.get("name") == "model":
                        parameter["schema"] = {"type": "string", "title": "Model", "enum": list(names)}
            elif "{model}" in path or serves not in facts.unnamed:
                del item[method]
        if not item:
            del paths[path]
    paths.update(own)
    bounds: dict[str, dict[str, Any] | None] = {
        "text": {"pattern": text_pattern()}, "word": {"pattern": "\\S"},
        "token-id": {"maximum": facts.vocab_size - 1},
        "dimensions": {"enum": list(facts.dimensions)} if facts.dimensions else None,
        "prompt-name": {"enum": list(facts.prompt_names)} if facts.prompt_names else None,
        "layer": {"minimum": -facts.layers - 1, "maximum": facts.layers},
        "items": {"maxItems": facts.max_items},
        "sparse-terms": {"maximum": facts.max_sparse_terms} if facts.max_sparse_terms else {},
    }
    schema["paths"] = fit_marks(paths, bounds)
    schema["components"] = fit_marks(schema.get("components", {}), bounds)
    if facts.keys:
        secure(schema, facts.open_paths)


def own_routes(path: str, method: str, operation: dict[str, Any], roots: Mapping[str, str]) -> dict[str, Any]:
    """A model's own route (`POST /models/{model}`, `/`) as one path per model, each with the body of its
    model's kind (an embedder's `/models/e` takes TEI's /embed body, a classifier's its /predict body); the
    path without a model name only where one model is served."""
    def with_body(name: str, component: str) -> dict[str, Any]:
        own = copy.deepcopy(operation)
        own["parameters"] = [p for p in own.get("parameters", []) if p.get("name") != "model"] or None
        own["requestBody"]["content"]["application/json"]["schema"] = {"$ref": SCHEMA_REF.format(model=component)}
        own["operationId"] = f"{own.get('operationId', 'own')}_{name}"
        return {method: {key: value for key, value in own.items() if value is not None}}

    if "{model}" in path:
        return {path.replace("{model}", name): with_body(name, component) for name, component in roots.items()}
    if len(roots) == 1:
        return {path: with_body(*next(iter(roots.items())))}
    return {}


def fit_marks(value: Any, bounds: Mapping[str, dict[str, Any] | None]) -> Any:
    """`value` with every `FIT` mark replaced by its bound (None: nothing matches; such a branch of an anyOf or
    oneOf is dropped)."""
    if isinstance(value, list):
        return [fit_marks(item, bounds) for item in value]
    if not isinstance(value, dict):
        return value
    fitted_value = {key: fit_marks(item, bounds) for key, item in value.items() if key != FIT}
    if FIT in value:
        bound = bounds[value[FIT]]
        if bound is None:
            return None
        fitted_value.update(bound)
        if "enum" in bound:
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                fitted_value.pop(key, None)
    for union in ("anyOf", "oneOf"):
        if union in fitted_value:
            fitted_value[union] = [branch for branch in fitted_value[union] if branch is not None]
    return fitted_value


def secure(schema: dict[str, Any], open_paths: Sequence[str]) -> None:
    """A bearer-key scheme on every operation outside `open_paths`, each documenting the 401."""
    schema.setdefault("components", {})["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer", "description": "one of the keys given to `serve --api-key`"}}
    for path, item in schema.get("paths", {}).items():
        if path in open_paths:
            continue
        for operation in item.values():
            if isinstance(operation, dict):
                operation["security"] = [{"bearer": []}]
                operation.setdefault("responses", {}).setdefault("401", {
                    "description": "no API key, or one this server does not hold",
                    "content": {"application/json": {"schema": ERROR_SCHEMA}}})


# Request models by name, filled by `register` (the route modules register theirs at import).
REQUEST_MODELS: dict[str, type[BaseModel]] = {}


def register(model: type[BaseModel]) -> type[BaseModel]:
    """Class decorator: a request model `with_wire_schemas` can describe (one per name: the document's
    components are named after them)."""
    known = REQUEST_MODELS.get(model.__name__)
    if known is not None and known is not model:
        raise ValueError(f"two request models are named {model.__name__} ({known.__module__}, {model.__module__}); "
                         "their OpenAPI components would collide: rename one")
    REQUEST_MODELS[model.__name__] = model
    return model
