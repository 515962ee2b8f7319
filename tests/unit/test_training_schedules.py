"""Learning-rate schedules (linear, constant, wsd, one-cycle) over steps and over a time budget, and the loop
ending a run when its time budget is spent. Time is a fake clock: nothing here reads the wall clock."""

from __future__ import annotations

import logging
import math
import signal

import pytest
import torch
from test_training_loop import SyntheticSource, config_for, single_thread, tiny_model  # noqa: F401

from bertforge.errors import ConfigError
from bertforge.families.pretraining import PretrainingObjective
from bertforge.training.checkpoint import list_checkpoints
from bertforge.training.config import TrainingConfig
from bertforge.training.interrupt import TrainingInterrupted
from bertforge.training.loop import train
from bertforge.training.schedules import TimeBudgetSchedule, WarmupDecay, lr_factor


def factors(schedule, total=10, warmup=2, **kwargs):
    shape = WarmupDecay(warmup, total, schedule, **kwargs)
    return [shape(s) for s in range(total)]


def test_schedule_linear_and_constant_keep_their_values():
    assert factors("linear", warmup=4) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    assert factors("constant") == [0.5] + [1.0] * 9


def test_schedule_wsd_is_flat_then_decays_over_the_last_fraction():
    linear = factors("wsd", total=20, warmup=2, decay_ratio=0.25, decay_shape="linear")
    assert linear[:2] == [0.5, 1.0]
    assert linear[2:15] == [1.0] * 13  # stable until the last 25% (5 steps)
    assert linear[15:] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    root = factors("wsd", total=20, warmup=2, decay_ratio=0.25)  # 1-sqrt: 1 - sqrt(q) at fraction q
    assert root[15:] == pytest.approx([1 - math.sqrt(q) for q in (0.0, 0.2, 0.4, 0.6, 0.8)])
    assert all(a >= b for a, b in zip(root[15:], root[16:]))
    assert all(r <= line for r, line in zip(root[15:], linear[15:]))  # 1-sqrt decays faster at first
    assert lr_factor("wsd", 20, 21, 20, 2, 0.25) == 0.0  # past the end


def test_schedule_one_cycle_peaks_at_mid_run_and_ignores_warmup():
    shape = factors("one-cycle", total=10, warmup=0)
    assert shape == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])
    assert shape.index(max(shape)) == 4
    with pytest.raises(ConfigError, match="one-cycle rises over the first half"):
        TrainingConfig(steps=10, schedule="one-cycle", warmup_steps=3)
    assert TrainingConfig(steps=10, schedule="one-cycle").resolved_warmup(10) == 5


def test_schedule_settings_are_validated():
    with pytest.raises(ConfigError, match="decay_ratio"):
        TrainingConfig(steps=10, schedule="wsd", decay_ratio=0.0)
    with pytest.raises(ConfigError, match="decay_shape"):
        TrainingConfig(steps=10, schedule="wsd", decay_shape="cosine")
    with pytest.raises(ConfigError, match="warmup_ratio, e.g. 0.06"):
        TrainingConfig(minutes=1, warmup_steps=10)
    with pytest.raises(ConfigError, match="minutes"):
        TrainingConfig(minutes=-1)


class FakeClock:
    """Seconds that advance by `tick` at every read."""

    def __init__(self, tick: float = 1.0):
        self.now, self.tick, self.reads = 0.0, tick, 0

    def __call__(self) -> float:
        self.now += self.tick
        self.reads += 1
        return self.now


def test_time_budget_schedule_positions_steps_by_elapsed_time():
    w = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=1.0)
    clock = FakeClock(tick=10.0)  # every step takes 10 s of a 100 s budget
    schedule = TimeBudgetSchedule(optimizer, 100.0, warmup_ratio=0.2, schedule="wsd", decay_ratio=0.5,
                                  decay_shape="linear", clock=clock)
    schedule.start()
    seen = []
    while not schedule.spent:
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # Warmup over 20 s (the first step has no duration yet: lr 0), stable to 50 s, linear decay to 100 s.
    assert seen == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2])
    state = schedule.state_dict()
    assert state["elapsed_s"] == 100.0 and not any(k in state for k in ("_clock", "_agree", "_started"))
    fresh = TimeBudgetSchedule(optimizer, 100.0, 0.2, clock=FakeClock())
    fresh.load_state_dict(state)
    assert fresh.elapsed_s == 100.0 and fresh.spent  # a resumed run continues on the time it had used


