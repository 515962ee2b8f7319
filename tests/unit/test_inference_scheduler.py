"""Tests for bertforge.inference.scheduler: gathering, planning and running model calls within token budgets,
interleaving, dropping given-up work, refusals; and that it runs without any web framework installed.

The scheduler is driven turn by turn (`Scheduler.step`) against a fake pipeline whose windows and calls are
plain values, so every test is deterministic; one test runs a real tiny pipeline through the worker.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import math
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertforge.errors import ConfigError, InputError
from bertforge.inference.scheduler import JobFailed, Scheduler, SchedulerEvents, SchedulerSettings

WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "pydantic")
INFERENCE = Path(__file__).resolve().parents[2] / "src" / "bertforge" / "inference"
# The scheduler and the modules it is made of (its vocabulary, its admission checks, its share of the cores).
SCHEDULER_SOURCES = [INFERENCE / name for name in ("scheduler.py", "jobs.py", "admission.py", "sharing.py",
                                                   "lane.py")]
EMBEDDING_TOLERANCE = 1e-5  # fp32: one window's output does not depend on the windows sharing its call


@dataclass
class Window:
    """A fake window: the text it comes from (its first word names the request) and one id per word."""

    owner: str
    input_ids: list[int]


class FakePipeline:
    """The three steps the scheduler calls, on plain strings: a text of n words makes windows of at most
    `window_words` words (one token each); a window's output is its token count times `scale`; a text
    "unwindowable" cannot be windowed, a window of a text starting "boom" fails its model call."""

    def __init__(self, window_words: int = 4):
        self.window_words = window_words
        self.calls: list[list[str]] = []  # per model call that ran: the first word of each window's text

    def features(self, parsed: list[str]) -> list[Window]:
        windows = []
        for text in parsed:
            if text == "unwindowable":
                raise InputError("this text makes no window")
            words = text.split()
            for start in range(0, len(words), self.window_words):
                windows.append(Window(text, list(range(len(words[start:start + self.window_words])))))
        return windows

    def forward(self, features: list[Window], options: dict[str, Any]) -> list[int]:
        if any(window.owner.startswith("boom") for window in features):
            raise InputError("boom cannot run")
        self.calls.append([window.owner.split()[0] for window in features])
        return [len(window.input_ids) * options.get("scale", 1) for window in features]

    def decode(self, parsed: list[str], features: list[Window], outputs: list[int],
               options: dict[str, Any]) -> list[dict[str, Any]]:
        results = {text: {"text": text, "windows": 0, "tokens": 0} for text in parsed}
        for window, output in zip(features, outputs, strict=True):
            results[window.owner]["windows"] += 1
            results[window.owner]["tokens"] += output
        return [results[text] for text in parsed]


def whole(parsed: list[str], options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The answer of the fake pipeline run whole, in one call."""
    pipeline, options = FakePipeline(), options or {}
    features = pipeline.features(parsed)
    return pipeline.decode(parsed, features, pipeline.forward(features, options), options)


def words(name: str, count: int) -> str:
    """A text of `count` words, all `name` (the fake pipeline's calls name requests by their first word)."""
    return " ".join([name] * count)


class Recorder(SchedulerEvents):
    def __init__(self) -> None:
        self.model_calls: list[tuple[int, int]] = []  # (windows, tokens)
        self.answers: list[tuple[str, int]] = []
        self.cancels: list[str] = []
        self.dropped_windows = 0

    def model_call(self, windows: int, tokens: int) -> None:
        self.model_calls.append((windows, tokens))

    def answered(self, task: str, inputs: int) -> None:
        self.answers.append((task, inputs))

    def cancelled(self, reason: str) -> None:
        self.cancels.append(reason)

    def dropped(self, windows: int) -> None:
        self.dropped_windows += windows


def scenario(test, window_words: int = 4, **settings: Any) -> None:
    """Run `await test(scheduler, fake, events)` with a scheduler over one fake task "t", driven by hand."""

    async def main() -> None:
        fake, events = FakePipeline(window_words), Recorder()
        scheduler = Scheduler({"t": fake}, SchedulerSettings(**settings), events=events)
        await scheduler.start(run_worker=False)
        try:
            await test(scheduler, fake, events)
        finally:
            await scheduler.stop()

    asyncio.run(main())


def failure(job) -> JobFailed:
    error = job.future.exception()
    assert isinstance(error, JobFailed), error
    return error


