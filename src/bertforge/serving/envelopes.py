"""The error body of each API style the server speaks, chosen by the request's path.

One refusal can be made in several places (a guard before the route runs, the route's validation, the
scheduler), and the client must get it in the envelope its API documents, whoever refused:

- OpenAI style (`/v1/embeddings`, `/v1/models`): ``{"error": {"message", "type", "param", "code"}}``,
  as the OpenAI API documents its errors;
- text-embeddings-inference style (`POST /`, `/invocations`, `/embed`, `/embed_all`, `/rerank`, `/predict`, `/tokenize`, `/decode`,
  `/info`): ``{"error": message, "error_type": kind}``, TEI's `ErrorResponse`;
- bertforge's own routes (everything else): ``{"error": message}``.

`RequestError` is a refusal on its way to the client (status, message, the field at fault, headers such as
Retry-After); every server room raises it and `model_service.refusal` answers it in the path's envelope.
No web framework is imported here: the server, its guards and its request models all reach down to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from bertforge.errors import ConfigError

Style = Literal["openai", "tei", "bertforge"]

OPENAI_PATHS = ("/v1/embeddings", "/v1/models")
TEI_PATHS = ("/", "/invocations", "/embed", "/embed_all", "/embed_sparse", "/similarity", "/rerank", "/predict", "/tokenize",
             "/decode", "/info")

# The OpenAI error `type` for each status (its documented families of errors).
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
                415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
                499: "client_closed_request", 503: "server_error", 500: "server_error"}
# OpenAI's `error.code` of the refusals that have one by their status alone (its SDKs and the frameworks on
# them branch on it). Others are named where they are made, as OpenAI's API names the same refusal:
# `model_not_found` (404), `missing_required_parameter`, `unknown_parameter` and `invalid_type` (400, a
# body's field: `wire_schemas.openai_code`), `server_is_overloaded` (503 while the server cannot take the
# request: too many bodies arriving, shutting down). The rest stay null, as OpenAI leaves them: its embeddings
# route answers too many inputs, an empty text, and even an input over the model's context length, with
# `code: null` (`context_length_exceeded` is its chat routes' code, and this server windows long texts).
OPENAI_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
# A code whose OpenAI `type` is not its status's (OpenAI sends server_is_overloaded as service_unavailable_error).
OPENAI_CODE_TYPES = {"server_is_overloaded": "service_unavailable_error"}
OVERLOADED = "server_is_overloaded"
# TEI's `error_type` for each status (its ErrorType names: Validation, Tokenizer, Overloaded, Unhealthy,
# Backend, Empty); statuses TEI never sends get the closest one.
TEI_TYPES = {400: "Validation", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "Validation",
             413: "Validation", 415: "Validation", 422: "Validation", 429: "Overloaded", 499: "Cancelled",
             503: "Unhealthy", 500: "Backend"}


def style_of(path: str) -> Style:
    """The API style of a request path (a path prefixed by `/models/<name>` has the style of its rest)."""
    if path.startswith("/models/"):
        rest = path.split("/", 3)
        path = "/" + rest[3] if len(rest) > 3 else "/"
    if any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS):
        return "openai"
    if path in TEI_PATHS:
        return "tei"
    return "bertforge"


def error_payload(path: str, status: int, message: str, *, param: str | None = None,
                  code: str | None = None) -> dict[str, Any]:
    """The JSON body of a refusal with `status` and `message`, in the envelope of `path`'s API style."""
    style = style_of(path)
    if style == "openai":
        code = code or OPENAI_CODES.get(status)
        kind = OPENAI_CODE_TYPES.get(code or "") or OPENAI_TYPES.get(status, "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    if style == "tei":
        return {"error": message, "error_type": TEI_TYPES.get(status, "Backend")}
    return {"error": message}


class RequestError(Exception):
    """A request the server refuses: HTTP status, a message for the client, and the field at fault (OpenAI's
    `param`) when there is one."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})  # e.g. Retry-After of a 429


def serve_extra_missing(missing: ImportError) -> ConfigError:
    """The one error for a server module imported without the optional `serve` extra."""
    return ConfigError(f"serving needs the 'serve' extra ({missing.name} is not installed): "
                       "pip install 'bertforge[serve]'")
