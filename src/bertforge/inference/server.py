"""HTTP serving of a model directory: FastAPI routes, a micro-batching worker that bounds and interleaves
the work of every request, Prometheus metrics, offline API documentation.

One route per task the model supports (`POST /v1/fill-mask`, `/v1/classify`, `/v1/tag`, `/v1/answer`,
`/v1/choose` for a multiple-choice model, `/v1/embed`), each taking ``{"inputs": [...], "parameters": {...}}``
and answering ``{"outputs": [...]}`` in input order; `GET /health`, `GET /metrics` (Prometheus text) and the
OpenAPI pages (`/docs`, `/redoc`, `/openapi.json`), whose scripts and styles are served from the package
(the `fastapi-offline` wheel of the serve extra), so they work without a network.
Any other path answers 404 with ``{"error": ...}`` naming the routes this model serves (a route of a task the
model cannot do, e.g. `/v1/answer` on a classifier, is simply not there); a known path with the wrong method
answers 405 naming the method it takes.

Requests are validated in the event loop (JSON, fields, sizes) and, if valid, queued. A single worker task
owns the model; everything it does with it runs in one model thread, so the event loop stays free:

- it takes the first waiting request and gathers more for up to `max_wait_ms` (only while other requests
  are on their way in, so an idle server adds no delay) or until `max_batch_size` inputs;
- it turns each new request into its windows (`Pipeline.features`) and counts their tokens; a request over
  `max_request_tokens` is refused with 413 before any model call;
- each model call (`Pipeline.forward`) holds at most `max_batch_tokens` tokens of windows of requests with the
  same task and parameters, taken from the requests that have had the fewest tokens run so far (a new request
  first), so a large request is split over several calls and the requests that arrive meanwhile get their
  own place in the next call instead of waiting behind it; between calls the worker takes in new requests;
- a request is decoded (`Pipeline.decode`) once all its windows have run, so its answer is the same as if it
  had run whole;
- a request whose client has gone, or whose `request_timeout_s` has passed (503), is dropped: its remaining
  windows never run (`bertforge_cancelled_total`).

The queue is bounded: when `max_queue` requests wait, new ones get 429 at once. A bad input never takes the
worker down: it fails only its own request (422 for invalid inputs), and a failed model call is retried
request by request. The server listens on loopback unless told otherwise.

Needs the `serve` extra: fastapi, uvicorn, fastapi-offline (the documentation assets); httpx for the tests
and the load benchmark.
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
from bertforge.inference.pipelines import DEFAULT_PRECISION, Pipeline, feature_tokens, load_pipelines

try:
    import fastapi_offline
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise ConfigError(f"serving needs the 'serve' extra ({missing.name} is not installed): "
                      "pip install 'bertforge[serve]'") from None

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Swagger UI and ReDoc scripts, styles and icon, from the fastapi-offline wheel: /docs needs no CDN.
DOCS_ASSETS = Path(fastapi_offline.__file__).parent / "static"
DOCS_ASSETS_URL = "/docs-assets"


@dataclass
class ServerSettings:
    """Limits and batching of the server.

    Attributes:
        max_batch_size: inputs gathered from the queue before a model call.
        max_wait_ms: how long an idle worker waits for more requests before running what it has.
        max_batch_tokens: tokens (window lengths, after tokenization and windowing) in one model call; a
            request with more is split over several calls, and other requests run in between.
        max_request_tokens: tokens one request may make after windowing (more: 413).
        max_queue: requests waiting for the worker; beyond it requests get 429 immediately.
        max_items: inputs per request (more: 413).
        max_chars: characters per text field (more: 413).
        max_body_bytes: request body size (more: 413).
        micro_batching: False runs every request alone (for comparison in benchmarks).
        request_timeout_s: a request not answered in this time gets 503 and its remaining work is dropped
            (0: no limit).
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_batch_tokens: int = 4096
    max_request_tokens: int = 524_288
    max_queue: int = 256
    max_items: int = 64
    max_chars: int = 100_000
    max_body_bytes: int = 8 * 1024 * 1024
    micro_batching: bool = True
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_batch_tokens", "max_request_tokens", "max_queue", "max_items",
                     "max_chars", "max_body_bytes"):
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


