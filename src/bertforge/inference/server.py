"""HTTP serving of a model directory: the FastAPI app, its routes, request validation, the mapping of every
refusal to a status code, offline API documentation.

One route per task the model supports (`POST /v1/fill-mask`, `/v1/classify`, `/v1/tag`, `/v1/answer`,
`/v1/choose` for a multiple-choice model, `/v1/embed`), each taking ``{"inputs": [...], "parameters": {...}}``
and answering ``{"outputs": [...]}`` in input order; `GET /health`, `GET /metrics` (Prometheus text, see
`inference.serving_metrics`) and the OpenAPI pages (`/docs`, `/redoc`, `/openapi.json`), whose scripts and
styles are served from the package (the `fastapi-offline` wheel of the serve extra), so they work without a
network. Any other path answers 404 with ``{"error": ...}`` naming the routes this model serves (a route of a
task the model cannot do, e.g. `/v1/answer` on a classifier, is simply not there); a known path with the
wrong method answers 405 naming the method it takes.

A request is read and validated in the event loop (body size, JSON, fields, sizes, the pipeline's `parse`
and `check_options`) and, if valid, handed to the `inference.scheduler.Scheduler`, which owns the queue, the
micro-batching worker, the token budgets and the dropping of given-up work; it is told when the client
leaves (`client_gone`). Its failures come back as kinds, which `FAILURE_STATUS` maps to HTTP: 413 over
`max_request_tokens`, 422 for an input the model cannot take, 429 when `max_queue` requests wait, 503 past
`request_timeout_s`, 499 when the client left. The server listens on loopback unless told otherwise.

Needs the `serve` extra: fastapi, uvicorn, fastapi-offline (the documentation assets), prometheus_client;
httpx for the tests and the load benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bertforge.data.files import UntrustedJson, decode_json
from bertforge.errors import ConfigError, InputError
from bertforge.inference.pipelines import DEFAULT_PRECISION, Pipeline, load_pipelines
from bertforge.inference.scheduler import (
    Failure,
    JobFailed,
    Scheduler,
    SchedulerSettings,
    check_positive,
)

try:
    import fastapi_offline
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException

    from bertforge.inference.serving_metrics import CONTENT_TYPE, ServingMetrics
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise ConfigError(f"serving needs the 'serve' extra ({missing.name} is not installed): "
                      "pip install 'bertforge[serve]'") from None

log = logging.getLogger(__name__)

# Swagger UI and ReDoc scripts, styles and icon, from the fastapi-offline wheel: /docs needs no CDN.
DOCS_ASSETS = Path(fastapi_offline.__file__).parent / "static"
DOCS_ASSETS_URL = "/docs-assets"


@dataclass
class ServerSettings(SchedulerSettings):
    """Limits of the server: the scheduler's (`SchedulerSettings`: max_batch_size, max_wait_ms,
    max_batch_tokens, max_request_tokens, max_queue, micro_batching, request_timeout_s) and the sizes a
    request may have before it is read into the queue.

    Attributes:
        max_items: inputs per request (more: 413).
        max_chars: characters per text field (more: 413).
        max_body_bytes: request body size (more: 413).
    """

    max_items: int = 64
    max_chars: int = 100_000
    max_body_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, ("max_items", "max_chars", "max_body_bytes"))


# The status of each way the scheduler gives up a request (a test holds it to `scheduler.FAILURES`).
FAILURE_STATUS: dict[Failure, int] = {
    "invalid": 422,  # an input the model cannot take (too long for fill-mask, no window ...)
    "too_large": 413,  # over max_request_tokens
    "busy": 429,  # max_queue requests already waiting
    "timeout": 503,
    # Nobody reads the answer; 499 ("client closed request", as nginx logs it) keeps the metrics honest.
    "disconnect": 499,
    "shutdown": 503,
    "internal": 500,
}


class RequestError(Exception):
    """A request the server refuses before it reaches the scheduler: HTTP status and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def check_sizes(item: Any, index: int, max_chars: int) -> None:
    """413 for a text field longer than `max_chars` (checked before any tokenization)."""
    fields = item.items() if isinstance(item, Mapping) else enumerate(item) if isinstance(item, list) else [("", item)]
    for name, value in fields:
        if isinstance(value, str) and len(value) > max_chars:
            where = f"inputs[{index}]" + (f".{name}" if isinstance(name, str) and name else
                                          f"[{name}]" if name != "" else "")
            raise RequestError(413, f"{where} has {len(value)} characters; this server accepts at most "
                                    f"{max_chars} per text")


