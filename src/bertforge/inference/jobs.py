"""The values the serving scheduler works with: its settings, a request in flight (`Job`) and the timing of
its parts, one model call (`Step`), why a request got no answer (`Failure`, `JobFailed`), the events it reports,
and the checks on what a model call gave back (`all_finite`).

Like the scheduler (`inference.scheduler`, which owns the queue and the worker), nothing here knows HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from bertforge.errors import ConfigError

# Why a request got no answer; the server maps each to an HTTP status.
Failure = Literal["invalid", "too_large", "busy", "timeout", "disconnect", "shutdown", "unhealthy", "internal"]
FAILURES: tuple[Failure, ...] = ("invalid", "too_large", "busy", "timeout", "disconnect", "shutdown", "unhealthy",
                                 "internal")
# Reasons a request is given up by its waiter (the labels of the server's cancelled counter).
CANCEL_REASONS: tuple[Failure, ...] = ("disconnect", "timeout")


class ModelSteps(Protocol):
    """What the scheduler needs of a pipeline: its three steps (see `inference.family_pipelines.Pipeline`)."""

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
        max_queue: requests accepted and not answered yet (waiting or in progress, text-embeddings-inference's
            `max_concurrent_requests`); a request beyond it is refused at once ("busy", 429 with a Retry-After).
            The only refusal that depends on the load: a request within the static limits is never refused
            for how fast the model runs now.
        micro_batching: False runs every request alone (for comparison in benchmarks).
        request_timeout_s: a request not answered in this time fails ("timeout") and its remaining work is
            dropped; 0 (the default): none, an accepted request is answered however long its work takes, and
            the client's own timeout decides (a client that gives up closes its connection, which drops its
            remaining work just the same).
        drain_timeout_s: at shutdown, how long accepted requests may take to finish before they fail.
        release_memory_after_s: once model calls have run, when no request arrives for this long, the heap
            memory they freed is handed back to the operating system (`runtime.release_freed_memory`; 0: never).
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_batch_tokens: int = 4096
    max_request_tokens: int = 524_288
    max_queue: int = 256
    micro_batching: bool = True
    # No deadline: a request within the static limits is answered (the openai SDK's full batch of 2,048 chunks of
    # 200 tokens, about 410k tokens, takes minutes on two busy CPU cores); the client's timeout (openai's SDK
    # 600 s) ends its wait, and its closed connection drops the work (`Scheduler.result`).
    request_timeout_s: float = 0.0
    drain_timeout_s: float = 30.0
    release_memory_after_s: float = 2.0

    def __post_init__(self) -> None:
        check_positive(self, ("max_batch_size", "max_batch_tokens", "max_request_tokens", "max_queue"))
        check_seconds(self, ("max_wait_ms", "request_timeout_s", "drain_timeout_s", "release_memory_after_s"))


def check_seconds(settings: object, names: Sequence[str]) -> None:
    """ConfigError naming the first of `names` on `settings` that is not a finite number >= 0."""
    for name in names:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise ConfigError(f"server {name} must be >= 0 (a finite number of seconds), got {value!r}")


def check_positive(settings: object, names: Sequence[str]) -> None:
    """ConfigError naming the first of `names` on `settings` that is not a positive integer."""
    for name in names:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"server {name} must be a positive integer, got {value!r}")


class JobFailed(Exception):
    """Why a request got no answer: a `Failure` kind (the server's status code), a message for the client and,
    for a refusal that may succeed later ("busy"), after how many seconds to retry (the Retry-After header)."""

    def __init__(self, kind: Failure, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s


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


@dataclass
class JobTiming:
    """Where a request's time went, in seconds (the TEI-style timing headers): waiting for the worker,
    building its windows (tokenization), and the model calls that ran its windows."""

    queue_s: float = 0.0
    tokenization_s: float = 0.0
    inference_s: float = 0.0


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
    served: int = 0  # tokens run so far
    start: float = 0.0  # the scheduler's share clock when its windows were built (`sharing.position`)
    error: BaseException | None = None  # why its windows could not be built
    estimate: int = 0  # rough tokens before windowing (`admission.estimate_tokens`), for the Retry-After only
    timing: JobTiming = field(default_factory=JobTiming)
    silent: bool = False  # the server's own warm-up: not reported to the events (metrics count clients' work)
    # The bound on its answer once its windows' token counts are known: a refusal ("too_large") or None.
    limit: Callable[[list[int]], str | None] | None = None

    @property
    def gone(self) -> bool:
        """Nobody waits for the answer any more (answered, failed, timed out or the client left)."""
        return self.future.done()

    @property
    def left(self) -> int:
        """Tokens of model work it still has: its windows not run yet, or before they are built its estimate."""
        return sum(self.tokens[index] for index in self.todo) if self.features else self.estimate

    def fail(self, kind: Failure, message: str) -> None:
        if not self.future.done():
            self.future.set_exception(JobFailed(kind, message))


@dataclass
class Step:
    """One model call: windows of jobs with the same task and parameters, at most `max_batch_tokens` tokens."""

    parts: list[tuple[Job, list[int]]]  # (job, its feature indices in this call)
    shared: int = 1  # the requests in progress that share the model's time while it runs (`Scheduler.plan`)

    @property
    def features(self) -> list[Any]:
        return [job.features[i] for job, indices in self.parts for i in indices]

    @property
    def tokens(self) -> int:
        return sum(job.tokens[i] for job, indices in self.parts for i in indices)



def retry_after(seconds: float | None) -> int:
    """Whole seconds for a Retry-After header: the expected delay rounded up, at least 1 (unknown: 1)."""
    if seconds is None or not math.isfinite(seconds):
        return 1
    return max(1, math.ceil(seconds))


def all_finite(value: Any) -> bool:
    """Whether every number in a model output is finite: numpy arrays, tensors (anything with `isfinite`),
    floats, and tuples, lists, dicts and dataclasses of them."""
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    if isinstance(value, float):
        return math.isfinite(value)
    if callable(getattr(value, "isfinite", None)):  # a tensor (not imported here)
        return bool(value.isfinite().all())
    if isinstance(value, list | tuple):
        return all(all_finite(item) for item in value)
    if isinstance(value, dict):
        return all(all_finite(item) for item in value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(all_finite(getattr(value, f.name)) for f in dataclasses.fields(value))
    return True
