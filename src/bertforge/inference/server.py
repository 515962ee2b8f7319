"""HTTP serving of a model directory: FastAPI routes, a micro-batching worker, Prometheus metrics.

One route per task the model supports (`POST /v1/fill-mask`, `/v1/classify`, `/v1/tag`, `/v1/answer`,
`/v1/choose` for a multiple-choice model, `/v1/embed`), each taking ``{"inputs": [...], "parameters": {...}}``
and answering ``{"outputs": [...]}`` in input order; `GET /health`, `GET /metrics` (Prometheus text) and the OpenAPI pages (`/docs`, `/openapi.json`).
Any other path answers 404 with ``{"error": ...}`` naming the routes this model serves (a route of a task the
model cannot do, e.g. `/v1/answer` on a classifier, is simply not there); a known path with the wrong method
answers 405 naming the method it takes.

Requests are validated in the event loop (JSON, fields, sizes) and, if valid, queued. A single worker task
takes the first waiting request, gathers more for up to `max_wait_ms` (only while other requests are on their
way in, so an idle server adds no delay) or until `max_batch_size` inputs, and
runs each group (same task and parameters) as one pipeline call in a single model thread, so concurrent
clients share model calls and throughput grows with them. While the model runs, new requests pile up and
form the next batch. The queue is bounded: when `max_queue` requests wait, new ones get 429 at once.
A bad input never takes the worker down: a failed batch is retried request by request, so only the bad one
fails (422 for invalid inputs). The server listens on loopback unless told otherwise.

Needs the `serve` extra: fastapi, uvicorn (httpx for the tests and the load benchmark).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError, ConfigError, InputError
from bertforge.inference.pipelines import DEFAULT_PRECISION, Pipeline, load_pipelines

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
    from starlette.exceptions import HTTPException
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise ConfigError(f"serving needs the 'serve' extra ({missing.name} is not installed): "
                      "pip install 'bertforge[serve]'") from None

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class ServerSettings:
    """Limits and batching of the server.

    Attributes:
        max_batch_size: inputs gathered into one model call (a single larger request still runs whole).
        max_wait_ms: how long an idle worker waits for more requests before running what it has.
        max_queue: requests waiting for the worker; beyond it requests get 429 immediately.
        max_items: inputs per request (more: 413).
        max_chars: characters per text field (more: 413).
        max_body_bytes: request body size (more: 413).
        micro_batching: False runs every request alone (for comparison in benchmarks).
        request_timeout_s: a request not answered in this time gets 503.
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 256
    max_items: int = 64
    max_chars: int = 100_000
    max_body_bytes: int = 8 * 1024 * 1024
    micro_batching: bool = True
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_queue", "max_items", "max_chars", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"server {name} must be a positive integer, got {value!r}")
        for name in ("max_wait_ms", "request_timeout_s"):
            if not float(getattr(self, name)) >= 0:
                raise ConfigError(f"server {name} must be >= 0, got {getattr(self, name)!r}")


class RequestError(Exception):
    """A request the server refuses: HTTP status and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Job:
    """One request's validated inputs waiting for the worker."""

    task: str
    key: str  # task + canonical parameters: only jobs with equal keys share a model call
    parsed: list[Any]
    options: dict[str, Any]
    future: asyncio.Future


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {count}' for bound, count in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{suffix} {self.total:.6f}", f"{name}_count{suffix} {self.count}"]
        return out