# --- no web framework -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", SCHEDULER_SOURCES, ids=lambda path: path.name)
def test_scheduler_source_imports_no_web_framework(source):
    tree = ast.parse(source.read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported and not [name for name in imported if name.split(".")[0] in WEB_FRAMEWORKS + ("prometheus_client",)]


NO_WEB_SCRIPT = """
import asyncio, json, sys
from importlib.abc import MetaPathFinder

BLOCKED = {"fastapi", "starlette", "uvicorn", "pydantic", "fastapi_offline", "prometheus_client"}


class Blocker(MetaPathFinder):  # as if none of these were installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, Blocker())
from bertforge.errors import ConfigError
from bertforge.inference.scheduler import Scheduler, SchedulerSettings


class Window:
    def __init__(self, text, ids):
        self.text, self.input_ids = text, ids


class Counting:  # a window per two words; its output is its token count
    def features(self, parsed):
        return [Window(t, t.split()[i:i + 2]) for t in parsed for i in range(0, len(t.split()), 2)]

    def forward(self, features, options):
        return [len(w.input_ids) for w in features]

    def decode(self, parsed, features, outputs, options):
        return [sum(o for w, o in zip(features, outputs) if w.text == t) for t in parsed]


async def main():
    scheduler = Scheduler({"count": Counting()}, SchedulerSettings(max_batch_tokens=4))
    await scheduler.start()
    try:
        jobs = [scheduler.submit("count", [text], {}) for text in ("a b c d e f g h i j k", "l m n")]
        return [await scheduler.result(job) for job in jobs]
    finally:
        await scheduler.stop()


answers = asyncio.run(main())
try:
    import bertforge.serving.app
except ConfigError as error:  # the blocker works: the server needs the serve extra
    server = str(error)
else:
    server = "imported"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"answers": answers, "server": server, "loaded": loaded}))
"""


def test_scheduler_imports_and_schedules_without_web_frameworks():
    result = subprocess.run([sys.executable, "-c", NO_WEB_SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["answers"] == [[11], [3]]
    assert report["loaded"] == []
    assert "serve" in report["server"] and "not installed" in report["server"]


# --- gathering ------------------------------------------------------------------------------------------------

def test_scheduler_gather_takes_waiting_requests_up_to_max_batch_size():
    async def test(scheduler, fake, events):
        jobs = [scheduler.submit("t", [f"r{i} a", f"r{i} b"], {}) for i in range(3)]
        gathered = await scheduler.gather(await scheduler.queue.get())
        assert gathered == jobs[:2]  # 2 + 2 inputs reach max_batch_size
        assert scheduler.queue_depth == 1

    scenario(test, max_batch_size=4)


def test_scheduler_gather_waits_only_for_requests_on_their_way_in():
    async def test(scheduler, fake, events):
        alone = scheduler.submit("t", ["alone"], {})
        began = time.monotonic()
        assert await scheduler.gather(await scheduler.queue.get()) == [alone]
        assert time.monotonic() - began < 1  # nobody on the way in: no wait at all (max_wait_ms is 10 s)

        with scheduler.incoming(), scheduler.incoming():  # two requests are being read
            first = scheduler.submit("t", ["first"], {})
            gathering = asyncio.ensure_future(scheduler.gather(await scheduler.queue.get()))
            for _ in range(5):
                await asyncio.sleep(0)
            assert not gathering.done()  # waits for the other one
            second = scheduler.submit("t", ["second"], {})
            assert await asyncio.wait_for(gathering, 5) == [first, second]  # both in: no more waiting

    scenario(test, max_wait_ms=10_000)


def test_scheduler_gather_without_micro_batching_takes_one_request():
    async def test(scheduler, fake, events):
        jobs = [scheduler.submit("t", [f"r{i}"], {}) for i in range(3)]
        assert await scheduler.gather(await scheduler.queue.get()) == jobs[:1]
        assert scheduler.take_waiting() == jobs[1:2]

    scenario(test, micro_batching=False)


# --- planning and running within the token budget -------------------------------------------------------------

def test_scheduler_step_keeps_each_model_call_within_max_batch_tokens_and_answers_as_whole():
    parsed = [words("big", 30), words("pair", 6), "one"]

    async def test(scheduler, fake, events):
        job = scheduler.submit("t", parsed, {})
        while not job.gone:
            await scheduler.step()
        assert job.future.result() == whole(parsed)
        windows = len(FakePipeline().features(parsed))
        assert sum(count for count, _ in events.model_calls) == windows
        assert all(tokens <= 8 for _, tokens in events.model_calls)
        assert len(events.model_calls) > 1 and events.answers == [("t", 3)]

    scenario(test, max_batch_tokens=8)


def test_scheduler_plan_runs_a_window_larger_than_the_budget_alone():
    async def test(scheduler, fake, events):
        job = scheduler.submit("t", [words("wide", 8)], {})
        while not job.gone:
            await scheduler.step()
        assert events.model_calls == [(1, 4), (1, 4)]
        assert job.future.result() == whole([words("wide", 8)])

    scenario(test, max_batch_tokens=3)


def test_scheduler_plan_shares_a_call_only_between_equal_task_and_parameters():
    async def test(scheduler, fake, events):
        plain = scheduler.submit("t", ["plain"], {})
        scaled = scheduler.submit("t", ["scaled"], {"scale": 2})
        other = scheduler.submit("t", ["other"], {})
        await scheduler.step()
        assert fake.calls == [["plain", "other"]]
        await scheduler.step()
        assert fake.calls[1:] == [["scaled"]]
        assert scaled.future.result() == [{"text": "scaled", "windows": 1, "tokens": 2}]
        assert plain.future.result() == whole(["plain"]) and other.future.result() == whole(["other"])

    scenario(test)


def test_scheduler_small_requests_run_between_the_pieces_of_a_big_one():
    async def test(scheduler, fake, events):
        big = scheduler.submit("t", [words("big", 40)], {})  # 10 windows of 4 tokens: 5 calls of 8 tokens
        await scheduler.step()
        await scheduler.step()
        small = scheduler.submit("t", ["small"], {})
        await scheduler.step()
        assert small.future.result() == whole(["small"]) and not big.gone  # one call after it arrived
        second, third = scheduler.submit("t", ["second"], {}), scheduler.submit("t", ["third"], {})
        while not big.gone:
            await scheduler.step()
        # New requests run first in the next call; the request in progress has its equal share of each call
        # (the budget / requests in progress: 4 tokens, one window, beside one, 8/3 beside two), alone the rest.
        assert fake.calls == [["big"] * 2, ["big"] * 2, ["small", "big"], ["second", "third", "big"],
                              ["big"] * 2, ["big"] * 2]
        assert big.future.result() == whole([words("big", 40)])
        assert second.future.result() == whole(["second"]) and third.future.result() == whole(["third"])

    scenario(test, max_batch_tokens=8)


def test_scheduler_shares_each_call_equally_between_short_requests_and_a_worst_case_one():
    # One client keeps a request of 100 windows, all of the longest length (4 tokens), in progress; 8 others
    # send 1-token requests in a closed loop (a new one as soon as the last is answered). Each request is one
    # share: the large one runs about as many tokens per call as each short one, instead of every other call
    # of the whole budget, so the short clients are answered in every call, not every second one.
    async def test(scheduler, fake, events):
        heavy = scheduler.submit("t", [words("heavy", 400)], {})
        shorts = [scheduler.submit("t", [f"s{client}"], {}) for client in range(8)]
        answered = 0
        for _ in range(40):
            await scheduler.step()
            for client, job in enumerate(shorts):
                if job.gone:
                    assert job.future.result() == whole([f"s{client}"])
                    answered += 1
                    shorts[client] = scheduler.submit("t", [f"s{client}"], {})
        heavy_tokens = 4 * sum(call.count("heavy") for call in fake.calls)
        short_tokens = sum(len(call) - call.count("heavy") for call in fake.calls)
        assert answered == 8 * 40  # every short client answered in every call
        assert short_tokens == 320 and 8 <= heavy_tokens <= 2 * short_tokens / 8  # about one short client's share
        assert all(len(call) - call.count("heavy") == 8 for call in fake.calls)
        # Alone, the large request fills the budget again and finishes, answered as if run whole.
        for job in shorts:
            job.future.cancel()
        calls = len(fake.calls)
        while not heavy.gone:
            await scheduler.step()
        assert heavy.future.result() == whole([words("heavy", 400)])
        assert all(call == ["heavy"] * 8 for call in fake.calls[calls + 1:-1])

    scenario(test, max_batch_tokens=32)


def test_scheduler_large_request_alone_in_progress_shares_calls_with_requests_on_their_way_in():
    # Under a closed-loop load the queue is empty just after each call while the clients' next requests are
    # being read: counted alone, a large request filled the whole budget (8 windows) and they all waited for
    # that call. Counting the 7 requests on their way in, it runs its share (one window) until they arrive.
    async def test(scheduler, fake, events):
        heavy = scheduler.submit("t", [words("heavy", 400)], {})
        with contextlib.ExitStack() as arriving:
            for _ in range(8):  # the large request's own, and 7 others being read
                arriving.enter_context(scheduler.incoming())
            await scheduler.step()
            await scheduler.step()
        await scheduler.step()  # nobody on the way in any more: it is alone and fills the budget again
        assert fake.calls == [["heavy"], ["heavy"], ["heavy"] * 8]
        assert not heavy.gone

    scenario(test, max_batch_tokens=32)


class SlowClock:
    """`time` for the scheduler module whose `perf_counter` moves `seconds_per_read` at every read: every model
    call the scheduler times looks that long, so the speed it measures is as slow as the test wants."""

    def __init__(self, seconds_per_read: float):
        self.now, self.step = 0.0, seconds_per_read

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_scheduler_accepts_and_answers_an_in_limit_request_however_slow_the_measured_speed(monkeypatch):
    # The same request must pass at night and by day: here every model call seems to take 100 s, so the
    # measured speed is a fraction of a token per second (the old rule refused this request with 413, "this
    # server runs about 0 tokens/s"). Within max_request_tokens it is accepted, run and answered as whole.
    import bertforge.inference.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "time", SlowClock(100.0))

    async def test(scheduler, fake, events):
        first = scheduler.submit("t", [words("warm", 8)], {})  # one full call of 8 tokens: the speed is measured
        while not first.gone:
            await scheduler.step()
        assert scheduler.throughput.tokens_per_s < 0.1
        large = scheduler.submit("t", [words("large", 400)], {})  # 400 tokens: 50 calls at that speed
        while not large.gone:
            await scheduler.step()
        assert large.future.exception() is None and large.future.result() == whole([words("large", 400)])
        assert sum(windows for windows, _ in events.model_calls) == 2 + 100

    scenario(test, max_batch_tokens=8, max_request_tokens=400)


def test_scheduler_large_request_keeps_its_equal_share_and_is_answered_while_short_requests_keep_arriving():
    # A large request (180 windows of 4 tokens) accepted on the idle server, then 16 closed-loop clients of
    # 1-token requests: each request is one equal share of the tokens the calls run, so it runs about one
    # token per call, as each short client does (a window every fourth call), and is answered, never starved,
    # while every short client is answered in every call.
    async def test(scheduler, fake, events):
        heavy = scheduler.submit("t", [words("heavy", 720)], {})
        await scheduler.step()  # alone: its first call is full
        shorts = [scheduler.submit("t", [f"s{client}"], {}) for client in range(16)]
        calls = answered = 0
        while not heavy.gone:
            await scheduler.step()
            calls += 1
            for client, job in enumerate(shorts):
                if job.gone:
                    answered += 1
                    shorts[client] = scheduler.submit("t", [f"s{client}"], {})
        assert heavy.future.result() == whole([words("heavy", 720)])
        assert answered == 16 * calls  # the short clients were never held back by it
        # Its 712 tokens after the first call, at about one token (its equal share) per call.
        assert 0.8 * 712 <= calls <= 1.2 * 712

    scenario(test, max_batch_tokens=32)


def test_scheduler_accepts_two_large_requests_at_once_and_shares_the_calls_between_them():
    # Nothing is refused for what the requests in progress will take (the old rule answered the second 429,
    # "the requests in progress are guaranteed 49 of the model's 100 tokens/s"): both are accepted, every
    # call holds windows of both, and both are answered.
    async def test(scheduler, fake, events):
        scheduler.throughput.tokens_per_s = 1.0  # a slow model, as measured
        first = scheduler.submit("t", [words("first", 200)], {})
        await scheduler.step()
        second = scheduler.submit("t", [words("second", 200)], {})
        while not (first.gone and second.gone):
            await scheduler.step()
        assert first.future.result() == whole([words("first", 200)])
        assert second.future.result() == whole([words("second", 200)])
        # Alone, the first fills its call; then every call holds half of each until the first runs out.
        assert fake.calls[0] == ["first"] * 8 and len(fake.calls) == 13
        assert all(call.count("first") == call.count("second") == 4 for call in fake.calls[1:11])

    scenario(test, max_batch_tokens=32)


# --- work nobody waits for ----------------------------------------------------------------------------------------

def test_scheduler_drops_the_remaining_windows_of_a_request_whose_client_left():
    async def test(scheduler, fake, events):
        job = scheduler.submit("t", [words("big", 40)], {})
        await scheduler.step()  # 2 of its 10 windows run
        gone = asyncio.get_running_loop().create_future()
        gone.set_result(None)  # the client has left
        with pytest.raises(JobFailed) as refused:
            await scheduler.result(job, gone=gone)
        assert refused.value.kind == "disconnect" and events.cancels == ["disconnect"]
        await scheduler.step()
        assert len(fake.calls) == 1 and events.dropped_windows == 8 and not scheduler.running

    scenario(test, max_batch_tokens=8)


def test_scheduler_never_runs_a_waiting_request_whose_client_left_and_frees_its_place():
    async def test(scheduler, fake, events):
        running = scheduler.submit("t", [words("big", 16)], {})
        await scheduler.step()  # 2 of its 4 windows run
        waiting = scheduler.submit("t", [words("waiting", 40)], {})  # 10 windows, not built yet
        gone = asyncio.get_running_loop().create_future()
        gone.set_result(None)
        with pytest.raises(JobFailed):
            await scheduler.result(waiting, gone=gone)
        assert scheduler.in_flight == 1  # its place in the queue is free at once
        while not running.gone:
            await scheduler.step()
        assert all("waiting" not in call for call in fake.calls) and len(fake.calls) == 2
        assert events.cancels == ["disconnect"]

    scenario(test, max_batch_tokens=8, max_queue=2)


def test_scheduler_timeout_fails_the_request_and_drops_its_remaining_windows():
    async def test(scheduler, fake, events):
        job = scheduler.submit("t", [words("big", 40)], {})
        await scheduler.step()
        with pytest.raises(JobFailed) as refused:
            await scheduler.result(job)  # nobody runs the next turn: the timeout passes
        assert refused.value.kind == "timeout" and "request_timeout_s" in refused.value.message
        assert "dropped" in refused.value.message and events.cancels == ["timeout"]
        await scheduler.step()
        assert len(fake.calls) == 1 and events.dropped_windows == 8

    scenario(test, max_batch_tokens=8, request_timeout_s=0.05)


# --- refusals and failures ------------------------------------------------------------------------------------

def test_scheduler_refuses_a_request_when_the_queue_is_full():
    async def test(scheduler, fake, events):
        scheduler.submit("t", ["one"], {})
        scheduler.submit("t", ["two"], {})
        with pytest.raises(JobFailed) as refused:
            scheduler.submit("t", ["three"], {})
        assert refused.value.kind == "busy" and "2 requests are already accepted" in refused.value.message
        assert "retry" in refused.value.message and scheduler.queue_depth == 2

    scenario(test, max_queue=2)


def test_scheduler_queue_bound_counts_requests_in_progress_until_they_are_answered():
    # TEI's max_concurrent_requests: a request taken by the worker still holds its place until answered, so
    # the bound holds however quickly the worker empties the waiting line (it took in every request at once,
    # and nothing was ever refused: 20 concurrent requests were all accepted).
    async def test(scheduler, fake, events):
        big = scheduler.submit("t", [words("big", 40)], {})  # 10 windows of 4 tokens: 5 calls
        small = scheduler.submit("t", ["small"], {})
        await scheduler.step()
        assert scheduler.queue_depth == 0 and small.gone and not big.gone and scheduler.in_flight == 1
        other = scheduler.submit("t", ["other"], {})
        with pytest.raises(JobFailed) as refused:
            scheduler.submit("t", ["refused"], {})
        assert refused.value.kind == "busy" and scheduler.in_flight == 2
        while not big.gone:
            await scheduler.step()
        assert other.future.result() == whole(["other"])
        scheduler.submit("t", ["room again"], {})  # answered: their places are free

    scenario(test, max_queue=2, max_batch_tokens=8)


def test_scheduler_full_queue_retry_after_counts_the_work_ahead_in_tokens():
    # Retry-After is a fact about the queue: at equal shares the first request to finish is the one with the
    # least work left, after that much of each request's work (4 tokens left x 2 requests = 8 tokens); the
    # measured speed only turns tokens into seconds (2 tokens/s: 4 s). A slower measure changes the header,
    # never whether a request is accepted.
    async def test(scheduler, fake, events):
        big = scheduler.submit("t", [words("big", 40)], {})
        small = scheduler.submit("t", [words("small", 7)], {})  # windows of 4 and 3 tokens
        await scheduler.step()  # one 8-token call: big 4, small 4
        assert (big.left, small.left) == (36, 4)  # (shortest windows first: its 3 ran)
        scheduler.throughput.tokens_per_s = 2.0
        with pytest.raises(JobFailed) as refused:
            scheduler.submit("t", ["late"], {})
        assert refused.value.retry_after_s == 4 and "about 8 tokens of model work" in refused.value.message
        scheduler.throughput.tokens_per_s = 0.001
        with pytest.raises(JobFailed) as slower:
            scheduler.submit("t", ["late"], {})
        assert slower.value.kind == "busy" and slower.value.retry_after_s == 8000

    scenario(test, max_queue=2, max_batch_tokens=8)


def test_scheduler_refuses_a_request_over_max_request_tokens_before_any_model_call():
    async def test(scheduler, fake, events):
        large = scheduler.submit("t", [words("large", 20)], {})
        await scheduler.step()
        error = failure(large)
        assert error.kind == "too_large" and "make 20 tokens after windowing (5 windows)" in error.message
        assert "at most 10 per request" in error.message and "--max-request-tokens" in error.message
        assert fake.calls == []
        fine = scheduler.submit("t", ["fine"], {})
        await scheduler.step()
        assert fine.future.result() == whole(["fine"])

    scenario(test, max_request_tokens=10)


def test_scheduler_bad_input_fails_only_its_own_request():
    async def test(scheduler, fake, events):
        good = scheduler.submit("t", ["good"], {})
        unwindowable = scheduler.submit("t", ["unwindowable"], {})
        boom = scheduler.submit("t", ["boom"], {})
        await scheduler.step()  # good and boom share a call; it fails, so each is retried alone
        assert good.future.result() == whole(["good"])
        assert failure(unwindowable).kind == "invalid" and "makes no window" in failure(unwindowable).message
        assert failure(boom).kind == "invalid" and "boom cannot run" in failure(boom).message
        assert fake.calls == [["good"]] and not scheduler.running

    scenario(test)


def test_scheduler_stop_fails_waiting_and_running_requests_as_shutdown():
    async def test(scheduler, fake, events):
        running = scheduler.submit("t", [words("big", 40)], {})
        await scheduler.step()
        waiting = scheduler.submit("t", ["late"], {})
        await scheduler.stop()
        assert failure(running).kind == failure(waiting).kind == "shutdown"

    scenario(test, max_batch_tokens=8)


def test_scheduler_settings_reject_limits_that_cannot_work():
    for field, value in (("max_batch_tokens", 0), ("max_queue", True), ("max_batch_size", 2.5)):
        with pytest.raises(ConfigError, match=f"{field} must be a positive integer"):
            SchedulerSettings(**{field: value})
    with pytest.raises(ConfigError, match="request_timeout_s must be >= 0"):
        SchedulerSettings(request_timeout_s=-1)


# --- the worker -----------------------------------------------------------------------------------------------

async def ask(scheduler: Scheduler, task: str, parsed: list[Any], options: dict[str, Any] | None = None) -> Any:
    """What the server does for one request: on its way in, then queued, then its answer."""
    with scheduler.incoming():
        await asyncio.sleep(0)  # the body is being read
        return await scheduler.result(scheduler.submit(task, parsed, options or {}))


def test_scheduler_worker_batches_concurrent_requests_and_answers_each_as_whole():
    texts = [words(f"r{i}", 1 + i % 5) for i in range(8)]

    async def main() -> None:
        fake = FakePipeline()
        scheduler = Scheduler({"t": fake}, SchedulerSettings(max_wait_ms=1000))
        await scheduler.start()
        try:
            answers = await asyncio.gather(*(ask(scheduler, "t", [text]) for text in texts))
        finally:
            await scheduler.stop()
        assert answers == [whole([text]) for text in texts]
        assert len(fake.calls) < len(texts)  # requests shared model calls

    asyncio.run(main())


def test_scheduler_releases_freed_memory_once_per_idle_spell_after_model_calls(monkeypatch):
    import bertforge.inference.scheduler as scheduler_module

    releases: list[float] = []
    monkeypatch.setattr(scheduler_module, "release_freed_memory", lambda: releases.append(time.monotonic()) or True)

    async def main() -> None:
        fake = FakePipeline()
        scheduler = Scheduler({"t": fake}, SchedulerSettings(release_memory_after_s=0.05))
        await scheduler.start()
        try:
            await asyncio.sleep(0.2)
            assert releases == []  # nothing ran yet: nothing to give back
            assert await ask(scheduler, "t", ["one a"]) == whole(["one a"])
            await asyncio.sleep(0.3)
            assert len(releases) == 1  # one release per idle spell, not one per wait
            answered = time.monotonic()
            assert await ask(scheduler, "t", ["two b"]) == whole(["two b"])  # a request after the release runs
            await asyncio.sleep(0.3)
            assert len(releases) == 2 and releases[1] > answered
        finally:
            await scheduler.stop()

    asyncio.run(main())


def test_scheduler_never_releases_memory_when_the_setting_is_zero(monkeypatch):
    import bertforge.inference.scheduler as scheduler_module

    releases: list[int] = []
    monkeypatch.setattr(scheduler_module, "release_freed_memory", lambda: releases.append(1) or True)

    async def main() -> None:
        scheduler = Scheduler({"t": FakePipeline()}, SchedulerSettings(release_memory_after_s=0))
        await scheduler.start()
        try:
            await ask(scheduler, "t", ["one a"])
            await asyncio.sleep(0.2)
        finally:
            await scheduler.stop()

    asyncio.run(main())
    assert releases == []
    with pytest.raises(ConfigError, match="release_memory_after_s"):
        SchedulerSettings(release_memory_after_s=-1)


def test_release_freed_memory_returns_heap_to_the_system_where_glibc_has_malloc_trim():
    from bertforge import runtime

    released = runtime.release_freed_memory()
    assert released is (runtime._malloc_trim() is not None)
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        assert released


def test_scheduler_runs_a_real_pipeline_split_over_calls_as_the_pipeline_answers(tiny_minilm_model):
    from bertforge.inference.pipelines import load_pipeline

    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu", precision="fp32")
    texts = ["a short one", "the weather in lisbon was warm " * 6, "fish bread and wine", "hello"]
    events = Recorder()

    async def main() -> list[Any]:
        scheduler = Scheduler({"embed": pipeline}, SchedulerSettings(max_batch_tokens=24), events=events)
        await scheduler.start()
        try:
            options = pipeline.check_options({})
            return await ask(scheduler, "embed", [pipeline.parse(text) for text in texts], options)
        finally:
            await scheduler.stop()

    answers = asyncio.run(main())
    assert len(events.model_calls) > 1  # the request was split
    for got, expected in zip(answers, pipeline.run(texts), strict=True):
        assert got["embedding"] == pytest.approx(expected["embedding"], abs=EMBEDDING_TOLERANCE)


# --- admission: refusals decided before any model work (issue #20) --------------------------------------------

@dataclass
class Pair:
    """A parsed classification input, as the windowing families' floor reads it."""

    text_a: str
    text_b: str | None = None


class Family:
    """Windows the first text of a pair, as classification windows the longer one."""

    def windowed_texts(self, example):
        return [max((t for t in (example.text_a, example.text_b) if t is not None), key=len)]


class WindowingFake(FakePipeline):
    """The fake pipeline posing as a windowing family, counting the windows it was asked to build."""

    family = Family()

    def __init__(self) -> None:
        super().__init__()
        self.windowed: list[Any] = []

    def features(self, parsed):
        self.windowed += parsed
        return super().features([item.text_a if isinstance(item, Pair) else item for item in parsed])


def test_scheduler_refuses_a_request_whose_words_are_over_the_budget_before_windowing_it():
    async def main() -> None:
        fake = WindowingFake()
        scheduler = Scheduler({"t": fake}, SchedulerSettings(max_request_tokens=50))
        await scheduler.start(run_worker=False)
        try:
            with pytest.raises(JobFailed) as refused:
                scheduler.submit("t", [Pair(words("big", 30)), Pair("a", words("pair", 40))], {})
            assert refused.value.kind == "too_large" and "at most 50 per request" in refused.value.message
            assert scheduler.queue_depth == 0 and fake.windowed == []  # never reached the model thread
            scheduler.submit("t", [Pair(words("fits", 20))], {})  # under the floor: counted exactly later
            assert scheduler.queue_depth == 1
        finally:
            await scheduler.stop()

    asyncio.run(main())


@pytest.mark.parametrize("text", [
    "plain ascii words, with punctuation!", "a\x0bb\x0cc\x1cd", "\u200b \u200b word \u200b", "caf\u0065\u0301 na\u00efve",
    "\u4e2d\u6587\u5b57 and latin", "\x00\x01 \x7f x", "a\u2028b\u2029c", "w" * 300 + " short", "__ -- ..", "e\u0301 \u0301",
])
def test_admission_word_floor_never_exceeds_the_tokenizer(minilm_path, text):
    from bertforge.inference.admission import quick_floor, word_floor
    from bertforge.tokenization import Tokenizer

    tokenizer = Tokenizer.from_pretrained(minilm_path)
    tokens = len(tokenizer.encode(text, add_special_tokens=False).ids)
    assert word_floor(text) <= tokens and quick_floor(text) <= tokens


# Characters where a quick count could go wrong: separators (ASCII, NBSP, ideographic space, line separator),
# characters cleaning deletes (controls, zero-width space, BOM, combining marks), CJK and its neighbours
# (Yijing hexagrams U+4DC0.., CJK extension A, fullwidth forms), punctuation, accented and Cyrillic letters.
QUICK_ALPHABET = ("ab Z9_ \t\n\r\x0b\x0c\x1c\x7f\x00.,!-'\"\u00a0\u3000\u2028\u200b\ufeff\u0301\u0300"
                  "\u4e2d\u6587\u9fa5\u5000\u4dc0\u4e00\u3400\uff01\uff21\u00e9\u00c5\u0416\u0436\ufffd")


TOKENIZERS: dict[Path, Any] = {}


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=QUICK_ALPHABET, max_size=40))
def test_admission_quick_floor_never_exceeds_the_tokenizer(minilm_path, text):
    from bertforge.inference.admission import quick_floor
    from bertforge.tokenization import Tokenizer

    tokenizer = TOKENIZERS.get(minilm_path) or TOKENIZERS.setdefault(minilm_path, Tokenizer.from_pretrained(minilm_path))
    assert quick_floor(text) <= len(tokenizer.encode(text, add_special_tokens=False).ids)