@dataclass(eq=False)  # a job is itself: compared and found by identity
class Job:
    """One request: its validated inputs, then (in the worker) its windows and their outputs so far."""

    task: str
    key: str  # task + canonical parameters: only jobs with equal keys share a model call
    parsed: list[Any]
    options: dict[str, Any]
    future: asyncio.Future
    arrival: float = 0.0
    features: list[Any] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # per feature
    todo: list[int] = field(default_factory=list)  # features not run yet, the order they will run in
    outputs: list[Any] = field(default_factory=list)  # per feature, None until run
    served: int = 0  # tokens run so far: the worker serves the least-served requests first
    error: BaseException | None = None  # why its windows could not be built

    @property
    def gone(self) -> bool:
        """Nobody waits for the answer any more (answered, failed, timed out or the client left)."""
        return self.future.done()

    def fail(self, status: int, message: str) -> None:
        if not self.future.done():
            self.future.set_exception(RequestError(status, message))


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
    batch_tokens: Histogram | None = None
    inputs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    model_calls: int = 0
    windows: int = 0
    cancelled: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    dropped_windows: int = 0

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
        lines += ["# HELP bertforge_batch_size Windows (model inputs) per model call.",
                  "# TYPE bertforge_batch_size histogram"]
        if self.batch_sizes is not None:
            lines += self.batch_sizes.lines("bertforge_batch_size")
        lines += ["# HELP bertforge_batch_tokens Tokens per model call (at most max_batch_tokens).",
                  "# TYPE bertforge_batch_tokens histogram"]
        if self.batch_tokens is not None:
            lines += self.batch_tokens.lines("bertforge_batch_tokens")
        lines += ["# HELP bertforge_inputs_total Inputs answered by task.", "# TYPE bertforge_inputs_total counter"]
        lines += [f'bertforge_inputs_total{{task="{t}"}} {n}' for t, n in sorted(self.inputs.items())]
        lines += ["# HELP bertforge_model_calls_total Model calls made by the worker.",
                  "# TYPE bertforge_model_calls_total counter", f"bertforge_model_calls_total {self.model_calls}",
                  "# HELP bertforge_windows_total Windows run by the model.",
                  "# TYPE bertforge_windows_total counter", f"bertforge_windows_total {self.windows}",
                  "# HELP bertforge_cancelled_total Requests given up before their answer (client gone, timeout).",
                  "# TYPE bertforge_cancelled_total counter"]
        lines += [f'bertforge_cancelled_total{{reason="{r}"}} {self.cancelled.get(r, 0)}'
                  for r in ("disconnect", "timeout")]
        lines += ["# HELP bertforge_dropped_windows_total Windows of given-up requests that were never run.",
                  "# TYPE bertforge_dropped_windows_total counter",
                  f"bertforge_dropped_windows_total {self.dropped_windows}",
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


@dataclass
class Step:
    """One model call: windows of jobs with the same task and parameters, at most `max_batch_tokens` tokens."""

    parts: list[tuple[Job, list[int]]]  # (job, its feature indices in this call)

    @property
    def features(self) -> list[Any]:
        return [job.features[i] for job, indices in self.parts for i in indices]

    @property
    def tokens(self) -> int:
        return sum(job.tokens[i] for job, indices in self.parts for i in indices)


class InferenceService:
    """The queue, the worker and the request handling behind the routes."""

    def __init__(self, pipelines: dict[str, Pipeline], settings: ServerSettings, model_name: str):
        self.pipelines = pipelines
        self.settings = settings
        self.model_name = model_name
        self.metrics = Metrics(
            batch_sizes=Histogram(tuple(2.0 ** i for i in range(int(math.log2(settings.max_batch_size)) + 4))),
            batch_tokens=Histogram(tuple(2.0 ** i for i in range(4, int(math.log2(settings.max_batch_tokens)) + 2))))
        self.queue: asyncio.Queue[Job] | None = None
        self.arrived: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None
        self.executor: ThreadPoolExecutor | None = None
        # Requests between arrival and answer; when every one of them is already in the batch being gathered,
        # nobody can join it, so the worker runs at once instead of waiting (no added latency when idle).
        self.active = 0
        # Requests whose windows are built and some still to run, in arrival order.
        self.running: list[Job] = []
        self.fresh_turn = False  # whether the last model call was for requests not started before it

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
        for job in self.running:
            job.fail(503, "the server is shutting down")
        if self.queue is not None:
            while not self.queue.empty():
                self.queue.get_nowait().fail(503, "the server is shutting down")
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
        loop = asyncio.get_running_loop()
        return Job(task, key, parsed, options, loop.create_future(), arrival=loop.time())

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
            return 200, {"outputs": await self.wait(job, request)}
        except RequestError as error:
            return error.status, {"error": error.message}

    async def wait(self, job: Job, request: Request) -> list[dict[str, Any]]:
        """The job's outputs; if its client leaves or the timeout passes first, the job is given up, so the
        worker runs none of its remaining windows."""
        gone = asyncio.ensure_future(client_gone(request))
        try:
            done, _ = await asyncio.wait({job.future, gone}, timeout=self.settings.request_timeout_s or None,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if job.future.done():
            return job.future.result()  # the outputs, or the RequestError the worker set
        job.future.cancel()
        reason = "disconnect" if gone in done else "timeout"
        self.metrics.cancelled[reason] += 1
        if reason == "disconnect":
            # Nobody reads the answer; 499 ("client closed request", as nginx logs it) keeps the metrics honest.
            raise RequestError(499, "the client closed the connection before the answer")
        raise RequestError(503, f"no answer within {self.settings.request_timeout_s:g} s (request_timeout_s); the "
                                "server is overloaded, its work on this request was dropped")

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

    def take_waiting(self) -> list[Job]:
        """Requests already waiting, up to `max_batch_size` inputs (one request without micro-batching), without
        waiting for more: a request in progress keeps the model busy."""
        jobs, count = [], 0
        limit = self.settings.max_batch_size if self.settings.micro_batching else 1
        while not self.queue.empty() and count < limit:
            job = self.queue.get_nowait()
            jobs.append(job)
            count += len(job.parsed) if self.settings.micro_batching else 1
        return jobs

    async def work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self.running:
                    fresh = self.take_waiting()
                else:
                    fresh = await self.gather(await self.queue.get())
                fresh = [job for job in fresh if not job.gone]
                if fresh:
                    await loop.run_in_executor(self.executor, self.prepare, fresh)
                    self.admit(fresh)
                self.drop_gone()
                if self.running:
                    await self.run_step(self.plan())
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the worker must survive anything; no request is left waiting on it
                log.exception("batch worker error")
                for job in self.running:
                    job.fail(500, f"internal error: {type(error).__name__}: {error}")
                self.running = []

    def prepare(self, jobs: list[Job]) -> None:
        """(Model thread.) Each job's windows and their token counts; an input the model cannot take fails
        only its own job (the error is kept on the job until `admit` reports it in the event loop)."""
        for job in jobs:
            pipeline = self.pipelines[job.task]
            try:
                job.features = pipeline.features(job.parsed)
            except Exception as error:  # reported per job by `admit`
                job.error = error
                continue
            job.tokens = [feature_tokens(feature) for feature in job.features]
            # Shortest windows first: one call's windows have similar lengths, so little padding.
            job.todo = sorted(range(len(job.features)), key=job.tokens.__getitem__)
            job.outputs = [None] * len(job.features)

    def admit(self, jobs: list[Job]) -> None:
        """Prepared jobs join the running ones, unless they failed or are over the token budget."""
        limit = self.settings.max_request_tokens
        for job in jobs:
            if job.error is not None:
                self.fail_job(job, job.error)
                continue
            if not job.features:
                job.fail(422, "the inputs make no window for the model")
                continue
            total = sum(job.tokens)
            if total > limit:
                job.fail(413, f"the inputs make {total} tokens after windowing ({len(job.features)} windows); this "
                              f"server runs at most {limit} per request (max_request_tokens; raise it with "
                              "`bertforge serve --max-request-tokens`), so split the request or send shorter texts")
                continue
            self.running.append(job)

    def fail_job(self, job: Job, error: BaseException) -> None:
        if isinstance(error, BertforgeError):  # an input the model cannot take (too long ...)
            job.fail(422, str(error))
        else:
            log.error("model call failed", exc_info=error)
            job.fail(500, f"internal error: {type(error).__name__}: {error}")

    def drop_gone(self) -> None:
        """Forget requests nobody waits for: their windows not run yet are never run."""
        kept = []
        for job in self.running:
            if job.gone:
                self.metrics.dropped_windows += len(job.todo)
            else:
                kept.append(job)
        self.running = kept

    def plan(self) -> Step:
        """The next model call. Requests not started yet get calls of their own, so one that arrives while a
        large request is in progress waits for at most that request's current call; a request in progress
        still gets at least every other call, so it is never starved. Within the call, requests with the
        fewest tokens run so far come first, each giving windows in its own order while they fit in
        `max_batch_tokens`; at least one window, so a window larger than the budget still runs (alone)."""
        fresh = [job for job in self.running if not job.served]
        started = [job for job in self.running if job.served]
        self.fresh_turn = bool(fresh) and (not started or not self.fresh_turn)
        order = sorted(fresh if self.fresh_turn else started, key=lambda job: (job.served, job.arrival))
        key, room, parts = order[0].key, self.settings.max_batch_tokens, []
        for job in order:
            if job.key != key:
                continue
            taken = []
            for index in job.todo:
                if job.tokens[index] > room and (taken or parts):
                    break
                taken.append(index)
                room -= job.tokens[index]
            if taken:
                parts.append((job, taken))
            if room <= 0 or not self.settings.micro_batching:
                break
        return Step(parts)

    async def run_step(self, step: Step) -> None:
        """Run one model call; decode each request whose windows have now all run."""
        loop = asyncio.get_running_loop()
        first = step.parts[0][0]
        pipeline = self.pipelines[first.task]
        try:
            outputs = await loop.run_in_executor(self.executor, pipeline.forward, step.features, first.options)
        except Exception as error:
            if len(step.parts) > 1:
                # Find the culprit: every other request still gets its answer.
                for part in step.parts:
                    await self.run_step(Step([part]))
                return
            job = step.parts[0][0]
            self.fail_job(job, error)
            self.running.remove(job)
            return
        self.metrics.model_calls += 1
        self.metrics.windows += len(outputs)
        self.metrics.batch_sizes.observe(len(outputs))
        self.metrics.batch_tokens.observe(step.tokens)
        position, finished = 0, []
        for job, indices in step.parts:
            for index in indices:
                job.outputs[index] = outputs[position]
                job.served += job.tokens[index]
                position += 1
            job.todo = job.todo[len(indices):]  # `plan` takes windows from the front
            if not job.todo:
                finished.append(job)
        if not finished:
            return
        self.running = [job for job in self.running if job not in finished]
        answers = await loop.run_in_executor(self.executor, self.decode, [job for job in finished if not job.gone])
        for job, answer in answers:
            if isinstance(answer, BaseException):
                self.fail_job(job, answer)
            elif not job.gone:
                self.metrics.inputs[job.task] += len(job.parsed)
                job.future.set_result(answer)

    def decode(self, jobs: list[Job]) -> list[tuple[Job, Any]]:
        """(Model thread.) Each job's results from all its windows' outputs, or the error decoding raised."""
        answers = []
        for job in jobs:
            try:
                answers.append((job, self.pipelines[job.task].decode(job.parsed, job.features, job.outputs,
                                                                     job.options)))
            except Exception as error:  # reported per job
                answers.append((job, error))
        return answers

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "tasks": list(self.pipelines),
                "queue_depth": self.queue.qsize() if self.queue is not None else 0,
                "running": len(self.running),
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
        await service.start()
        try:
            yield
        finally:
            await service.stop()

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
        depth = service.queue.qsize() if service.queue is not None else 0
        return PlainTextResponse(service.metrics.render(depth), media_type="text/plain; version=0.0.4")

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
