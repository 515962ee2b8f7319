"""The serving scheduler: a bounded queue of requests and the one worker that runs their windows on the model.

It owns how the work of many requests is shared out over model calls, and nothing about HTTP: no web
framework is imported here (the server maps its failures to status codes and its events to metrics), so it
can be run and tested with only the core install. One turn of the worker (`Scheduler.step`):

- take in new requests: when idle, the first waiting request plus whatever arrives within `max_wait_ms`
  (only while other requests are on their way in, see `Scheduler.incoming`, so an idle server adds no
  delay) up to `max_batch_size` inputs; while a request is in progress, only those already waiting;
- build each new request's windows (`Pipeline.features`) and count their tokens; a request over
  `max_request_tokens` is refused before any model call;
- forget requests nobody waits for any more (client gone, timed out): their windows not run yet never run;
- plan and run one model call (`Pipeline.forward`) of at most `max_batch_tokens` tokens of windows of
  requests with the same task and parameters, least-served first, so a large request is split over several
  calls and a request that arrives meanwhile gets a call of its own before the large one's next piece;
- decode (`Pipeline.decode`) each request whose windows have all run, so its answer is the same as if it
  had run whole.

Everything done with the model runs in one model thread, so the model is never used concurrently and the
event loop stays free. A bad input fails only its own request, and a failed model call is retried request
by request, so the worker never stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from bertforge.errors import BertforgeError, ConfigError
from bertforge.inference.pipelines import feature_tokens

log = logging.getLogger(__name__)

T = TypeVar("T")

# Why a request got no answer; the server maps each to an HTTP status.
Failure = Literal["invalid", "too_large", "busy", "timeout", "disconnect", "shutdown", "internal"]
FAILURES: tuple[Failure, ...] = ("invalid", "too_large", "busy", "timeout", "disconnect", "shutdown", "internal")
# Reasons a request is given up by its waiter (the labels of the server's cancelled counter).
CANCEL_REASONS: tuple[Failure, ...] = ("disconnect", "timeout")


class ModelSteps(Protocol):
    """What the scheduler needs of a pipeline: its three steps (see `inference.pipelines.Pipeline`)."""

    def features(self, parsed: Sequence[Any]) -> list[Any]: ...

    def forward(self, features: Sequence[Any], options: dict[str, Any]) -> list[Any]: ...

    def decode(self, parsed: Sequence[Any], features: Sequence[Any], outputs: Sequence[Any],
               options: dict[str, Any]) -> list[Any]: ...


@dataclass
class SchedulerSettings:
    """Queue, batching and budgets of the scheduler.

    Attributes:
        max_batch_size: inputs gathered from the queue before a model call.
        max_wait_ms: how long an idle worker waits for more requests before running what it has.
        max_batch_tokens: tokens (window lengths, after tokenization and windowing) in one model call; a
            request with more is split over several calls, and other requests run in between.
        max_request_tokens: tokens one request may make after windowing (more: refused, "too_large").
        max_queue: requests waiting for the worker; beyond it requests are refused at once ("busy").
        micro_batching: False runs every request alone (for comparison in benchmarks).
        request_timeout_s: a request not answered in this time fails ("timeout") and its remaining work is
            dropped (0: no limit).
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_batch_tokens: int = 4096
    max_request_tokens: int = 524_288
    max_queue: int = 256
    micro_batching: bool = True
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        check_positive(self, ("max_batch_size", "max_batch_tokens", "max_request_tokens", "max_queue"))
        for name in ("max_wait_ms", "request_timeout_s"):
            if not float(getattr(self, name)) >= 0:
                raise ConfigError(f"server {name} must be >= 0, got {getattr(self, name)!r}")


def check_positive(settings: object, names: Sequence[str]) -> None:
    """ConfigError naming the first of `names` on `settings` that is not a positive integer."""
    for name in names:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"server {name} must be a positive integer, got {value!r}")