def test_admission_quick_floor_counts_ascii_words_and_cjk_ideographs():
    from bertforge.inference.admission import quick_floor

    assert quick_floor("caf\u00e9 na\u00efve  x") == 3  # accented words keep their ASCII letters
    assert quick_floor("\u4e2d\u6587\u5b57 and latin") == 2 + 2  # 中 is below U+5000: not counted
    assert quick_floor("\u00e9\u00e9 \u0416") == 0  # no ASCII, no CJK: the regular expression decides
    assert quick_floor("a\x0bb c") == 2  # a deleted control joins, it does not separate


def test_admission_token_floor_is_zero_for_families_that_truncate_and_for_short_requests():
    from bertforge.families import registry
    from bertforge.inference.admission import token_floor

    long = words("w", 5000)
    assert token_floor(registry.for_task("embed"), [long], 100) == 0  # truncated to one window: bounded by it
    classification = registry.for_task("classify")
    assert token_floor(classification, [Pair("short text")], 100) == 0  # fewer characters than the limit
    assert token_floor(classification, [Pair("x", long)], 100) > 100  # the longer segment is windowed
    question = SimpleNamespace(question=long, context="c")
    assert token_floor(registry.for_task("answer"), [question], 100) == 0  # the question is cut, not windowed


def test_scheduler_full_queue_refusal_says_when_to_retry():
    async def test(scheduler, fake, events):
        scheduler.submit("t", ["first"], {})
        with pytest.raises(JobFailed) as refused:
            scheduler.submit("t", ["second"], {})
        assert refused.value.kind == "busy" and refused.value.retry_after_s == 1  # no throughput measured yet

    scenario(test, max_queue=1)


