"""`bertforge predict` under torchrun: 2 CPU processes (gloo) write the output one process writes, byte for
byte, on a 10,000-line input; a run stopped before its merge resumes under torchrun without redoing its
finished chunks.

torchrun gives each process one intra-op thread (OMP_NUM_THREADS=1); the one-process runs get one as well,
because the thread count may change float rounding (see `inference.predict_corpus`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.unit.test_inference_predict_corpus import save_tiny_classifier

TIMEOUT_S = 300  # processes importing torch on a loaded 2-core machine
TORCHRUN = Path(sys.executable).with_name("torchrun")
LINES = 10_000


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("classifier") / "model")


def write_input(path: Path) -> Path:
    words = "a river runs past old stone walls where quiet birds sing at the first light".split()
    lines = [" ".join(words[(i * 5 + j) % len(words)] for j in range(1 + i % 6)) for i in range(LINES)]
    lines[100] = ""  # a blank line: no result
    lines[4321] = json.dumps({"text": "an object line", "id": "row-4321"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


ENV = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
       "OMP_NUM_THREADS": "1"}


def predict_command(model: Path, inputs: Path, output: Path, *launcher: str) -> list[str]:
    launcher = launcher or (sys.executable, "-m", "bertforge")
    return [*launcher, "predict", "--model", str(model), "--task", "classify", "--input", str(inputs), "--output",
            str(output), "--device", "cpu", "--chunk-lines", "1000", "--batch-size", "64"]


def predict(model: Path, inputs: Path, output: Path, *launcher: str) -> subprocess.CompletedProcess:
    return subprocess.run(predict_command(model, inputs, output, *launcher), capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=ENV, check=False)


def torchrun(processes: int) -> tuple[str, ...]:
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    return (str(TORCHRUN), "--standalone", "--nproc_per_node", str(processes), "-m", "bertforge")


def test_predict_torchrun_two_processes_write_what_one_process_writes(classifier, tmp_path):
    inputs = write_input(tmp_path / "in.txt")
    single = predict(classifier, inputs, tmp_path / "one.jsonl")
    assert single.returncode == 0, single.stderr[-3000:]
    double = predict(classifier, inputs, tmp_path / "two.jsonl", *torchrun(2))
    assert double.returncode == 0, double.stderr[-3000:]
    one = (tmp_path / "one.jsonl").read_bytes()
    assert one == (tmp_path / "two.jsonl").read_bytes()
    lines = one.decode("utf-8").splitlines()
    assert len(lines) == LINES - 1 and json.loads(lines[4320])["id"] == "row-4321"
    assert double.stderr.count(f"{LINES - 1} predictions written") == 1  # rank 0 alone prints
    assert not (tmp_path / "two.jsonl.parts").exists()


@pytest.mark.slow
def test_predict_torchrun_resumes_a_killed_run_and_never_leaves_a_partial_output(classifier, tmp_path):
    inputs = write_input(tmp_path / "in.txt")
    reference = predict(classifier, inputs, tmp_path / "one.jsonl")
    assert reference.returncode == 0, reference.stderr[-3000:]
    output = tmp_path / "killed.jsonl"
    process = subprocess.Popen(predict_command(classifier, inputs, output), env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    parts = tmp_path / "killed.jsonl.parts"
    deadline = time.monotonic() + TIMEOUT_S
    while len(list(parts.glob("chunk-*.jsonl"))) < 3:  # kill -9 in the middle of the run
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not output.exists()
    resumed = predict(classifier, inputs, output, *torchrun(2))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert output.read_bytes() == (tmp_path / "one.jsonl").read_bytes() and not parts.exists()