class JobFailed(Exception):
    """Why a request got no answer: a `Failure` kind (the server's status code) and a message for the client."""

    def __init__(self, kind: Failure, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


class SchedulerEvents:
    """What the scheduler reports as it works (the server counts these as metrics); by default nothing.

    Called from the event loop thread only.
    """

    def model_call(self, windows: int, tokens: int) -> None:
        """One model call ran `windows` windows of `tokens` tokens in all."""

    def answered(self, task: str, inputs: int) -> None:
        """A request of `inputs` inputs got its answer."""

    def cancelled(self, reason: Failure) -> None:
        """A request was given up by its waiter (`CANCEL_REASONS`)."""

    def dropped(self, windows: int) -> None:
        """`windows` windows of given-up requests will never run."""


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

    def fail(self, kind: Failure, message: str) -> None:
        if not self.future.done():
            self.future.set_exception(JobFailed(kind, message))


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


class Scheduler:
    """The queue, the worker and the model thread for already-loaded pipelines (one per task)."""

    def __init__(self, pipelines: Mapping[str, ModelSteps], settings: SchedulerSettings | None = None,
                 events: SchedulerEvents | None = None):
        self.pipelines = pipelines
        self.settings = settings or SchedulerSettings()
        self.events = events or SchedulerEvents()
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
    async def start(self, *, run_worker: bool = True) -> None:
        """Open the queue and the model thread, and start the worker (`run_worker=False`: the caller drives
        `step` itself, as the tests do)."""
        # Made here, not in __init__: they belong to the event loop that serves, which may not exist yet.
        self.queue = asyncio.Queue(maxsize=self.settings.max_queue)
        self.arrived = asyncio.Event()
        # One thread runs every model call: the model is never used concurrently, and the event loop stays free.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model")
        if run_worker:
            self.worker = asyncio.create_task(self.work(), name="bertforge-batcher")

    async def stop(self) -> None:
        """Stop the worker; every request still waiting or running fails ("shutdown")."""
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.worker
            self.worker = None
        for job in self.running:
            job.fail("shutdown", "the server is shutting down")
        self.running = []
        if self.queue is not None:
            while not self.queue.empty():
                self.queue.get_nowait().fail("shutdown", "the server is shutting down")
        if self.executor is not None:
            self.executor.shutdown(wait=True)
            self.executor = None

    @property
    def queue_depth(self) -> int:
        """Requests waiting for the worker."""
        return self.queue.qsize() if self.queue is not None else 0

    # --- the side of the requests ------------------------------------------------------------------------
    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Hold while a request is on its way in and until it is answered: the worker waits (up to
        `max_wait_ms`) for such requests to join the batch it gathers, and for nobody else."""
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1

    def submit(self, task: str, parsed: list[Any], options: dict[str, Any]) -> Job:
        """Queue a request of inputs already validated by the task's pipeline (`parse`, `check_options`).

        Raises:
            JobFailed: "busy" when `max_queue` requests are already waiting.
        """
        loop = asyncio.get_running_loop()
        key = task + json.dumps(options, sort_keys=True)
        job = Job(task, key, parsed, options, loop.create_future(), arrival=loop.time())
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            raise JobFailed("busy", f"server busy: {self.settings.max_queue} requests are already waiting; "
                                    "retry shortly") from None
        self.arrived.set()
        return job

    async def result(self, job: Job, gone: Awaitable[Any] | None = None) -> Any:
        """The job's answer (one result per input). If `gone` (something that completes when the client
        leaves) or the timeout comes first, the job is given up, so the worker runs none of its remaining
        windows.

        Raises:
            JobFailed: the job failed in the worker, or was given up ("disconnect", "timeout").
        """
        watch = asyncio.ensure_future(gone) if gone is not None else None
        try:
            done, _ = await asyncio.wait({job.future} | ({watch} if watch else set()),
                                         timeout=self.settings.request_timeout_s or None,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if watch is not None:
                watch.cancel()
        if job.future.done():
            return job.future.result()  # the answer, or the JobFailed the worker set
        job.future.cancel()
        reason: Failure = "disconnect" if watch is not None and watch in done else "timeout"
        self.events.cancelled(reason)
        if reason == "disconnect":
            raise JobFailed(reason, "the client closed the connection before the answer")
        raise JobFailed(reason, f"no answer within {self.settings.request_timeout_s:g} s (request_timeout_s); "
                                "the server is overloaded, its work on this request was dropped")

    # --- the worker ----------------------------------------------------------------------------------------
    async def work(self) -> None:
        """Turn after turn until cancelled; an error fails the requests in progress, never the worker."""
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the worker must survive anything; no request is left waiting on it
                log.exception("batch worker error")
                for job in self.running:
                    job.fail("internal", f"internal error: {type(error).__name__}: {error}")
                self.running = []

    async def step(self) -> None:
        """One turn: take in new requests (waiting for the first when there is nothing to do), build their
        windows, forget the given-up ones, run one model call."""
        if self.running:
            fresh = self.take_waiting()
        else:
            fresh = await self.gather(await self.queue.get())
        fresh = [job for job in fresh if not job.gone]
        if fresh:
            await self.in_model_thread(self.prepare, fresh)
            self.admit(fresh)
        self.drop_gone()
        if self.running:
            await self.run_step(self.plan())

    async def in_model_thread(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

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
                job.fail("invalid", "the inputs make no window for the model")
                continue
            total = sum(job.tokens)
            if total > limit:
                job.fail("too_large", f"the inputs make {total} tokens after windowing ({len(job.features)} "
                                      f"windows); this server runs at most {limit} per request (max_request_tokens;"
                                      " raise it with `bertforge serve --max-request-tokens`), so split the "
                                      "request or send shorter texts")
                continue
            self.running.append(job)

    def fail_job(self, job: Job, error: BaseException) -> None:
        if isinstance(error, BertforgeError):  # an input the model cannot take (too long ...)
            job.fail("invalid", str(error))
        else:
            log.error("model call failed", exc_info=error)
            job.fail("internal", f"internal error: {type(error).__name__}: {error}")

    def drop_gone(self) -> None:
        """Forget requests nobody waits for: their windows not run yet are never run."""
        kept = []
        for job in self.running:
            if job.gone:
                self.events.dropped(len(job.todo))
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
        first = step.parts[0][0]
        pipeline = self.pipelines[first.task]
        try:
            outputs = await self.in_model_thread(pipeline.forward, step.features, first.options)
        except Exception as error:
            if len(step.parts) > 1:
                # Find the culprit: every other request still gets its answer.
                for part in step.parts:
                    await self.run_step(Step([part]))
                return
            self.fail_job(first, error)
            self.running.remove(first)
            return
        self.events.model_call(len(outputs), step.tokens)
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
        answers = await self.in_model_thread(self.decode, [job for job in finished if not job.gone])
        for job, answer in answers:
            if isinstance(answer, BaseException):
                self.fail_job(job, answer)
            elif not job.gone:
                self.events.answered(job.task, len(job.parsed))
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
