"""Tests for bertforge.inference.lane: the served models' schedulers take turns on the machine's cores, by the
tokens each of their requests got, and a model's large request runs in slices while another model is busy.

Model calls here take a fixed number of event-loop turns (`in_loop`) instead of a thread: what runs when is then
decided by the event loop alone, so every order counted below is the same on any machine under any load.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.unit.test_inference_scheduler import FakePipeline, words

from bertforge.inference.lane import ComputeLane, Turn
from bertforge.inference.scheduler import Scheduler, SchedulerSettings

CALL_TURNS = 20  # event-loop turns one model call takes: long enough for the other model's clients to come back


def in_loop(scheduler: Scheduler, name: str, calls: list[tuple[str, int]], inside: list[str],
            overlaps: list[str]) -> None:
    """Run `scheduler`'s model-thread work in the event loop, `CALL_TURNS` turns each; record each model call as
    (name, tokens), and every piece of work that began while another model's was running."""
    pipeline = scheduler.pipelines["t"]
    forward = pipeline.forward

    def recorded(features, options):
        calls.append((name, sum(len(window.input_ids) for window in features)))
        return forward(features, options)

    async def run(function, *args):
        if any(other != name for other in inside):
            overlaps.append(name)
        inside.append(name)
        try:
            for _ in range(CALL_TURNS):
                await asyncio.sleep(0)
            return function(*args)
        finally:
            inside.remove(name)

    pipeline.forward = recorded
    scheduler.in_model_thread = run


def answer(window_words: int, text: str) -> list[dict[str, Any]]:
    """The fake pipeline's answer for `text` run whole."""
    pipeline = FakePipeline(window_words)
    features = pipeline.features([text])
    return pipeline.decode([text], features, pipeline.forward(features, {}), {})


def test_lane_models_take_turns_by_tokens_per_request_and_a_large_request_runs_in_slices():
    # Model "big" has one large request of 50 windows of 8 tokens; model "small" 8 closed-loop clients whose
    # requests have 3 windows of 4 tokens. Budget 36 tokens a call. Alone, big would fill its calls (4 windows);
    # beside small's 8 requests its calls are cut to its share (36 / 9 = 4 tokens: one window, the first always
    # runs), and the turns go by tokens per request: a big turn gives its request 8 tokens, a small turn 4 to each
    # of small's requests, so small gets two turns for each of big's while its requests have windows left
    # (round-robin by turn would give big's one client twice what each small client gets).
    async def main() -> None:
        lane = ComputeLane()
        settings = SchedulerSettings(max_batch_tokens=36)
        big = Scheduler({"t": FakePipeline(8)}, settings, lane=lane)
        small = Scheduler({"t": FakePipeline(4)}, settings, lane=lane)
        calls, inside, overlaps = [], [], []
        for scheduler, name in ((big, "big"), (small, "small")):
            in_loop(scheduler, name, calls, inside, overlaps)
            await scheduler.start()
        try:
            heavy = big.submit("t", [words("heavy", 400)], {})

            async def client(index: int) -> int:
                for _ in range(6):
                    with small.incoming():  # as the server holds it, from a request's first byte to its answer
                        text = words(f"s{index}", 12)
                        assert await small.result(small.submit("t", [text], {})) == answer(4, text)
                return 6

            assert sum(await asyncio.gather(*(client(index) for index in range(8)))) == 48
            busy = len(calls)
            assert await big.result(heavy) == answer(8, words("heavy", 400))
        finally:
            await big.stop()
            await small.stop()
        assert overlaps == []  # one model's work at a time
        beside = calls[:busy]
        assert {tokens for name, tokens in beside if name == "big"} == {8}  # its slice: one window a turn
        assert [tokens for name, tokens in beside if name == "small"] == [32] * 18  # 48 requests x 3 windows / 8
        order = "".join("B" if name == "big" else "s" for name, _ in beside)
        # Per small request (3 small turns, then its clients come back): big twice, between them two small turns.
        assert order == "B" + "ssBsB" * 5 + "ssBs", order
        big_tokens = sum(tokens for name, tokens in beside if name == "big")
        assert big_tokens == 12 * 8 and 12 * 6 <= big_tokens <= 12 * 6 + 4 * 8  # about one small client's tokens
        # Alone again, big fills its calls.
        assert [tokens for _, tokens in calls[busy:]] == [32] * 9 + [400 - 12 * 8 - 9 * 32]

    asyncio.run(main())


