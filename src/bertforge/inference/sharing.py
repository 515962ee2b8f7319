"""How the scheduler shares the model between the requests in progress: each request an equal share of the
model's tokens, however many windows it has, so one request's size never locks the others out (and, with the
requests of the other served models counted, `inference.lane`, one model's request never locks out another's).

Pure functions over the jobs (`inference.jobs.Job`): `Scheduler.plan` calls `plan_call` before each model
call. Nothing here depends on how fast the model runs: the share is counted in tokens, so what a request
gets of a call is the same on an idle and on a busy machine (a share belongs to a request, not to a client:
see `inference.scheduler`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bertforge.inference.jobs import Job, SchedulerSettings, Step


def position(job: Job) -> float:
    """Where `job` stands against its equal share: the share clock when its windows were built plus its tokens
    run (below the clock: owed tokens; above: ahead of its share)."""
    return job.start + job.served


def plan_call(running: Sequence[Job], clock: float, settings: SchedulerSettings, incoming: int = 0,
              beside: int = 0) -> tuple[Step, float]:
    """(the next model call, the share clock it starts from): the model's tokens shared equally between the
    requests in progress.

    The clock moves by each call's tokens divided by the requests sharing it (`Scheduler.run_step`), so it
    counts what each of them would have run had every call been split equally; it is never below the request
    furthest behind (alone, a request fills the call). Requests furthest behind their share come first
    (`position`; a new one before a started one at the same place), and the call holds only requests with the
    task and parameters of the first. Each gives windows in its own order while its position is below the
    clock plus an equal part of the budget (`max_batch_tokens` / requests) and they fit in `max_batch_tokens`.

    The requests counted are those in progress and those on their way in (`incoming`: being read, parsed or
    queued; under a closed-loop load the queue is empty just after each call while the clients' next requests
    are still being read, and a large request then counted alone filled a whole call that every one of them
    waited for). A request alone (nobody on the way in either) fills the budget; beside short requests, a
    long one's window runs only when its share has caught up, so the calls they wait for stay short instead
    of filled with its windows. The first window always runs: a window larger than the budget still runs
    (alone), and nobody waits for ever.

    `beside`: the requests of the other models served by the same server that want a share of the machine now
    (`inference.lane`): they count in the equal part of the budget each request may run in this call, so a
    model with one large request runs a slice of its share per turn while another model serves many requests,
    instead of a whole budget that holds the machine against all of them. They do not move this model's clock
    (the step's `shared`: the requests of this model, which share its calls).
    """
    shared, budget = max(len(running), incoming), settings.max_batch_tokens
    clock = max(clock, min(position(job) for job in running))
    order = sorted(running, key=lambda job: (position(job), job.served > 0, job.arrival))
    key = order[0].key
    parts: dict[Job, list[int]] = {}
    room = budget

    def take(job: Job, full: Callable[[float], bool]) -> None:
        """Windows of `job` in its order until `full(tokens it will have run)` or the budget is; the call's
        first window in any case."""
        nonlocal room
        taken = parts.setdefault(job, [])
        reached = job.served + sum(job.tokens[index] for index in taken)
        for index in job.todo[len(taken):]:
            tokens = job.tokens[index]
            if any(parts.values()) and (tokens > room or full(reached)):
                break
            taken.append(index)
            room -= tokens
            reached += tokens

    level = clock + budget / (shared + beside)
    for job in order:
        if room <= 0 or (not settings.micro_batching and any(parts.values())):
            break
        if job.key == key:  # a window while its position (`start` + tokens run) is below the level
            take(job, lambda reached, job=job: job.start + reached >= level)
    return Step([(job, taken) for job, taken in parts.items() if taken], shared), clock
