"""The request handling behind every HTTP route, for one served model and for the set of them.

`InferenceService` is one model: its pipelines (one per task it serves), its own `Scheduler` (queue,
micro-batching worker, token budgets; it also runs the model's attention maps, `inference.attention
.AttentionSteps`, so every model route shares one admission), its own `ServingMetrics`. It reads a request
body under the limits (`read_body`: size, JSON through the untrusted-JSON decoder), validates our own
``{"inputs", "parameters"}`` bodies (`validate`), hands parsed inputs to the scheduler (`run`) and maps its
failures to statuses (`FAILURE_STATUS`). The wire-format routes (`openai_routes`, `tei_routes`) build parsed
inputs their own way and call the same `run`: one path from input to answer, whatever the API.

`ModelSet` is the served models by name, the one compute lane their schedulers share (`inference.lane`: one
model's work runs at a time on the machine's cores, the turns shared between models by the tokens each of their
requests got, so a model serving one large request cannot take half of the machine from one serving many), and
the one rule of which model answers a request (`pick`): the
model named (OpenAI's `model` field, or the `/models/<name>/...` path prefix); with no name, the only model
that serves the route's task; with several candidates, a 400 listing their names (a silent default would
answer with the wrong model without anyone noticing).

Every refusal is a `RequestError` (status, message, OpenAI's `param`), turned into the body of the route's
API style by `refusal` through `envelopes.error_payload`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bertforge.data.files import UntrustedJson, decode_json
from bertforge.engine.build import DEFAULT_KIND
from bertforge.errors import BertforgeError, CheckpointError, ConfigError, InputError
from bertforge.inference.admission import CHARS_PER_TOKEN, estimate_tokens
from bertforge.inference.attention import ATTENTION_TASK, AttentionSteps
from bertforge.inference.jobs import check_seconds
from bertforge.inference.lane import ComputeLane
from bertforge.inference.pipelines import Pipeline, load_pipelines
from bertforge.inference.scheduler import Failure, JobFailed, Scheduler, SchedulerSettings, check_positive
from bertforge.inference.wire_inputs import (
    AUTO_TRUNCATE,
    CUT_TASKS,
    Fix,
    cut_inputs,
    family_results,
    plain_inputs,
    truncated_count,
)
from bertforge.runtime import DEFAULT_PRECISION
from bertforge.serving.answers import bound_answer, task_outputs
from bertforge.serving.envelopes import OVERLOADED, RequestError, error_payload, serve_extra_missing
from bertforge.serving.guards import (
    LARGE_BODY_BYTES,
    check_guard_settings,
    note_retry_after,
    note_timing,
    note_truncated,
)

try:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    from bertforge.serving.metrics import ServingMetrics
except ImportError as missing:  # the serve extra is optional; say how to get it when it is needed
    raise serve_extra_missing(missing) from None

# A model name as it may appear in a path (/models/<name>/...) and in OpenAI's `model` field.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass
class ServerSettings(SchedulerSettings):
    """Limits of the server: the scheduler's (`SchedulerSettings`: max_batch_size, max_wait_ms,
    max_batch_tokens, max_request_tokens, max_queue, micro_batching, request_timeout_s) and the sizes a
    request may have before it is read into the queue. Each served model has its own scheduler with these.

    Attributes:
        max_items: inputs per request (more: 422 on our routes, TEI's 413 on its routes, OpenAI's 400;
            TEI's `max_client_batch_size`, `--max-client-batch-size`). 2048 by default, as OpenAI's embeddings
            API: clients send that many at once (LangChain 1,000); the scheduler splits them into model calls
            of at most `max_batch_tokens`, so the limit is the work, not the count.
        max_chars: characters per text field (more: 413).
        max_body_bytes: request body size (more: 413, before it is read: `http_guards`).
        api_keys: bearer keys a request must hold one of (401 without); empty: no key needed.
        allowed_hosts: Host header names answered (421 for others; DNS rebinding); empty: any.
        cors_origins: origins a browser page may call the server from (CORS); empty: CORS off.
        refusal_cooldown_s: after a 413 to a large body, how long large bodies from that address get 429 before
            they are read (`http_guards`); 0: never.
        body_timeout_s: a request body must arrive whole within this many seconds of its headers (else 408).
        max_incomplete_bodies: requests whose bodies are being received at once; more get 503 at once.
        max_answer_bytes: the most bytes one answer may take, counted before any model call at the most each of
            its numbers takes (`answers.bound_answer`: vectors, token vectors, sparse vectors, attention maps);
            more: 413 naming it. 64 MiB: OpenAI's full batch of 2,048 vectors of 1,024 numbers fits (36 MB).
        max_sparse_terms: the terms a sparse vector keeps at most, its largest weights (0: every non-zero one,
            under `max_answer_bytes`); a request's own `max_terms` may ask for fewer, and more is 413.
        auto_truncate: an input longer than the model's window is cut to it on every embedding-like route
            (`wire_inputs`' rule; TEI's `--auto-truncate`, `/info` says it), the count of cut texts said in the
            answer; False refuses it naming the limit (`bertforge serve --auto-truncate false`). A TEI request's
            own `truncate` decides for that request.
    """

    max_items: int = 2048
    max_chars: int = 100_000
    max_body_bytes: int = 8 * 1024 * 1024
    api_keys: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    refusal_cooldown_s: float = 1.0
    body_timeout_s: float = 30.0
    max_incomplete_bodies: int = 128
    max_answer_bytes: int = 64 * 1024 * 1024
    max_sparse_terms: int = 256
    auto_truncate: bool = AUTO_TRUNCATE

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.auto_truncate, bool):
            raise ConfigError(f"auto_truncate must be true or false, got {self.auto_truncate!r}")
        check_positive(self, ("max_items", "max_chars", "max_body_bytes", "max_incomplete_bodies", "max_answer_bytes"))
        if isinstance(self.max_sparse_terms, bool) or not isinstance(self.max_sparse_terms, int) or self.max_sparse_terms < 0:
            raise ConfigError(f"server max_sparse_terms must be an integer >= 0 (0: no cap), got {self.max_sparse_terms!r}")
        check_seconds(self, ("refusal_cooldown_s", "body_timeout_s"))
        check_guard_settings(self)
        self.api_keys, self.allowed_hosts, self.cors_origins = (
            tuple(self.api_keys), tuple(self.allowed_hosts), tuple(self.cors_origins))


# The status of each way the scheduler gives up a request (a test holds it to `scheduler.FAILURES`).
FAILURE_STATUS: dict[Failure, int] = {
    "invalid": 422,  # an input the model cannot take (too long for fill-mask, no window ...)
    "too_large": 413,  # over max_request_tokens
    "busy": 429,  # max_queue requests already accepted and not answered (never the model's speed)
    "timeout": 503,  # request_timeout_s, when set, passed
    # Nobody reads the answer; 499 ("client closed request", as nginx logs it) keeps the metrics honest.
    "disconnect": 499,
    "shutdown": 503,
    "unhealthy": 503,  # the model gave non-finite outputs: /ready fails, every request is refused
    "internal": 500,
}


def refusal(request: Request, status: int, message: str, *, param: str | None = None,
            code: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The response refusing `request`, in the error envelope of its path's API style."""
    return JSONResponse(error_payload(request.url.path, status, message, param=param, code=code),
                        status_code=status, headers=dict(headers or {}))


def check_sizes(item: Any, index: int, max_chars: int) -> None:
    """413 for a text field longer than `max_chars` (checked before any tokenization)."""
    fields = item.items() if isinstance(item, Mapping) else enumerate(item) if isinstance(item, list) else [("", item)]
    for name, value in fields:
        if isinstance(value, str) and len(value) > max_chars:
            where = f"inputs[{index}]" + (f".{name}" if isinstance(name, str) and name else
                                          f"[{name}]" if name != "" else "")
            raise RequestError(413, f"{where} has {len(value)} characters; this server accepts at most "
                                    f"{max_chars} per text")



def decode_body(raw: bytes) -> Any:
    # whole_numbers: the OpenAPI document's "integer" fields take 5.0, as JSON Schema does.
    return decode_json(raw.decode("utf-8"), unique_keys=True, whole_numbers=True)


async def read_body(request: Request, settings: ServerSettings) -> Any:
    """The request's JSON body, read under `max_body_bytes` and through the untrusted-JSON decoder (nesting
    depth, number size, lone surrogates); RequestError (400/413) naming the problem."""
    limit = settings.max_body_bytes
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
        raise RequestError(400, "empty request body; send a JSON object")
    try:
        if len(raw) > LARGE_BODY_BYTES:  # megabytes take tens of milliseconds: not on the event loop
            return await asyncio.to_thread(decode_body, raw)
        return decode_body(raw)
    except UnicodeDecodeError as error:
        raise RequestError(400, f"request body is not UTF-8 ({error.reason} at byte {error.start})") from None
    except UntrustedJson as error:
        raise RequestError(400, f"request body refused: {error}") from None


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (what the client sent, in its words)."""
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array",
             dict: "object"}
    return names.get(type(value), type(value).__name__)


async def client_gone(request: Request) -> None:
    """Return once the client has closed its connection (the ASGI server says so through `receive`)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # the body was read already: anything else is not news; do not spin


class InferenceService:
    """One served model: its pipelines, scheduler and metrics, and the handling of a request to it."""

    def __init__(self, pipelines: dict[str, Pipeline], settings: ServerSettings, model_name: str,
                 directory: str | Path | None = None):
        self.pipelines = pipelines
        self.settings = settings
        self.model_name = model_name
        self.directory = str(directory) if directory is not None else model_name
        self.metrics = ServingMetrics(settings.max_batch_size, settings.max_batch_tokens,
                                      queue_depth=lambda: self.scheduler.queue_depth)
        # Every model route through one scheduler: the tasks' pipelines, and the encoder's attention maps.
        steps = {**pipelines, ATTENTION_TASK: AttentionSteps(next(iter(pipelines.values())))} if pipelines else {}
        self.scheduler = Scheduler(steps, settings, events=self.metrics)

    def validate(self, task: str, body: Any) -> tuple[list[Any], dict[str, Any]]:
        """The parsed inputs and checked options of one of our ``{"inputs", "parameters"}`` bodies;
        RequestError (4xx) naming the first problem."""
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
        self.check_count(len(inputs))
        parameters = body.get("parameters", {})
        if not isinstance(parameters, dict):  # null, [] and false too: a client that sends them meant something
            raise RequestError(422, f"'parameters' must be an object, got {json_type(parameters)}",
                               param="parameters")
        options = self.check_options(task, parameters)
        parsed = []
        for index, item in enumerate(inputs):
            check_sizes(item, index, self.settings.max_chars)
            parsed.append(self.parse(task, item, f"inputs[{index}]"))
        # Then the route's strict model: unknown fields inside an input, parameters of the wrong JSON type.
        from bertforge.serving.task_schemas import check_task_body

        check_task_body(task, body)
        return parsed, options

    def check_count(self, count: int, field: str = "inputs", status: int = 422) -> None:
        """Refuse more inputs than `max_items`, naming the limit. 422 on our routes (an input the server cannot
        take as sent); the wire routes pass their API's documented status (TEI: 413, OpenAI: 400)."""
        if count > self.settings.max_items:
            raise RequestError(status, f"{count} inputs in one request; this server accepts at most "
                                       f"{self.settings.max_items} (max_items: split the request)", param=field)

    def truncation(self, requested: bool | None = None, field: str | None = None) -> tuple[bool, Fix]:
        """(whether an over-long input of a request is cut, the fix a refusal names): the request's own
        `field` (TEI's `truncate`) where its dialect has one and it was sent, else the server's `auto_truncate`."""
        ask = f"send {field}: true to cut it to the window" if field else None
        if requested is not None:
            return requested, Fix(f"shorten it, or {ask}")
        server = "this server refuses over-long inputs (bertforge serve --auto-truncate false)"
        return self.settings.auto_truncate, Fix(f"{server}: shorten it" + (f", or {ask}" if ask else ""))

    def check_options(self, task: str, parameters: Mapping[str, Any], field: str = "parameters") -> dict[str, Any]:
        try:
            return self.pipelines[task].check_options(parameters)
        except InputError as error:
            raise RequestError(422, f"{field}: {error}", param=field) from None

    def parse(self, task: str, item: Any, where: str) -> Any:
        try:
            return self.pipelines[task].parse(item)
        except InputError as error:
            raise RequestError(422, f"{where}: {error}", param=where.split("[")[0]) from None

    async def run(self, task: str, parsed: list[Any], options: dict[str, Any], request: Request, *,
                  answered: bool = True) -> list[Any]:
        """The pipeline's results for inputs already parsed and options already checked, through this model's
        scheduler; RequestError with the status of a failure (`FAILURE_STATUS`), or 413 for an answer over its
        bound (`answers.bound_answer`), before any model call. `answered` False: the results are not the answer
        (`/search`'s query vectors), so they are neither bounded nor pruned as an answer would be."""
        settings = self.settings
        limit = None
        if answered:
            options, limit = bound_answer(self.scheduler.pipelines[task], options, len(parsed),
                                          max_answer_bytes=settings.max_answer_bytes,
                                          max_sparse_terms=settings.max_sparse_terms)
        try:
            floor = None
            if estimate_tokens(parsed) * CHARS_PER_TOKEN > self.settings.max_request_tokens:
                # Possibly over the token budget: its words are counted off the event loop.
                floor = await asyncio.to_thread(self.scheduler.token_floor, task, parsed)
            job = self.scheduler.submit(task, parsed, options, floor=floor, limit=limit)
            results = await self.scheduler.result(job, gone=client_gone(request))
        except JobFailed as error:
            retry = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else None
            raise RequestError(FAILURE_STATUS[error.kind], error.message, headers=retry,
                               code=OVERLOADED if error.kind == "shutdown" else None) from None
        note_timing(request.scope, job.timing.queue_s, job.timing.tokenization_s, job.timing.inference_s)
        if len(plain_inputs(parsed)) < len(parsed):  # inputs cut or refused by the rule: the answer says how many
            note_truncated(request.scope, truncated_count(results))
        return results

    async def handle(self, task: str, request: Request, body: Any = None) -> tuple[int, dict[str, Any]]:
        """(status, bertforge-style payload) for one of our `/v1/<task>` requests (`body`: already read); the
        payload's vectors are marked for `answers.respond`, which writes it."""
        # From its first byte the request counts as on its way in: the worker may wait for it to join a batch.
        with self.scheduler.incoming():
            try:
                if body is None:
                    body = await read_body(request, self.settings)
                parsed, options = self.validate(task, body)
                parsed = cut_inputs(task, parsed, *self.truncation())
                results = await self.run(task, parsed, options, request)
                usage = {"usage": {"truncated_inputs": truncated_count(results)}} if task in CUT_TASKS else {}
                outputs = task_outputs(getattr(self.pipelines[task], "family", None), family_results(results, parsed))
                return 200, {"outputs": outputs, **usage}
            except RequestError as error:
                note_retry_after(request.scope, error.headers)
                return error.status, error_payload(request.url.path, error.status, error.message)

    async def warm_up(self) -> None:
        """One request of each task (its documented example) through the scheduler (`Scheduler.warm_up`)."""
        requests = {}
        for task, pipeline in self.pipelines.items():
            example = pipeline.example
            try:
                requests[task] = ([pipeline.parse(item) for item in example["inputs"]],
                                  pipeline.check_options(example["parameters"]))
            except InputError:  # an example this model cannot take: warm up with the others
                continue
        await self.scheduler.warm_up(requests)

    def readiness(self) -> dict[str, Any]:
        scheduler = self.scheduler
        return {"ready": scheduler.ready, "warmed": scheduler.warmed, "unhealthy": scheduler.unhealthy,
                "draining": scheduler.draining}

    def health(self, directory: bool = False) -> dict[str, Any]:
        """The model's state for /health: name, tasks, readiness, queue, the engine its pipelines share (kind,
        device, precision, threads, why), pipelines and settings (how many keys, never the keys); with
        `directory`, where it was loaded from (for a key holder only)."""
        first = next(iter(self.pipelines.values()), None)
        report = {"status": "ok", "ready": self.scheduler.ready, "model": self.model_name,
                  "tasks": list(self.pipelines), "queue_depth": self.scheduler.queue_depth,
                  "running": len(self.scheduler.running),
                  "engine": first.engine.describe() if first is not None else None,
                  "pipelines": {task: p.describe() for task, p in self.pipelines.items()},
                  # The keys themselves never leave the server: only how many there are.
                  "settings": {**asdict(self.settings), "api_keys": len(self.settings.api_keys)}}
        if directory:
            report["directory"] = self.directory
        return report


class ModelSet:
    """The served models by name (in the order given), and which one answers a request (`pick`)."""

    def __init__(self, services: Mapping[str, InferenceService]):
        if not services:
            raise ConfigError("no model to serve; give at least one --model NAME=DIR")
        self.services = dict(services)
        self.warming: list[asyncio.Task] = []  # the warm-up of each model (`start`)
        # One turnstile of the cores for every model's scheduler (each takes its place there as it starts).
        self.lane = ComputeLane()
        for service in self.services.values():
            service.scheduler.lane = self.lane

    @property
    def names(self) -> list[str]:
        return list(self.services)

    @property
    def first(self) -> InferenceService:
        return next(iter(self.services.values()))

    def tasks(self) -> list[str]:
        """Every task some model serves, in first-seen order."""
        return list(dict.fromkeys(task for s in self.services.values() for task in s.pipelines))

    def serving(self, task: str) -> list[str]:
        return [name for name, s in self.services.items() if task in s.pipelines]

    def pick(self, name: str | None, task: str, *, field: str = "model", lenient: bool = False) -> InferenceService:
        """The model that answers a request for `task`.

        Args:
            name: the model the request names (OpenAI's `model`, the path's `/models/<name>`), or None.
            task: the pipeline the route runs; the model must serve it.
            field: how the request named the model (for messages and OpenAI's `param`).
            lenient: with a single model served, an unknown name still picks it (OpenAI clients send a name
                of their own, e.g. a hard-coded "text-embedding-3-small", as text-embeddings-inference allows).
        """
        if name is not None and name not in self.services:
            if lenient and len(self.services) == 1:
                name = None
            else:
                raise RequestError(404, f"model {name!r} is not served here; served models: {self.names}",
                                   param=field, code="model_not_found")
        if name is not None:
            service = self.services[name]
            if task not in service.pipelines:
                raise RequestError(404 if field == "path" else 400,
                                   f"model {name!r} does not serve {task}; it serves {list(service.pipelines)}"
                                   f" (models serving {task}: {self.serving(task)})", param=field)
            return service
        candidates = self.serving(task)
        if len(candidates) > 1:
            # Every model's encoder serves embed: unnamed, it is the model that serves nothing else's to answer.
            candidates = [n for n in candidates if list(self.services[n].pipelines) == [task]] or candidates
        if len(candidates) == 1:
            return self.services[candidates[0]]
        if not candidates:
            raise RequestError(404, f"no served model serves {task}; served models: {self.names}", param=field)
        raise RequestError(400, f"several served models serve {task} ({candidates}); name one with "
                                f"{'the model field' if field == 'model' else '/models/<name>/...'}",
                           param=field)

    def named(self, name: str | None, field: str = "path") -> InferenceService:
        """The model of a request that runs no task (TEI's /info, /tokenize, /decode): the one named, else the
        only one served."""
        if name is None:
            if len(self.services) == 1:
                return self.first
            raise RequestError(400, f"several models are served ({self.names}); name one with /models/<name>/...",
                               param=field)
        if name not in self.services:
            raise RequestError(404, f"model {name!r} is not served here; served models: {self.names}",
                               param=field, code="model_not_found")
        return self.services[name]

    async def start(self) -> None:
        """Start every model's scheduler, and warm each up in the background (`/ready` waits for it; `/health`,
        liveness, does not)."""
        for service in self.services.values():
            await service.scheduler.start()
        self.warming = [asyncio.create_task(service.warm_up()) for service in self.services.values()]

    async def stop(self) -> None:
        """Drain every model's scheduler (accepted requests finish, new ones get 503; `drain_timeout_s`)."""
        for task in self.warming:
            task.cancel()
        for service in self.services.values():
            await service.scheduler.drain()

    def readiness(self) -> dict[str, dict[str, Any]]:
        """Per model: whether it takes requests, and why not (`Scheduler.ready`)."""
        return {name: service.readiness() for name, service in self.services.items()}


def model_name_of(directory: str | Path) -> str:
    """The name a model directory is served under when none is given: its folder name."""
    name = Path(directory).resolve().name or "model"
    return name if MODEL_NAME.fullmatch(name) else re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64].lstrip("._-") or "model"


