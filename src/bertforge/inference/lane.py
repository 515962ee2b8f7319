"""The server's one compute lane: the machine's cores shared between the served models, turn by turn.

Each served model has its own scheduler and model thread (`inference.scheduler`), and each model thread runs its
calls on every core the process may use (`engine.threads`). Two models working at once therefore oversubscribe
the cores (two teams of intra-op threads on the same CPUs, each parallel region waiting for the thread the kernel
set aside), and the operating system shares the CPUs between threads, not between requests: a model serving one
client's large request took about half of the machine from a model serving 64 clients.

`ComputeLane` is one turnstile for the whole server. A scheduler takes a turn (`Seat.turn`) for each of its steps
(building new requests' windows, one model call, decoding the answers that call completes, handing freed memory
back), so one model's work runs at a time, on every core; between models the turns follow the rule each
scheduler applies between its own requests (`inference.sharing`): every request in progress an equal share of the
tokens, whichever model serves it.

- Turns by tokens (start-time fair queuing). Each seat has a tag: the tokens its turns ran, each turn's divided by
  the requests it served (the tokens each of its requests got). When the lane comes free, the waiting seat with
  the lowest tag goes next (the first to ask among equal tags); the seat that just had its turn competes too when
  it still has work, and is counted as waiting when it asks again before the choice is made (it does, at once,
  while requests are in progress). A seat whose model had nothing to do starts again from the tag of the turn
  granted last: it is owed nothing for the time it had no work. Round-robin by turn would not do: one turn of a
  model with 64 requests of 25 tokens gives each of them 25 tokens, while a turn of a model with one request
  gives it at least one whole window (a window always runs whole: up to 512 tokens), 20 times as much.
- Steps cut to their share (`beside`): a scheduler counts the requests of the other models as sharing the
  machine when it sizes its calls (`sharing.plan_call`), so a model with one large request runs a slice of about
  `max_batch_tokens` / (requests in the server) tokens per turn while other models have requests in progress,
  instead of the whole budget (4,096 tokens of a SPLADE model: about a second of two cores) held against all of
  them; alone, it fills its calls as before.

A turn costs a server with one model nothing: nobody else ever waits, so the turn is taken and given back
without waiting. Everything here runs in the event loop of the server (no threads, no web framework): the choice
of the next turn is made there, deterministically, from the tags and the order of asking.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass


@dataclass
class Turn:
    """What one turn ran, charged to its seat as it ends: model tokens, and the requests that shared them."""

    tokens: int = 0
    requests: int = 1

    def charge(self, tokens: int, requests: int) -> None:
        self.tokens += tokens
        self.requests = max(1, requests)


class Seat:
    """One scheduler's place at the lane: its tag and how many of its requests want a share now (`demand`)."""

    def __init__(self, lane: ComputeLane, demand: Callable[[], int]):
        self.lane = lane
        self.demand = demand
        self.tag = 0.0  # the tokens each of its requests got in its turns so far (see the module docstring)
        self.idle = True  # its model had no work when its last turn ended: its tag starts afresh
        self.turns = 0  # turns granted

    def beside(self) -> int:
        """Requests of the other models that want a share of the machine now."""
        return sum(seat.demand() for seat in self.lane.seats if seat is not self)

    @contextlib.asynccontextmanager
    async def turn(self, backlogged: Callable[[], bool]) -> AsyncIterator[Turn]:
        """Hold the lane for one step of this seat's model; `backlogged()`, asked as the turn ends: whether the
        model still has work (else its next turn starts from the lane's current tag)."""
        await self.lane.acquire(self)
        turn = Turn()
        try:
            yield turn
        finally:
            self.lane.release(self, turn, backlogged())

    def __repr__(self) -> str:
        return f"Seat(tag={self.tag:g}, turns={self.turns})"


class ComputeLane:
    """The turnstile every served model's scheduler passes for each of its steps (module docstring)."""

    def __init__(self) -> None:
        self.seats: list[Seat] = []
        self.holder: Seat | None = None
        self.waiting: dict[Seat, asyncio.Future] = {}  # in the order they asked
        self.choosing = False  # the next holder is chosen once those asking at once have asked (`release`)
        self.virtual = 0.0  # the tag of the seat granted last: where a seat back from idle starts

    def seat(self, demand: Callable[[], int]) -> Seat:
        """A place for one scheduler; `demand()`: how many of its requests want a share now."""
        seat = Seat(self, demand)
        self.seats.append(seat)
        return seat

    def leave(self, seat: Seat) -> None:
        """`seat`'s scheduler stops: it waits no more, and holds nothing."""
        if seat in self.seats:
            self.seats.remove(seat)
        future = self.waiting.pop(seat, None)
        if future is not None:
            future.cancel()
        if self.holder is seat:
            self.release(seat, Turn(), False)

    async def acquire(self, seat: Seat) -> None:
        """Wait for `seat`'s turn: at once when the lane is free and nobody else waits."""
        if seat.idle:
            seat.tag, seat.idle = max(seat.tag, self.virtual), False
        if self.holder is None and not self.waiting and not self.choosing:
            self.grant(seat)
            return
        future = asyncio.get_running_loop().create_future()
        self.waiting[seat] = future
        try:
            await future
        except asyncio.CancelledError:
            if self.waiting.get(seat) is future:
                del self.waiting[seat]
            elif self.holder is seat:  # granted as it was cancelled: give the turn on
                self.release(seat, Turn(), True)
            raise

    def release(self, seat: Seat, turn: Turn, backlogged: bool) -> None:
        """`seat`'s turn ends: its tag moves by the tokens each of its requests got; the next turn is chosen
        once the event loop has run what is ready now (the seat itself, if it still has work, asks again first)."""
        seat.tag += turn.tokens / max(1, turn.requests)
        seat.idle = not backlogged
        if self.holder is seat:
            self.holder = None
        if self.waiting and not self.choosing:
            self.choosing = True
            asyncio.get_running_loop().call_soon(self.choose)

    def choose(self) -> None:
        """Grant the lane to the waiting seat with the lowest tag (the first to ask among equal ones)."""
        self.choosing = False
        for seat in [seat for seat, future in self.waiting.items() if future.done()]:
            del self.waiting[seat]  # cancelled while waiting
        if self.holder is not None or not self.waiting:
            return
        seat = min(self.waiting, key=lambda seat: seat.tag)
        self.grant(seat)
        self.waiting.pop(seat).set_result(None)

    def grant(self, seat: Seat) -> None:
        self.holder = seat
        self.virtual = max(self.virtual, seat.tag)
        seat.turns += 1


__all__ = ["ComputeLane", "Seat", "Turn"]