def test_scheduler_accepts_up_to_max_queue_whatever_the_expected_wait():
    # The old rule refused a request that would wait longer than max_queue_wait_s at the recent throughput
    # (429 by day, 200 at night); now only a full queue refuses, however slow the model was measured.
    async def test(scheduler, fake, events):
        scheduler.throughput.tokens_per_s = 0.01  # hours of work ahead at this speed
        jobs = [scheduler.submit("t", [words(f"r{i}", 400)], {}) for i in range(8)]
        with pytest.raises(JobFailed) as refused:
            scheduler.submit("t", ["ninth"], {})
        assert refused.value.kind == "busy" and len(jobs) == scheduler.in_flight == 8

    scenario(test, max_queue=8)


class NanPipeline(FakePipeline):
    """Windows of a text starting "nan" give a NaN output."""

    def forward(self, features, options):
        outputs = super().forward(features, options)
        return [math.nan if w.owner.startswith("nan") else out for w, out in zip(features, outputs)]


def test_scheduler_non_finite_outputs_mark_the_model_unhealthy_and_refuse_later_requests():
    async def main() -> None:
        scheduler = Scheduler({"t": NanPipeline()}, SchedulerSettings())
        await scheduler.start()
        try:
            await scheduler.warm_up({"t": (["fine"], {})})
            assert scheduler.ready
            with pytest.raises(JobFailed) as failed:
                await ask(scheduler, "t", ["nan please"])
            assert failed.value.kind == "unhealthy" and "non-finite" in failed.value.message
            assert not scheduler.ready
            with pytest.raises(JobFailed) as later:
                await ask(scheduler, "t", ["fine"])
            assert later.value.kind == "unhealthy"
        finally:
            await scheduler.stop()

    asyncio.run(main())