def test_lane_round_of_turns_follows_tokens_per_request_not_turns():
    # Three seats waiting: each turn goes to the lowest tag (tokens per request so far); the one that just ran
    # competes with its new tag; equal tags go to the first to ask.
    async def main() -> list[str]:
        lane = ComputeLane()
        seats = {name: lane.seat(lambda: 1) for name in "abc"}
        order: list[str] = []
        costs = {"a": (64, 1), "b": (64, 64), "c": (16, 1)}  # (tokens, requests) of each seat's turns

        async def worker(name: str, turns: int) -> None:
            for _ in range(turns):
                async with seats[name].turn(lambda: True) as turn:
                    order.append(name)
                    turn.charge(*costs[name])
                    await asyncio.sleep(0)

        await asyncio.gather(worker("a", 3), worker("b", 12), worker("c", 6))
        return order

    order = asyncio.run(main())
    # b's turns cost 1 token per request, c's 16, a's 64: b runs 12 turns while a runs one, c four.
    assert order[:8] == ["a", "b", "c", "b", "b", "b", "b", "b"], order
    turns_of = {name: [index for index, seat in enumerate(order) if seat == name] for name in "ac"}
    assert turns_of["a"][1] > turns_of["c"][3]  # a's second turn after c's fourth: c's 64 tokens then equal a's
    assert sorted(order) == sorted("a" * 3 + "b" * 12 + "c" * 6)


def test_lane_seat_back_from_idle_starts_from_the_current_turn_and_is_owed_nothing():
    async def main() -> list[str]:
        lane = ComputeLane()
        busy, late = lane.seat(lambda: 1), lane.seat(lambda: 1)
        order: list[str] = []

        async def turns(seat, name: str, count: int) -> None:
            for _ in range(count):
                async with seat.turn(lambda: True) as turn:
                    order.append(name)
                    turn.charge(10, 1)
                    await asyncio.sleep(0)

        await turns(busy, "busy", 20)  # alone: its tag is 200 tokens
        # The late seat never ran: had it kept tag 0 it would take 20 turns in a row; it alternates instead.
        await asyncio.gather(turns(busy, "busy", 4), turns(late, "late", 4))
        return order[20:]

    assert asyncio.run(main()) == ["busy", "late"] * 4


def test_lane_single_model_takes_its_turns_without_waiting():
    # A server with one model pays nothing for the lane: its turns never wait for the event loop (a task that
    # counts the loop's turns meanwhile counts none).
    async def main() -> tuple[int, int]:
        lane = ComputeLane()
        seat = lane.seat(lambda: 1)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        before = ticks
        for _ in range(1000):
            async with seat.turn(lambda: True) as turn:
                turn.charge(100, 1)
        after = ticks
        ticker.cancel()
        return after - before, seat.turns

    assert asyncio.run(main()) == (0, 1000)


def test_lane_cancelled_waiter_and_leaving_seat_never_hold_the_lane():
    async def main() -> int:
        lane = ComputeLane()
        first, second, third = (lane.seat(lambda: 1) for _ in range(3))
        await lane.acquire(first)
        waiter = asyncio.create_task(lane.acquire(second))
        await asyncio.sleep(0)
        waiter.cancel()  # its client left while it waited
        await asyncio.sleep(0)
        lane.release(first, Turn(), False)
        await asyncio.wait_for(lane.acquire(third), 5)  # the lane came free for the next one
        lane.leave(third)  # its scheduler stopped while holding a turn
        await asyncio.wait_for(lane.acquire(first), 5)
        return first.turns

    assert asyncio.run(main()) == 2