class InferenceService:
    """The request handling behind the routes: read, validate, hand to the scheduler, map the outcome."""

    def __init__(self, pipelines: dict[str, Pipeline], settings: ServerSettings, model_name: str):
        self.pipelines = pipelines
        self.settings = settings
        self.model_name = model_name
        self.metrics = ServingMetrics(settings.max_batch_size, settings.max_batch_tokens,
                                      queue_depth=lambda: self.scheduler.queue_depth)
        self.scheduler = Scheduler(pipelines, settings, events=self.metrics)

    async def read_body(self, request: Request) -> Any:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"request body of {declared} bytes is larger than the limit of {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"request body is larger than the limit of {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            raise RequestError(400, 'empty request body; send JSON like {"inputs": ["some text"]}')
        try:
            return decode_json(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise RequestError(400, f"request body is not UTF-8 ({error.reason} at byte {error.start})") from None
        except UntrustedJson as error:
            raise RequestError(400, f"request body refused: {error}") from None

    def validate(self, task: str, body: Any) -> tuple[list[Any], dict[str, Any]]:
        """The parsed inputs and checked options of a request body; RequestError (4xx) naming the first problem."""
        pipeline = self.pipelines[task]
        if not isinstance(body, dict):
            raise RequestError(400, f'expected a JSON object like {{"inputs": [...]}}, got {type(body).__name__}')
        unknown = sorted(set(body) - {"inputs", "parameters"})
        if unknown:
            raise RequestError(422, f"unknown field(s) {unknown}; a request has 'inputs' and optional 'parameters'")
        if "inputs" not in body:
            raise RequestError(422, "missing field 'inputs' (a list of inputs)")
        inputs = body["inputs"]
        if not isinstance(inputs, list):
            raise RequestError(422, f"'inputs' must be a list, got {type(inputs).__name__}")
        if not inputs:
            raise RequestError(422, "'inputs' is empty; send at least one input")
        if len(inputs) > self.settings.max_items:
            raise RequestError(413, f"{len(inputs)} inputs in one request; this server accepts at most "
                                    f"{self.settings.max_items} (split the request)")
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise RequestError(422, f"'parameters' must be an object, got {type(parameters).__name__}")
        try:
            options = pipeline.check_options(parameters)
        except InputError as error:
            raise RequestError(422, f"parameters: {error}") from None
        parsed = []
        for index, item in enumerate(inputs):
            check_sizes(item, index, self.settings.max_chars)
            try:
                parsed.append(pipeline.parse(item))
            except InputError as error:
                raise RequestError(422, f"inputs[{index}]: {error}") from None
        return parsed, options

    async def handle(self, task: str, request: Request) -> tuple[int, dict[str, Any]]:
        """(status, JSON payload) for one request of `task`: its outputs, or an error naming the problem."""
        # From its first byte the request counts as on its way in: the worker may wait for it to join a batch.
        with self.scheduler.incoming():
            try:
                parsed, options = self.validate(task, await self.read_body(request))
                job = self.scheduler.submit(task, parsed, options)
                return 200, {"outputs": await self.scheduler.result(job, gone=client_gone(request))}
            except RequestError as error:
                return error.status, {"error": error.message}
            except JobFailed as error:
                return FAILURE_STATUS[error.kind], {"error": error.message}

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "tasks": list(self.pipelines),
                "queue_depth": self.scheduler.queue_depth,
                "running": len(self.scheduler.running),
                "pipelines": {task: p.describe() for task, p in self.pipelines.items()},
                "settings": asdict(self.settings)}


async def client_gone(request: Request) -> None:
    """Return once the client has closed its connection (the ASGI server says so through `receive`)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # the body was read already: anything else is not news; do not spin


# --- the app ---------------------------------------------------------------------------------------------

REQUEST_SCHEMA = {
    "type": "object", "required": ["inputs"],
    "properties": {"inputs": {"type": "array", "minItems": 1, "items": {}},
                   "parameters": {"type": "object"}},
}


def build_app(pipelines: dict[str, Pipeline], settings: ServerSettings | None = None,
              model_name: str = "model") -> FastAPI:
    """A FastAPI app serving already-loaded pipelines (see `create_app`)."""
    settings = settings or ServerSettings()
    service = InferenceService(pipelines, settings, model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.scheduler.start()
        try:
            yield
        finally:
            await service.scheduler.stop()

    # FastAPI's own /docs and /redoc load their scripts from a CDN (blank offline): ours serve them from the
    # package (`add_docs`).
    app = FastAPI(title="bertforge", description=f"BERT inference for {model_name}: " + ", ".join(pipelines),
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    add_docs(app)

    def add_route(task: str) -> None:
        route = f"/v1/{task}"

        async def endpoint(request: Request) -> JSONResponse:
            began = time.perf_counter()
            status, payload = await service.handle(task, request)
            service.metrics.record_request(route, status, time.perf_counter() - began)
            return JSONResponse(payload, status_code=status)

        endpoint.__name__ = task.replace("-", "_")
        app.add_api_route(
            route, endpoint, methods=["POST"], summary=f"{task} ({pipelines[task].family_name})",
            description=pipelines[task].description,
            responses={400: {"description": "malformed JSON"}, 413: {"description": "too large"},
                       422: {"description": "invalid input"}, 429: {"description": "queue full"}},
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": REQUEST_SCHEMA, "example": pipelines[task].example}}}})

    for task in pipelines:
        add_route(task)

    served = [f"POST /v1/{task}" for task in pipelines] + ["GET /health", "GET /metrics", "GET /docs",
                                                           "GET /redoc", "GET /openapi.json"]

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        # FastAPI's own 404/405 say only "Not Found": say what this model serves instead.
        path = request.url.path
        if error.status_code == 404:
            message = f"no route {request.method} {path}; this model serves: {', '.join(served)}"
        elif error.status_code == 405:
            allowed = [route for route in served if route.split(" ", 1)[1] == path]
            message = f"{request.method} is not allowed on {path}; use {' or '.join(allowed) or 'another route'}"
        else:
            message = str(error.detail)
        return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)

    @app.get("/health", summary="model, tasks, device, precision, queue depth")
    async def health() -> dict[str, Any]:
        return service.health()

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type=CONTENT_TYPE)

    return app


def add_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc over /openapi.json, with every script, style and icon served by this app."""
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=DOCS_ASSETS), name="docs-assets")
    redirect = app.swagger_ui_oauth2_redirect_url

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{redirect}", swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            # The online spec validator would be a request to another host.
            swagger_ui_parameters={"validatorUrl": None})

    @app.get(redirect, include_in_schema=False)
    async def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png", with_google_fonts=False)


def create_app(model_dir: str | Path, *, tasks: list[str] | None = None, device: str = "auto",
               precision: str = DEFAULT_PRECISION, batch_size: int = 32, max_length: int | None = None,
               **settings: Any) -> FastAPI:
    """Load `model_dir` once and build the app serving every task it supports (or `tasks`).

    Args:
        model_dir: a saved model directory.
        tasks: restrict the routes to these tasks.
        device, precision, batch_size, max_length: pipeline options (see `Pipeline`; precision fp32 unless
            asked, as `bertforge evaluate`).
        **settings: `ServerSettings` fields (max_batch_size, max_wait_ms, max_queue, ...).
    """
    try:
        server_settings = ServerSettings(**settings)
    except TypeError as error:
        raise ConfigError(f"unknown server setting: {error}") from None
    pipelines = load_pipelines(model_dir, tasks, device=device, precision=precision, batch_size=batch_size,
                               max_length=max_length)
    return build_app(pipelines, server_settings, model_name=str(model_dir))


def serve(model_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          **options: Any) -> None:
    """Run the server until interrupted (`bertforge serve --model DIR`). Loopback only unless `host` says otherwise."""
    app = create_app(model_dir, **options)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: the server is reachable from other machines and has no authentication", host)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