@dataclass
class Metrics:
    """Counters the /metrics route reports; touched only from the event loop thread."""

    requests: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    latency: dict[str, Histogram] = field(default_factory=dict)
    batch_sizes: Histogram | None = None
    inputs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    model_calls: int = 0

    def record_request(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def render(self, queue_depth: int) -> str:
        lines = ["# HELP bertforge_requests_total HTTP requests by route and status code.",
                 "# TYPE bertforge_requests_total counter"]
        lines += [f'bertforge_requests_total{{route="{r}",status="{s}"}} {n}'
                  for (r, s), n in sorted(self.requests.items())]
        lines += ["# HELP bertforge_request_latency_seconds Time from request arrival to response.",
                  "# TYPE bertforge_request_latency_seconds histogram"]
        for route, histogram in sorted(self.latency.items()):
            lines += histogram.lines("bertforge_request_latency_seconds", f'route="{route}"')
        lines += ["# HELP bertforge_batch_size Inputs per model call (micro-batch size).",
                  "# TYPE bertforge_batch_size histogram"]
        if self.batch_sizes is not None:
            lines += self.batch_sizes.lines("bertforge_batch_size")
        lines += ["# HELP bertforge_inputs_total Inputs processed by task.", "# TYPE bertforge_inputs_total counter"]
        lines += [f'bertforge_inputs_total{{task="{t}"}} {n}' for t, n in sorted(self.inputs.items())]
        lines += ["# HELP bertforge_model_calls_total Pipeline calls made by the worker.",
                  "# TYPE bertforge_model_calls_total counter", f"bertforge_model_calls_total {self.model_calls}",
                  "# HELP bertforge_queue_depth Requests waiting for the worker.",
                  "# TYPE bertforge_queue_depth gauge", f"bertforge_queue_depth {queue_depth}"]
        return "\n".join(lines) + "\n"


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
    """The queue, the worker and the request handling behind the routes."""

    def __init__(self, pipelines: dict[str, Pipeline], settings: ServerSettings, model_name: str):
        self.pipelines = pipelines
        self.settings = settings
        self.model_name = model_name
        self.metrics = Metrics(batch_sizes=Histogram(tuple(2.0 ** i for i in range(
            int(math.log2(settings.max_batch_size)) + 2))))
        self.queue: asyncio.Queue[Job] | None = None
        self.arrived: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None
        self.executor: ThreadPoolExecutor | None = None
        # Requests between arrival and answer; when every one of them is already in the batch being gathered,
        # nobody can join it, so the worker runs at once instead of waiting (no added latency when idle).
        self.active = 0

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.queue = asyncio.Queue(maxsize=self.settings.max_queue)
        self.arrived = asyncio.Event()
        # One thread runs every model call: the model is never used concurrently, and the event loop stays free.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model")
        self.worker = asyncio.create_task(self.work(), name="bertforge-batcher")

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker
        if self.queue is not None:
            while not self.queue.empty():
                job = self.queue.get_nowait()
                if not job.future.done():
                    job.future.set_exception(RequestError(503, "the server is shutting down"))
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    # --- request handling --------------------------------------------------------------------------------
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
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RequestError(400, f"request body is not valid JSON ({error})") from None

    def validate(self, task: str, body: Any) -> Job:
        """The job for a request body; RequestError (4xx) naming the first problem."""
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
        key = task + json.dumps(options, sort_keys=True)
        return Job(task, key, parsed, options, asyncio.get_running_loop().create_future())

    async def handle(self, task: str, request: Request) -> tuple[int, dict[str, Any]]:
        self.active += 1
        try:
            return await self.answer(task, request)
        finally:
            self.active -= 1

    async def answer(self, task: str, request: Request) -> tuple[int, dict[str, Any]]:
        try:
            job = self.validate(task, await self.read_body(request))
            try:
                self.queue.put_nowait(job)
            except asyncio.QueueFull:
                raise RequestError(429, f"server busy: {self.settings.max_queue} requests are already waiting; "
                                        "retry shortly") from None
            self.arrived.set()
            timeout = self.settings.request_timeout_s or None
            try:
                outputs = await asyncio.wait_for(job.future, timeout)
            except TimeoutError:
                raise RequestError(503, f"no answer within {self.settings.request_timeout_s:g} s; the server "
                                        "is overloaded") from None
            return 200, {"outputs": outputs}
        except RequestError as error:
            return error.status, {"error": error.message}

    # --- the worker ----------------------------------------------------------------------------------------
    async def gather(self, first: Job) -> list[Job]:
        """`first` plus whatever arrives within `max_wait_ms`, up to `max_batch_size` inputs."""
        jobs, count = [first], len(first.parsed)
        if not self.settings.micro_batching:
            return jobs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.max_wait_ms / 1000
        while count < self.settings.max_batch_size:
            while count < self.settings.max_batch_size and not self.queue.empty():
                job = self.queue.get_nowait()
                jobs.append(job)
                count += len(job.parsed)
            remaining = deadline - loop.time()
            if count >= self.settings.max_batch_size or remaining <= 0 or self.active <= len(jobs):
                break
            self.arrived.clear()
            if not self.queue.empty():
                continue
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except TimeoutError:
                break
        return jobs

    async def work(self) -> None:
        while True:
            first = await self.queue.get()
            try:
                jobs = [job for job in await self.gather(first) if not job.future.done()]
                groups: dict[str, list[Job]] = defaultdict(list)
                for job in jobs:
                    groups[job.key].append(job)
                for group in groups.values():
                    await self.run_group(group)
            except asyncio.CancelledError:
                raise
            except Exception:  # the worker must survive anything; each job already got its answer or error
                log.exception("batch worker error")

    async def run_group(self, group: list[Job]) -> None:
        pipeline = self.pipelines[group[0].task]
        parsed = [item for job in group for item in job.parsed]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self.executor, pipeline.run_parsed, parsed, group[0].options)
        except Exception as error:
            if len(group) > 1:
                # Find the culprit: every other request still gets its answer.
                for job in group:
                    await self.run_group([job])
                return
            job = group[0]
            if not job.future.done():
                if isinstance(error, BertforgeError):  # an input the model cannot take (too long ...)
                    job.future.set_exception(RequestError(422, str(error)))
                else:
                    log.exception("model call failed")
                    job.future.set_exception(RequestError(500, f"internal error: {type(error).__name__}: {error}"))
            return
        self.metrics.model_calls += 1
        self.metrics.batch_sizes.observe(len(parsed))
        self.metrics.inputs[group[0].task] += len(parsed)
        start = 0
        for job in group:
            if not job.future.done():
                job.future.set_result(results[start:start + len(job.parsed)])
            start += len(job.parsed)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "tasks": list(self.pipelines),
                "queue_depth": self.queue.qsize() if self.queue is not None else 0,
                "pipelines": {task: p.describe() for task, p in self.pipelines.items()},
                "settings": asdict(self.settings)}


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
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="bertforge", description=f"BERT inference for {model_name}: " + ", ".join(pipelines),
                  lifespan=lifespan)
    app.state.service = service

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
                                                           "GET /openapi.json"]

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
        depth = service.queue.qsize() if service.queue is not None else 0
        return PlainTextResponse(service.metrics.render(depth), media_type="text/plain; version=0.0.4")

    return app


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