def test_scheduler_warm_up_with_non_finite_outputs_is_never_ready():
    async def main() -> None:
        scheduler = Scheduler({"t": NanPipeline()}, SchedulerSettings())
        await scheduler.start()
        try:
            await scheduler.warm_up({"t": (["nan"], {})})
            assert not scheduler.warmed and not scheduler.ready and "non-finite" in scheduler.unhealthy
        finally:
            await scheduler.stop()

    asyncio.run(main())


def test_scheduler_warm_up_waits_past_the_request_timeout_which_still_bounds_clients():
    gate = threading.Event()

    class ColdStart(FakePipeline):
        """The first call is slower than the clients' timeout (a cold start); a client's call waits for `gate`."""

        def forward(self, features, options):
            if not self.calls:
                time.sleep(0.3)
            else:
                gate.wait()
            return super().forward(features, options)

    async def main() -> None:
        scheduler = Scheduler({"t": ColdStart()}, SchedulerSettings(request_timeout_s=0.05))
        await scheduler.start()
        try:
            await scheduler.warm_up({"t": (["warm"], {})})
            assert scheduler.warmed and scheduler.ready
            with pytest.raises(JobFailed) as failed:
                await ask(scheduler, "t", ["client"])
            assert failed.value.kind == "timeout"
        finally:
            gate.set()
            await scheduler.stop()

    asyncio.run(main())


