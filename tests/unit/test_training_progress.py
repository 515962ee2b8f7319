"""Training progress: a tqdm bar on a terminal, periodic log lines (no carriage-return flood) elsewhere."""

from __future__ import annotations

import io
import logging

from bertforge.training.logging import Progress, duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bertforge.training"]


def test_progress_not_a_terminal_logs_a_line_every_tenth_of_the_run(caplog):
    stream, clock = io.StringIO(), FakeClock()
    progress = Progress(100, 0, True, stream=stream, every_seconds=10_000, clock=clock)
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        for _ in range(100):
            clock.now += 2.0
            progress.update(1, loss=6.5, tok_s="31200")
        progress.close()
    lines = progress_lines(caplog)
    assert len(lines) == 10
    assert lines[0] == "step 10/100 (10%) loss=6.5 tok_s=31200 elapsed 20s, ETA 3m00s"
    assert lines[-1].startswith("step 100/100 (100%) ") and lines[-1].endswith("ETA 0s")
    assert stream.getvalue() == ""  # nothing drawn: no "\r" updates in a log file


def test_progress_not_a_terminal_logs_after_every_seconds_on_a_slow_run(caplog):
    clock = FakeClock()
    progress = Progress(1000, 200, True, stream=io.StringIO(), every_seconds=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        for _ in range(10):
            clock.now += 25.0  # 10 steps in 250 s: far from a tenth of the 800 steps left
            progress.update(1, loss=2.25)
    lines = progress_lines(caplog)
    # A resumed run counts from its first step (201); lines at 75 s, 150 s and 225 s.
    assert [line.split(" (")[0] for line in lines] == ["step 203/1000", "step 206/1000", "step 209/1000"]
    assert "elapsed 1m15s, ETA 5h32m" in lines[0]


def test_progress_on_a_terminal_draws_a_bar_and_logs_nothing(caplog):
    stream = Terminal()
    progress = Progress(5, 0, True, stream=stream)
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        for _ in range(5):
            progress.update(1, loss=1.0)
        progress.close()
    assert progress_lines(caplog) == []
    assert "\r" in stream.getvalue() and "5/5" in stream.getvalue()


def test_progress_disabled_shows_nothing(caplog):
    stream = Terminal()
    progress = Progress(5, 0, False, stream=stream)
    with caplog.at_level(logging.INFO, logger="bertforge.training"):
        progress.update(5, loss=1.0)
        progress.close()
    assert stream.getvalue() == "" and progress_lines(caplog) == []


def test_progress_duration_reads_as_seconds_minutes_hours():
    assert [duration(s) for s in (0.4, 45, 125, 3 * 3600 + 7 * 60 + 30)] == ["0s", "45s", "2m05s", "3h07m"]