def parse_model_option(value: str) -> tuple[str, str]:
    """`--model NAME=DIR` as (name, directory); a plain `DIR` is named after its folder."""
    name, sep, directory = value.partition("=")
    if not sep or (not MODEL_NAME.fullmatch(name) and Path(value).is_dir()):  # a directory with '=' in its path
        return model_name_of(value), value
    if not MODEL_NAME.fullmatch(name):
        raise ConfigError(f"--model {value}: the name {name!r} must be letters, digits, '.', '_' or '-' "
                          "(at most 64, starting with a letter or digit), e.g. --model embedder=models/minilm")
    if not directory:
        raise ConfigError(f"--model {value}: no directory after '='; use --model NAME=DIR")
    return name, directory


def load_model_set(models: Mapping[str, str | Path], settings: ServerSettings, *, tasks: list[str] | None = None,
                   device: str = "auto", precision: str = DEFAULT_PRECISION, engine: str = DEFAULT_KIND,
                   threads: int | None = None, batch_size: int = 32, max_length: int | None = None,
                   rerank_labels: Mapping[str, str] | None = None) -> ModelSet:
    """Load every named model directory (each its own pipelines, scheduler and metrics). A directory that
    cannot be served fails the start with one line naming the model and its directory. `rerank_labels`: model
    name -> the label whose probability makes it a reranker too (`load_pipelines(rerank_label=...)`)."""
    rerank_labels = dict(rerank_labels or {})
    unknown = sorted(set(rerank_labels) - set(models))
    if unknown:
        raise ConfigError(f"--rerank-label names model(s) {unknown} that are not served; served: {list(models)} "
                          "(use --rerank-label NAME=LABEL with a name given to --model)")
    services = {}
    for name, directory in models.items():
        if not MODEL_NAME.fullmatch(name):
            raise ConfigError(f"model name {name!r} must be letters, digits, '.', '_' or '-' (at most 64)")
        try:
            pipelines = load_pipelines(directory, tasks, device=device, precision=precision, engine=engine,
                                       threads=threads, batch_size=batch_size, max_length=max_length,
                                       rerank_label=rerank_labels.get(name))
        except (BertforgeError, OSError) as error:
            reason = str(error).replace(str(directory) + ": ", "")
            # The kind of error stays (a corrupt checkpoint is a CheckpointError); the message names the model.
            kind = type(error) if isinstance(error, CheckpointError | ConfigError | InputError) else ConfigError
            raise kind(f"model {name} ({directory}) cannot be served: {reason}") from None
        services[name] = InferenceService(pipelines, settings, name, directory)
    return ModelSet(services)