def test_scheduler_drain_finishes_accepted_requests_and_refuses_new_ones():
    async def main() -> None:
        fake = FakePipeline(window_words=1)
        original = fake.forward

        def slow(features, options):
            time.sleep(0.01)
            return original(features, options)

        fake.forward = slow
        scheduler = Scheduler({"t": fake}, SchedulerSettings(max_batch_tokens=2))
        await scheduler.start()
        accepted = [asyncio.ensure_future(ask(scheduler, "t", [words(f"r{i}", 10)])) for i in range(3)]
        await asyncio.sleep(0.02)  # accepted, some running
        drained = asyncio.ensure_future(scheduler.drain(timeout_s=10))
        await asyncio.sleep(0)
        with pytest.raises(JobFailed) as refused:
            scheduler.submit("t", ["late"], {})
        assert refused.value.kind == "shutdown"
        assert await drained is True
        assert [answer[0]["tokens"] for answer in await asyncio.gather(*accepted)] == [10, 10, 10]

    asyncio.run(main())


def test_scheduler_records_where_a_request_spent_its_time():
    async def test(scheduler, fake, events):
        job = scheduler.submit("t", [words("a", 8)], {})
        while not job.gone:
            await scheduler.step()
        assert job.timing.queue_s >= 0 and job.timing.tokenization_s >= 0 and job.timing.inference_s > 0
        assert scheduler.throughput.tokens_per_s > 0

    scenario(test, max_batch_tokens=4)


