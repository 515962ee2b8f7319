"""The browser page of the server: `GET /` opens a page where a person types text and sees what each served
model makes of it, and `POST /v1/attention` (+ `/models/<name>/v1/attention`), the attention maps it draws.

The page is three files shipped in the package (`serving/static/`: page.html, page.js, page.css; package data
in pyproject.toml), served from `/page/`; nothing is loaded from another host (the answer's
Content-Security-Policy says so to the browser too). The script discovers the served models from `/health`
and calls the same routes as any client (`/models/<name>/v1/<task>`; `POST /search` for the indexes `/health`
lists, the Search tab), with the API key typed into the page
as ``Authorization: Bearer``; it shows a refusal as the server words it. The page and its files need no key
(`guards.OPEN_PAGE_PATHS`): they hold no data, and every request they make is checked like any other.

`/v1/attention` runs the served model's own encoder (`inference.attention.AttentionSteps`, the code behind
`bertforge attention`) through the model's scheduler, as every model route does (the same queue bound and
429, disconnects and metrics; `InferenceService.run`): a body ``{"inputs": [text]}``
answers ``{"outputs": [{"tokens": [...], "attentions": [L][N][T][T]}]}`` (row i: where token i attends; each
row sums to 1), weights rounded to 4 decimals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.serving.model_service import ModelSet, RequestError, read_body, refusal  # isort: skip

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from bertforge.inference.attention import ATTENTION_TASK, MAX_TOKENS
from bertforge.serving.guards import PAGE_ASSETS_URL, note_model
from bertforge.serving.task_routes import MODEL_PREFIX, TASK_RESPONSES
from bertforge.serving.wire_schemas import ANY_MODEL, FIT, SERVES

STATIC = Path(__file__).parent / "static"
# Everything the page loads comes from this server; inline scripts and styles are refused too.
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
# The attention route takes one text (its maps are L x N x T x T numbers).
ATTENTION_EXAMPLE = {"inputs": ["The cat sat on the mat because it was tired."]}
TEXT_SCHEMA = {"type": "string", "minLength": 1, FIT: "text"}
ATTENTION_SCHEMA = {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
    "inputs": {"type": "array", "minItems": 1, "maxItems": 1,
               "items": {"oneOf": [TEXT_SCHEMA, {"type": "object", "required": ["text"], "additionalProperties": False,
                                                 "properties": {"text": TEXT_SCHEMA}}]}},
    "parameters": {"type": "object", "maxProperties": 0}}}


def attention_text(body: Any) -> str:
    """The one text of an attention request; RequestError (400/422) naming the field and the fix."""
    if not isinstance(body, dict):
        raise RequestError(400, 'expected a JSON object like {"inputs": ["a text"]}')
    unknown = sorted(set(body) - {"inputs", "parameters"})
    if unknown:
        raise RequestError(422, f"unknown field(s) {unknown}; a request has 'inputs' and optional 'parameters'")
    if body.get("parameters", {}) != {}:
        raise RequestError(422, "parameters: the attention route takes none; leave 'parameters' out")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        raise RequestError(422, "'inputs' must be a list of exactly one text (one map per request)")
    item = inputs[0]
    if isinstance(item, dict) and set(item) == {"text"}:
        item = item["text"]
    if not isinstance(item, str):
        raise RequestError(422, 'inputs[0] must be a text or {"text": ...}')
    return item


def attention_payload(tokens: list[str], maps: Any) -> dict[str, Any]:
    return {"tokens": tokens,
            "attentions": [[[[round(w, 4) for w in row] for row in head] for head in layer] for layer in maps.tolist()]}


def add_attention_routes(app: FastAPI, models: ModelSet) -> list[str]:
    """`POST /v1/attention` and `/models/{model}/v1/attention`: every served model has an encoder."""
    async def attention(request: Request, name: str | None) -> JSONResponse:
        service = None
        try:
            service = models.named(name)
            with service.scheduler.incoming():
                text = attention_text(await read_body(request, service.settings))
                # An empty text, or too many tokens for a readable map: 422 from the scheduler, before the model.
                [(tokens, maps)] = await service.run(ATTENTION_TASK, [text], {}, request)
            response = JSONResponse({"outputs": [attention_payload(tokens, maps)]})
        except RequestError as error:
            response = refusal(request, error.status, error.message, headers=error.headers)
        if service is not None:
            note_model(request.scope, service.model_name)
        return response

    async def attention_of_default(request: Request) -> JSONResponse:
        return await attention(request, None)

    async def attention_of_model(request: Request, model: str) -> JSONResponse:
        return await attention(request, model)

    options = dict(summary="attention maps of one text (every layer and head)", responses=TASK_RESPONSES,
                   description=f"Runs the model's encoder on one text (at most {MAX_TOKENS} tokens) and answers "
                   "its tokens and attention probabilities [layer][head][from token][to token]; each row sums "
                   "to 1. With several models served, name one: /models/<name>/v1/attention.",
                   openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                       "schema": ATTENTION_SCHEMA, "example": ATTENTION_EXAMPLE}}}, SERVES: ANY_MODEL})
    app.add_api_route("/v1/attention", attention_of_default, methods=["POST"], **options)
    app.add_api_route(MODEL_PREFIX + "/v1/attention", attention_of_model, methods=["POST"], **options)
    return ["POST /v1/attention", f"POST {MODEL_PREFIX}/v1/attention"]


def add_page(app: FastAPI, models: ModelSet) -> list[str]:
    """`GET /` (the page), its files under `/page/`, and the attention routes it draws from; the routes
    added, as "METHOD path"."""
    app.mount(PAGE_ASSETS_URL, StaticFiles(directory=STATIC), name="page-assets")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "page.html", media_type="text/html",
                            headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"})

    return ["GET /", *add_attention_routes(app, models)]


__all__ = ["add_page", "attention_text"]
