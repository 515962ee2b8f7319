"""The serving scheduler: a bounded queue of requests and the one worker that runs their windows on the model.

It owns how the work of many requests is shared out over model calls, and nothing about HTTP: no web
framework is imported here (the server maps its failures to status codes and its events to metrics), so it
can be run and tested with only the core install. One turn of the worker (`Scheduler.step`):

- take in new requests: when idle, the first waiting request plus whatever arrives within `max_wait_ms`
  (only while other requests are on their way in, see `Scheduler.incoming`, so an idle server adds no
  delay) up to `max_batch_size` inputs; while a request is in progress, only those already waiting;
- build each new request's windows (`Pipeline.features`) and count their tokens; a request over
  `max_request_tokens` is refused before any model call (one whose words alone are over it is refused earlier
  still, in `submit`, before it costs the model thread anything: `inference.admission.token_floor`);
- forget requests nobody waits for any more (client gone, timed out): their windows not run yet never run;
- plan and run one model call (`Pipeline.forward`) of at most `max_batch_tokens` tokens of windows of
  requests with the same task and parameters (`plan`, `inference.sharing`): the model's tokens shared equally
  between the requests in progress, so a large request is split over several calls, and while short requests
  wait it gets a window only as often as its equal share allows: one client's huge requests (however many
  windows, all of the longest length) cannot fill the calls everyone else waits for;
- decode (`Pipeline.decode`) each request whose windows have all run, so its answer is the same as if it
  had run whole.

When model calls have run and no request arrives for `release_memory_after_s`, the worker hands the heap
memory they freed back to the operating system (`runtime.release_freed_memory`, in the model thread), once
per busy spell: a CPU server's resident memory otherwise stays at its busiest moment.

Everything done with the model runs in one model thread, so the model is never used concurrently and the
event loop stays free. Each step that uses the model thread takes a turn of the server's compute lane
(`inference.lane`, one for all the served models: `lane`), so two served models never run at once on the same
cores, and the turns go between models by the tokens each of their requests got; the budget of each call counts
the other models' requests too (`plan`), so a model's large request runs a slice per turn while another model
has requests in progress. A bad input fails only its own request, and a failed model call is retried request
by request, so the worker never stops. A model call whose outputs are not finite (NaN or infinity: corrupt
weights, an overflow) marks the model unhealthy: its requests and every later one fail ("unhealthy", 503)
and readiness (`Scheduler.ready`) is false until the server is restarted.

Admission (`submit`) is deterministic: a request within the static limits (the server's inputs, characters
and body bytes; `max_request_tokens` here) is accepted and answered, however fast or slow the model runs now;
the one refusal that depends on the load is a full queue: `max_queue` requests accepted and not answered yet
(waiting or in progress: text-embeddings-inference's `max_concurrent_requests`) refuse the next one at once
("busy", 429), with a Retry-After from the work ahead in the queue, counted in tokens (`retry_after_s`; the
recent speed only turns those tokens into seconds). A request is given up when its client leaves (`result`:
its windows not run yet never run) or, if `request_timeout_s` is set, when that passes ("timeout", 503).
`drain` (at shutdown) refuses new requests and lets accepted ones finish.

A share belongs to a request, not to a client: the scheduler cannot tell clients apart reliably (behind a
proxy, or on one host, every client has the same address; API keys are optional and often one per
application, shared by all its users), and a client that sends many requests at once meets the queue's
limit (`max_queue`) as everyone does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from bertforge.errors import BertforgeError
from bertforge.inference.admission import Throughput, estimate_tokens, token_floor
from bertforge.inference.family_pipelines import feature_tokens

# The scheduler's vocabulary lives in `inference.jobs`; these names are imported from here as well.
from bertforge.inference.jobs import (
    CANCEL_REASONS,
    FAILURES,
    Failure,
    Job,
    JobFailed,
    JobTiming,
    ModelSteps,
    SchedulerEvents,
    SchedulerSettings,
    Step,
    all_finite,
    check_positive,
    retry_after,
)
from bertforge.inference.lane import ComputeLane, Seat, Turn
from bertforge.inference.sharing import plan_call
from bertforge.inference.wire_inputs import plain_inputs
from bertforge.runtime import release_freed_memory

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["CANCEL_REASONS", "FAILURES", "Failure", "Job", "JobFailed", "JobTiming", "ModelSteps", "Scheduler",
           "SchedulerEvents", "SchedulerSettings", "Step", "all_finite", "check_positive", "retry_after"]

class Scheduler:
    """The queue, the worker and the model thread for already-loaded pipelines (one per task)."""

    def __init__(self, pipelines: Mapping[str, ModelSteps], settings: SchedulerSettings | None = None,
                 events: SchedulerEvents | None = None, now: Callable[[], float] | None = None,
                 lane: ComputeLane | None = None):
        self.pipelines = pipelines
        # The clock of arrivals and queue times (default: the event loop's).
        self.now = now or (lambda: asyncio.get_running_loop().time())
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
        # The tokens each request in progress would have run so far had every model call been split equally
        # between them (`plan`); back to 0 whenever nothing is in progress.
        self.clock = 0.0
        self.throughput = Throughput()  # the recent speed: only for the Retry-After of a full queue
        # Requests accepted, in arrival order; those not answered yet (waiting or in progress, `in_flight`) are
        # what `max_queue` bounds. One whose future is done (answered, failed, given up) is dropped from it.
        self.accepted: dict[Job, None] = {}
        self.unhealthy: str | None = None  # why the model cannot be trusted any more (non-finite outputs)
        self.warmed = False  # one request of each task has run (`warm_up`)
        self.draining = False  # shutting down: new requests are refused, accepted ones finish
        self.memory_to_release = False  # model calls ran since freed memory last went back (`next_request`)
        # The turnstile of the machine's cores, shared with the server's other models (one of its own by default:
        # set another before `start`); its place there is taken at `start`.
        self.lane = lane or ComputeLane()
        self.seat: Seat | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self, *, run_worker: bool = True) -> None:
        """Open the queue and the model thread, and start the worker (`run_worker=False`: the caller drives
        `step` itself, as the tests do)."""
        # Made here, not in __init__: they belong to the event loop that serves, which may not exist yet.
        self.queue = asyncio.Queue()  # bounded by `max_queue` accepted requests (`submit`)
        self.arrived = asyncio.Event()
        # One thread runs every model call: the model is never used concurrently, and the event loop stays free.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model")
        self.seat = self.lane.seat(self.demand)
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
        if self.seat is not None:
            self.lane.leave(self.seat)
            self.seat = None

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Refuse new requests ("shutdown") and wait, at most `timeout_s` (default `drain_timeout_s`), until
        every accepted request is answered; then `stop`. Returns whether all of them finished in time."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.settings.drain_timeout_s if timeout_s is None else timeout_s)
        while (self.active or self.running or self.queue_depth) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        finished = not (self.active or self.running or self.queue_depth)
        if not finished:
            log.warning("shutdown: %d requests still in progress after %.1f s fail", self.active,
                        self.settings.drain_timeout_s if timeout_s is None else timeout_s)
        await self.stop()
        return finished

    async def warm_up(self, requests: Mapping[str, tuple[list[Any], dict[str, Any]]]) -> None:
        """Run one request (parsed inputs, checked options) of each task through the worker, so the first
        client does not pay for the first call, and a model that answers NaN is found before any client
        asks (`unhealthy`). Sets `warmed` when they all succeed; a failure is logged, never raised."""
        for task, (parsed, options) in requests.items():
            try:
                with self.incoming():
                    await self.result(self.submit(task, parsed, options, silent=True), timed=False)
            except JobFailed as error:
                log.error("warm-up request of %s failed: %s", task, error.message)
                return
        self.warmed = True

    @property
    def ready(self) -> bool:
        """Whether the model takes requests: warmed up, healthy and not shutting down."""
        return self.warmed and self.unhealthy is None and not self.draining and self.worker is not None

    @property
    def queue_depth(self) -> int:
        """Requests waiting for the worker."""
        return self.queue.qsize() if self.queue is not None else 0

    def demand(self) -> int:
        """Requests that want a share of the machine now (the lane counts them for the other models): those in
        progress, waiting, or on their way in."""
        return max(len(self.running) + self.queue_depth, self.active)

    def backlogged(self) -> bool:
        """Whether the model has work: requests in progress or waiting (else its next turn starts afresh)."""
        return bool(self.running) or self.queue_depth > 0

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[Turn]:
        """One turn of the compute lane (`inference.lane`) for a step that uses the model thread."""
        async with self.seat.turn(self.backlogged) as turn:
            yield turn

    @property
    def in_flight(self) -> int:
        """Requests accepted and not answered yet (waiting or in progress): what `max_queue` bounds."""
        self.accepted = {job: None for job in self.accepted if not job.gone}  # (a future's callbacks run later)
        return len(self.accepted)

    def retry_after_s(self) -> float | None:
        """Seconds until the queue has room again, estimated from the work ahead in it counted in tokens: the
        requests accepted share the model equally (`plan`), so the first to finish is the one with the least
        work left, after about that much work of each of them; the recent speed turns those tokens into
        seconds (None before any model call was timed)."""
        return self.throughput.seconds_for(self.tokens_until_room())

    def tokens_until_room(self) -> int:
        """Tokens the model runs, at equal shares, before the first request accepted is answered."""
        left = [job.left for job in self.accepted if not job.gone]
        return min(left) * len(left) if left else 0

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

    def token_floor(self, task: str, parsed: list[Any]) -> int:
        """A lower bound of the tokens of `parsed` after windowing (`admission.token_floor`), counted at most
        to just past `max_request_tokens`. Pure: the server may count it in another thread. Wire inputs
        (`wire_inputs.plain_inputs`) are one window per text, cut or refused, never windowed: not counted."""
        return token_floor(getattr(self.pipelines[task], "family", None), plain_inputs(parsed),
                           self.settings.max_request_tokens)

    def submit(self, task: str, parsed: list[Any], options: dict[str, Any], *, silent: bool = False,
               floor: int | None = None, limit: Callable[[list[int]], str | None] | None = None) -> Job:
        """Queue a request of inputs already validated by the task's pipeline (`parse`, `check_options`);
        `silent`: the server's own (warm-up), not reported to `events`; `floor`: its `token_floor`, when
        the caller counted it already; `limit`: the bound of its answer, checked on its windows' token counts
        before any model call (a refusal message fails it "too_large").

        Raises:
            JobFailed: "shutdown" while draining; "unhealthy" once the model gave non-finite outputs;
                "too_large" when its words alone are over `max_request_tokens`; "busy" (with a retry delay)
                when `max_queue` requests are accepted and not answered yet. Never for the model's speed.
        """
        settings = self.settings
        if self.draining or self.queue is None:
            raise JobFailed("shutdown", "the server is shutting down; retry on another instance or after restart")
        if self.unhealthy is not None:
            raise JobFailed("unhealthy", f"the model is unhealthy: {self.unhealthy}; this server answers no "
                                         "more requests until it is restarted with a sound model")
        floor = self.token_floor(task, parsed) if floor is None else floor
        if floor > settings.max_request_tokens:
            raise JobFailed("too_large", f"the inputs make {floor} tokens after windowing or more (counted from "
                                         f"their words, before tokenizing); this server runs at most "
                                         f"{settings.max_request_tokens} per request (max_request_tokens; raise "
                                         "it with `bertforge serve --max-request-tokens`), so split the request "
                                         "or send shorter texts")
        if self.in_flight >= settings.max_queue:
            tokens, wait = self.tokens_until_room(), self.retry_after_s()
            raise JobFailed("busy", f"server busy: {settings.max_queue} requests are already accepted and not "
                                    "answered yet (max_queue, `bertforge serve --max-concurrent-requests`); the "
                                    f"first of them to finish has about {tokens} tokens of model work before it; "
                                    f"retry in {retry_after(wait)} s", retry_after(wait))
        loop = asyncio.get_running_loop()
        key = task + json.dumps(options, sort_keys=True)
        job = Job(task, key, parsed, options, loop.create_future(), arrival=self.now(),
                  estimate=estimate_tokens(parsed), silent=silent, limit=limit)
        self.accepted[job] = None
        self.queue.put_nowait(job)
        self.arrived.set()
        return job

    def taken(self, job: Job) -> Job:
        """`job` leaves the queue for the worker."""
        job.timing.queue_s = self.now() - job.arrival
        return job

    async def result(self, job: Job, gone: Awaitable[Any] | None = None, *, timed: bool = True) -> Any:
        """The job's answer (one result per input). If `gone` (something that completes when the client
        leaves) or the timeout (`request_timeout_s`, if set and `timed`) comes first, the job is given up, so the
        worker runs none of its remaining windows. The warm-up is not timed: the timeout is the clients'
        patience, and a first call slower than it (a loaded machine, a cold start) would leave the server never
        ready.

        Raises:
            JobFailed: the job failed in the worker, or was given up ("disconnect", "timeout").
        """
        watch = asyncio.ensure_future(gone) if gone is not None else None
        try:
            done, _ = await asyncio.wait({job.future} | ({watch} if watch else set()),
                                         timeout=(self.settings.request_timeout_s if timed else None) or None,
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
        raise JobFailed(reason, f"no answer within {self.settings.request_timeout_s:g} s (request_timeout_s, "
                                "`bertforge serve --request-timeout-s`); its remaining work was dropped")

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
        """One turn: take in new requests (waiting for the first when there is nothing to do), then, in a turn
        of the compute lane, build their windows, forget the given-up ones, run one model call."""
        if self.running:
            fresh = self.take_waiting()
        else:
            fresh = await self.gather(self.taken(await self.next_request()))
        fresh = [job for job in fresh if not job.gone]
        if not (fresh or self.running):
            return
        async with self.turn() as turn:
            if fresh:
                began = time.perf_counter()
                await self.in_model_thread(self.prepare, fresh)
                for job in fresh:
                    job.timing.tokenization_s = time.perf_counter() - began
                self.admit(fresh)
            self.drop_gone()
            if self.running:
                step = self.plan()
                turn.charge(step.tokens, step.shared)
                await self.run_step(step)

    async def next_request(self) -> Job:
        """The next request from the queue; if model calls ran since the last release and none comes for
        `release_memory_after_s`, freed memory goes back to the operating system first."""
        idle = self.settings.release_memory_after_s
        if not (self.memory_to_release and idle and self.queue.empty()):
            return await self.queue.get()
        getter = asyncio.ensure_future(self.queue.get())
        try:
            done, _ = await asyncio.wait({getter}, timeout=idle)
            if not done:
                self.memory_to_release = False
                async with self.turn():
                    released = await self.in_model_thread(release_freed_memory)
                log.debug("idle for %.1f s: freed memory %s", idle, "released" if released else "kept (no malloc_trim)")
            return await getter
        except asyncio.CancelledError:
            if getter.done() and not getter.cancelled():
                self.queue.put_nowait(getter.result())  # taken as the worker stopped: `stop` fails it with the rest
            getter.cancel()
            raise

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
                job = self.taken(self.queue.get_nowait())
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
            job = self.taken(self.queue.get_nowait())
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
            refused = job.limit(job.tokens) if job.limit is not None else None
            if refused is not None:  # the answer these windows would make is over its bound
                job.fail("too_large", refused)
                continue
            if not self.running:
                self.clock = 0.0  # nothing in progress: positions start afresh
            job.start = self.clock  # its share starts now: it is owed nothing for the time it waited
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
        """The next model call (`sharing.plan_call`): the model's tokens shared equally between the requests in
        progress and on their way in, its budget cut by the other models' requests (`Seat.beside`)."""
        beside = self.seat.beside() if self.seat is not None else 0
        step, self.clock = plan_call(self.running, self.clock, self.settings, self.active, beside)
        return step

    async def run_step(self, step: Step) -> None:
        """Run one model call; decode each request whose windows have now all run."""
        first = step.parts[0][0]
        pipeline = self.pipelines[first.task]
        began = time.perf_counter()
        try:
            outputs = await self.in_model_thread(pipeline.forward, step.features, first.options)
            finite = await self.in_model_thread(all_finite, outputs)
        except Exception as error:
            if len(step.parts) > 1:
                # Find the culprit: every other request still gets its answer.
                for part in step.parts:
                    await self.run_step(Step([part], step.shared))
                return
            self.fail_job(first, error)
            self.running.remove(first)
            return
        elapsed = time.perf_counter() - began
        self.memory_to_release = True
        if not finite:
            self.mark_unhealthy(f"a model call gave non-finite outputs (NaN or infinity) for the {first.task} "
                                "task")
            return
        self.throughput.record(step.tokens, elapsed)
        self.clock += step.tokens / step.shared
        if not all(job.silent for job, _ in step.parts):
            self.events.model_call(len(outputs), step.tokens)
        position, finished = 0, []
        for job, indices in step.parts:
            job.timing.inference_s += elapsed
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
                if not job.silent:
                    self.events.answered(job.task, len(job.parsed))
                job.future.set_result(answer)

    def mark_unhealthy(self, reason: str) -> None:
        """The model cannot be trusted: every request in progress or waiting fails ("unhealthy"), and so does
        every later one (`submit`); readiness turns false."""
        log.error("model unhealthy: %s", reason)
        self.unhealthy = reason
        message = f"the model is unhealthy: {reason}; this server answers no more requests until it is restarted"
        for job in self.running:
            job.fail("unhealthy", message)
        self.running = []
        while self.queue is not None and not self.queue.empty():
            self.taken(self.queue.get_nowait()).fail("unhealthy", message)

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