def test_all_finite_reads_every_kind_of_model_output():
    import numpy as np
    import torch

    from bertforge.inference.scheduler import all_finite

    assert all_finite([np.ones(3), (torch.zeros(2), torch.ones(1)), {"a": 1.0}, 3, "text"])
    for bad in (np.array([1.0, np.inf]), (torch.zeros(2), torch.tensor([math.nan])), [{"a": math.nan}]):
        assert not all_finite(bad)


def test_scheduler_default_settings_answer_the_openai_sdks_full_batch_of_long_chunks_on_a_slow_model(monkeypatch):
    # The openai SDK sends up to 2,048 inputs in one request; RAG chunks of 200 tokens make about 410k tokens.
    # Within max_request_tokens and with no deadline by default, it is accepted and answered however slow the
    # model is measured (every call here seems to take 100 s), in model calls of at most max_batch_tokens;
    # the client's own timeout (openai's SDK: 600 s) is the only deadline.
    import bertforge.inference.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "time", SlowClock(100.0))
    settings = SchedulerSettings()
    assert settings.request_timeout_s == 0 and settings.max_request_tokens >= 2048 * 202
    chunks = [words(f"c{i}", 200) for i in range(2048)]

    async def test(scheduler, fake, events):
        warm = scheduler.submit("t", [words("warm", 200)] * 30, {})  # full calls first: the speed is measured
        while not warm.gone:
            await scheduler.step()
        job = scheduler.submit("t", chunks, {})
        while not job.gone:
            await scheduler.step()
        answers = job.future.result()
        assert [answer["tokens"] for answer in answers] == [200] * 2048
        assert all(tokens <= settings.max_batch_tokens for _, tokens in events.model_calls)

    scenario(test, window_words=200)