def test_train_with_minutes_ends_when_the_budget_is_spent(tmp_path, caplog):
    # One clock read at the start and one per step, each 1 s later: a 0.1-minute budget is 6 steps, although
    # the source could give 40; the schedule decays on time (linear, no warmup) and the last step is saved.
    clock = FakeClock()
    config = config_for(tmp_path, steps=0, epochs=10, minutes=0.1, warmup_steps=0, warmup_ratio=0.0)
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        result = train(tiny_model(), SyntheticSource(4, 4), PretrainingObjective(), config, clock=clock)
    assert result.step == 6 and result.total_steps == 6 and clock.reads == 7
    # the run's description names the budget, not the epochs of an unlimited step count ("3.88e+09 epochs")
    described = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("training "))
    assert "0.1 minutes" in described and "epochs" not in described
    assert [s for s, _ in list_checkpoints(tmp_path)] == [6]
    lrs = [e["values"]["lr"] for e in result.history if e["split"] == "train"]
    assert lrs == pytest.approx([1e-3 * f for f in (1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6)])
    capped = train(tiny_model(), SyntheticSource(4, 4), PretrainingObjective(),
                   config_for(tmp_path / "capped", steps=3, minutes=0.1, warmup_steps=0), clock=FakeClock())
    assert capped.step == 3  # `steps` ends the run first


def test_train_with_a_cpu_budget_counts_the_process_cpu_clock_not_the_wall(tmp_path, monkeypatch, caplog):
    # budget_clock = "cpu": the schedule reads `process_cpu_seconds` (here a fake one, 1 s a read): a 0.1-minute
    # budget is 6 steps whatever the wall clock says (one read at the start, one per step).
    from bertforge.training import schedules

    cpu = FakeClock()
    monkeypatch.setattr(schedules, "process_cpu_seconds", cpu)
    config = config_for(tmp_path, steps=0, epochs=10, minutes=0.1, warmup_steps=0, warmup_ratio=0.0,
                        budget_clock="cpu")
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        result = train(tiny_model(), SyntheticSource(4, 4), PretrainingObjective(), config)
    assert result.step == 6 and cpu.reads == 7
    messages = [r.getMessage() for r in caplog.records]
    assert any("0.1 minutes of CPU time" in m for m in messages)
    assert any("time budget of 0.1 CPU min spent at step 6" in m for m in messages)
    with pytest.raises(ConfigError, match="budget_clock"):
        TrainingConfig(minutes=1, budget_clock="gpu")


def test_process_cpu_seconds_grows_with_work_done_in_threads_and_children():
    import subprocess
    import sys
    import threading

    from bertforge.training.schedules import process_cpu_seconds

    def spin(loops: int) -> None:
        total = 0
        for i in range(loops):
            total += i * i

    before = process_cpu_seconds()
    worker = threading.Thread(target=spin, args=(2_000_000,))
    worker.start()
    worker.join()
    after_thread = process_cpu_seconds()
    assert after_thread > before  # a thread's CPU time is the process's
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert process_cpu_seconds() > after_thread  # an ended child's too


def test_pretrain_budget_cpu_minutes_flag_sets_a_cpu_budget(tmp_path):
    from bertforge.cli import build_parser, pretrain_config

    def parse(*flags):
        args, extra = build_parser().parse_known_args(["pretrain", "--data", str(tmp_path), *flags])
        return pretrain_config(args, extra)

    config = parse("--budget-cpu-minutes", "5")
    assert (config.training.minutes, config.training.budget_clock) == (5.0, "cpu")
    assert parse("--minutes", "2", "--budget-clock", "cpu").training.budget_clock == "cpu"
    assert parse("--minutes", "2").training.budget_clock == "wall"
    with pytest.raises(ConfigError, match="--budget-cpu-minutes X stands for --minutes X --budget-clock cpu"):
        parse("--budget-cpu-minutes", "5", "--minutes", "3")


class InterruptedSource(SyntheticSource):
    """Sends this process SIGINT (as Ctrl-C does) while the loop fetches batch number `at` (1-based)."""

    def __init__(self, *args, at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at, self.served = at, 0

    def __iter__(self):
        for batch in super().__iter__():
            self.served += 1
            if self.served == self.at:
                signal.raise_signal(signal.SIGINT)
            yield batch


def test_train_ctrl_c_saves_the_current_step_and_resumes_exactly(tmp_path):
    full = train(tiny_model(dropout=0.1), SyntheticSource(3, 4), PretrainingObjective(),
                 config_for(tmp_path / "full", steps=6))
    config = config_for(tmp_path / "cut", steps=6)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a job started in the background
    with pytest.raises(KeyboardInterrupt) as stopped:  # (a plain one, without the fix: the test fails, not the run)
        train(tiny_model(dropout=0.1), InterruptedSource(3, 4, at=4), PretrainingObjective(), config)
    assert isinstance(stopped.value, TrainingInterrupted) and stopped.value.step == 4  # the step during which Ctrl-C came finished, and was saved
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == [4]
    assert stopped.value.checkpoint == list_checkpoints(tmp_path / "cut")[-1][1]
    assert signal.getsignal(signal.SIGINT) is before  # the run's own handler is gone again
    resumed = train(tiny_model(dropout=0.1), SyntheticSource(3, 4), PretrainingObjective(),
                    config_for(tmp_path / "cut", steps=6, resume="auto"))
    assert resumed.start_step == 4 and resumed.step == 6
    assert resumed.train["loss"] == full.train["loss"]  # bitwise: the checkpoint is of a whole step
