"""How the scheduler shares the model between the requests in progress: the pace each is guaranteed, so what
is admitted finishes in time whatever arrives after it, and the equal share of the rest of every call.

Pure functions over the jobs (`inference.jobs.Job`), the recent speed (`admission.Throughput`) and a time
given by the caller: `Scheduler.plan` and `Scheduler.pace_refusal` call them with the event loop's clock, the
tests with one that moves with the work done.

- **Pace** (`pace_refusal`, `plan_call`): a request is admitted with a pace, its tokens over `PACE_MARGIN` of
  its deadline, at most `max_request_share` of the recent speed of full calls (larger: "too_large", 413 with
  the numbers, idle server or not), and the paces of the requests in progress add up to at most
  `RESERVED_SHARE` of it (more: "busy", retry when enough of them will have finished, `pace_freed_after`).
  Before each call, a request that has fallen a window behind its pace line takes windows until it is back
  on it. So the largest request one client may send takes about `max_request_share` of the model from the
  others while they are busy (alone, the equal share gives it every call), and it finishes in time.
- **Equal share** (`plan_call`): the rest of each call is shared equally between the requests in progress,
  each request one share however many windows it has (a share belongs to a request, not to a client: see
  `inference.scheduler`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from bertforge.inference.admission import PACE_MARGIN, RESERVED_SHARE, Throughput
from bertforge.inference.jobs import Job, JobFailed, SchedulerSettings, Step, retry_after


def reserved(running: Sequence[Job]) -> float:
    """Tokens per second guaranteed to the requests in progress together (their `Job.pace`)."""
    return sum(job.pace for job in running)


def pace_refusal(running: Sequence[Job], throughput: Throughput, settings: SchedulerSettings, now: float,
                 tokens: int, counted: str, seconds: float | None = None) -> JobFailed | None:
    """Why a request of `tokens` tokens is not admitted now, or None: too large to finish in time at the pace
    one request is guaranteed ("too_large"), or, with `seconds` of planned time (`PACE_MARGIN` of its
    deadline) left, needing a pace over that share or beyond what the paces of the requests in progress
    leave (`RESERVED_SHARE`, or the share one request may have if larger): "busy", retry when enough of them
    will have finished."""
    timeout, share = settings.request_timeout_s, settings.max_request_share
    speed = throughput.full_tokens_per_s
    if not timeout or speed is None:
        return None
    too_large = throughput.size_refusal(tokens, timeout, share, counted)
    if too_large is not None:
        return JobFailed("too_large", too_large)
    planned = timeout * PACE_MARGIN if seconds is None else seconds
    pace = tokens / planned if planned > 0 else math.inf
    if pace > share * speed:
        return JobFailed("busy", f"server busy: the request waited until too little of its deadline "
                                 f"({timeout:g} s, request_timeout_s) was left to run its {tokens} tokens; "
                                 "retry shortly", retry_after(None))
    held = reserved(running)
    free = max(RESERVED_SHARE, share) * speed - held
    if pace <= free or not tokens:  # (no tokens: not counted yet, it is checked again once windowed)
        return None
    wait = pace_freed_after(running, now, pace - free)
    return JobFailed("busy", f"server busy: the requests in progress are guaranteed {held:.0f} of the model's "
                             f"{speed:.0f} tokens/s, so this one's {tokens} tokens cannot be guaranteed the "
                             f"{pace:.0f} tokens/s that finish them in time; retry in {retry_after(wait)} s, when "
                             "enough of them will have finished", retry_after(wait))


def pace_freed_after(running: Sequence[Job], now: float, needed: float) -> float | None:
    """Seconds until the requests in progress that finish first, each at latest at the end of its pace, free
    `needed` tokens per second of guaranteed pace (None: they never do)."""
    freed = 0.0
    for end, pace in sorted((job.admitted + sum(job.tokens) / job.pace, job.pace) for job in running if job.pace):
        freed += pace
        if freed >= needed:
            return max(0.0, end - now)
    return None


def position(job: Job) -> float:
    """Where `job` stands against its equal share: the share clock when it was admitted plus its tokens run
    (below the clock: owed tokens; above: ahead of its share)."""
    return job.start + job.served


def plan_call(running: Sequence[Job], clock: float, settings: SchedulerSettings, throughput: Throughput,
              now: float, incoming: int = 0) -> tuple[Step, float]:
    """(the next model call, the share clock it starts from): first the windows a request needs to keep its
    guaranteed pace, then the model's tokens shared equally between the requests in progress.

    Pace: a request whose pace line by the end of this call (its pace times the time since it was admitted
    plus one full call at the recent speed of full calls) is a whole window or more ahead of the tokens it has
    run takes windows until it is back on its line; those furthest behind (in seconds) first.

    Equal share: the clock moves by each call's tokens divided by the requests in progress (`Scheduler
    .run_step`), so it counts what each of them would have run had every call been split equally; it is never
    below the request furthest behind (one that ran ahead by its pace is owed nothing, and alone it fills the
    call). Requests furthest behind their share come first (`position`; a new one before a started one at the
    same place), each giving windows in its own order while its position is below the clock plus an equal part
    of the budget (`max_batch_tokens` / requests) and they fit in `max_batch_tokens`. The requests counted are
    those in progress and those on their way in (`incoming`: being read, parsed or queued; under a closed-loop
    load the queue is empty just after each call, while the clients' next requests are still being read, and
    a large request then counted alone filled a whole call that every one of them waited for). A request
    alone (nobody on the way in either) fills the budget; beside short requests, a long one's window runs only when its share (or its pace) has caught up,
    so the calls they wait for stay short instead of filled with its windows. The first window always runs:
    a window larger than the budget still runs (alone), and nobody waits for ever.
    """
    shared, budget = max(len(running), incoming), settings.max_batch_tokens
    clock = max(clock, min(position(job) for job in running))
    speed = throughput.full_tokens_per_s
    horizon = now + (budget / speed if speed else 0.0)

    def line(job: Job) -> float:  # the tokens its pace has it run by the end of this call
        return job.pace * (horizon - job.admitted)

    behind = sorted((job for job in running if job.pace and line(job) - job.served >= job.tokens[job.todo[0]]),
                    key=lambda job: (job.served - line(job)) / job.pace)
    order = sorted(running, key=lambda job: (position(job), job.served > 0, job.arrival))
    key = (behind or order)[0].key
    parts: dict[Job, list[int]] = {}
    room = budget

    def take(job: Job, full: Callable[[float, int], bool]) -> None:
        """Windows of `job` in its order until `full(tokens it will have run, next window's tokens)` or the
        budget is; the call's first window in any case."""
        nonlocal room
        taken = parts.setdefault(job, [])
        reached = job.served + sum(job.tokens[index] for index in taken)
        for index in job.todo[len(taken):]:
            tokens = job.tokens[index]
            if any(parts.values()) and (tokens > room or full(reached, tokens)):
                break
            taken.append(index)
            room -= tokens
            reached += tokens

    for job in behind:
        if job.key == key and (settings.micro_batching or not any(parts.values())):
            end = line(job)
            take(job, lambda reached, tokens, end=end: reached + tokens > end)
    level = clock + budget / shared
    for job in order:
        if room <= 0 or (not settings.micro_batching and any(parts.values())):
            break
        if job.key == key:  # a window while its position (`start` + tokens run) is below the level
            take(job, lambda reached, tokens, job=job: job.start + reached >= level)
    return Step([(job, taken) for job, taken in parts.items() if taken], shared), clock
