"""Launching `bertforge` the way a cluster does, on localhost: torchrun "nodes" that meet through c10d
rendezvous, a plain torchrun on one node, or one process; and the small data the multi-process tests train
on (a tiny pretraining corpus, a two-class table). Shared by test_multinode, test_elastic_resume and
test_rank_failure.

Every process gets one intra-op thread (torchrun's default, OMP_NUM_THREADS=1) so the runs compare to float
rounding; the in-process runs set the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
BOOK = ROOT / "data" / "demo" / "en" / "jekyll_and_hyde.txt"
# Torch imports, rendezvous and a few dozen tiny steps per process on a loaded 2-core machine.
RUN_TIMEOUT_S = 300
NO_DROPOUT = ["--model_overrides.hidden_dropout_prob=0", "--model_overrides.attention_probs_dropout_prob=0"]


def environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(name, None)
    return env


def torchrun_path() -> str:
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    return str(TORCHRUN)


def node_command(nodes: int, node: int, port: int, run_id: str, per_node: int = 1) -> list[str]:
    """One node's torchrun line, as docs/pretraining.md shows it for a cluster."""
    return [torchrun_path(), "--nnodes", str(nodes), "--node_rank", str(node), "--nproc_per_node", str(per_node),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", run_id,
            "-m", "bertforge"]


def start_nodes(nodes: int, args: list[str], env: dict[str, str] | None = None, per_node: int = 1,
                run_id: str = "test") -> list[subprocess.Popen]:
    """`nodes` torchrun processes (one per "node", `per_node` workers each) running `bertforge args`. Node 0
    starts first and hosts the rendezvous store, as the node named by --rdzv_endpoint does on a cluster."""
    port = free_port()
    launched = []
    for node in range(nodes):
        launched.append(subprocess.Popen(node_command(nodes, node, port, run_id, per_node) + args,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         env=env or environment(), start_new_session=True))
        if node == 0:
            wait_for_port(port, launched[0])
    return launched


def wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 120) -> None:
    """Until something listens on `port` of localhost (or `process` ended, or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)


def start_standalone(processes: int, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A plain one-node torchrun of `processes` workers."""
    command = [torchrun_path(), "--standalone", "--nproc_per_node", str(processes), "-m", "bertforge", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env or environment(), start_new_session=True)


def finish(launched: list[subprocess.Popen], timeout_s: float = RUN_TIMEOUT_S) -> list[tuple[int, str]]:
    """(exit code, output) of every launched process; kills them all and fails the test past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    results = []
    try:
        for process in launched:
            output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((process.returncode, output))
    except subprocess.TimeoutExpired:
        tails = []
        for index, process in enumerate(launched):
            kill_session(process)
            output, _ = process.communicate()
            tails.append(f"--- process {index}, exit code {process.returncode}:\n{(output or '')[-3000:]}")
        # Each process's own last lines: when one died and the other waits in a collective, the cause is there.
        pytest.fail(f"the torchrun processes did not finish within {timeout_s} s\n" + "\n".join(tails))
    return results


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL a launched torchrun and its workers (torchrun starts each worker in a session of its own, so
    they are found as its descendants first)."""
    for pid in [*descendants(process.pid), process.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def run_nodes(nodes: int, args: list[str], **options) -> list[tuple[int, str]]:
    results = finish(start_nodes(nodes, args, **options))
    for code, output in results:
        assert code == 0, output[-4000:]
    return results


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_here(args: list[str]) -> None:
    """`bertforge args` in this process, with one thread like every torchrun worker."""
    with one_thread():
        assert main(args) == 0


def train_losses(out_dir: Path) -> dict[int, dict[str, float]]:
    """{step: training values} of the run's metrics.jsonl (the last event of each step wins: a resumed run
    logs its steps after the checkpoint again)."""
    events = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return {e["step"]: e["values"] for e in events if e["split"] == "train"}


def largest_difference(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]],
                       keys: tuple[str, ...]) -> float:
    assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
    return max(abs(a[step][key] - b[step][key]) for step in a for key in keys)


def beyond_tolerance(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], keys: tuple[str, ...],
                     absolute: float = 1e-6, ulps: int = 4) -> list[tuple[int, str, float]]:
    """(step, key, |delta|) where the runs differ by more than `absolute` and more than `ulps` units of the
    last place of a float32 of that size: summation order moves a loss of 7 by multiples of 4.8e-7."""
    assert sorted(a) == sorted(b) and a, (sorted(a), sorted(b))
    found = []
    for step in a:
        for key in keys:
            delta, unit = abs(a[step][key] - b[step][key]), float(np.spacing(np.float32(abs(b[step][key]))))
            if delta > max(absolute, ulps * unit):
                found.append((step, key, delta))
    return found


def make_pretraining_data(root: Path) -> Path:
    """A 500-word vocabulary and 283 training instances of up to 32 tokens (no held-out split)."""
    corpus = root / "corpus.txt"
    corpus.write_text(BOOK.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    assert main(["vocab", "--corpus", str(corpus), "--vocab-size", "500", "--out", str(root / "vocab")]) == 0
    assert main(["prepare", "--corpus", str(corpus), "--tokenizer", str(root / "vocab"), "--out", str(root / "data"),
                 "--max-seq-length", "32", "--heldout-documents", "0"]) == 0
    return root / "data"


def pretrain_args(data: Path, out: Path, steps: int, batch: int, *extra: str) -> list[str]:
    return ["pretrain", "--data", str(data), "--model", "tiny", "--out", str(out), "--steps", str(steps),
            "--batch-size", str(batch), "--device", "cpu", "--progress", "false", "--training.log_every=1",
            *NO_DROPOUT, *extra]


def make_classification_data(root: Path, rows: int = 70) -> tuple[Path, Path]:
    """A two-class table: `rows` training rows and 10 dev rows."""
    words = "a river runs past old stone walls where quiet birds sing at first light".split()
    lines = ["text\tlabel"] + [f"{' '.join(words[i % 7:i % 7 + 3 + i % 5])} {i}\t{'pos' if i % 3 else 'neg'}"
                               for i in range(rows)]
    (root / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "dev.tsv").write_text("\n".join(lines[:11]) + "\n", encoding="utf-8")
    return root / "train.tsv", root / "dev.tsv"


def finetune_args(model: Path, train: Path, dev: Path, out: Path, batch: int, *extra: str) -> list[str]:
    return ["finetune", "--format", "classification", "--train", str(train), "--dev", str(dev), "--text-a", "text",
            "--label", "label", "--model", str(model), "--out", str(out), "--batch-size", str(batch), "--device",
            "cpu", "--max-seq-length", "16", "--progress", "false", "--training.log_every=1", "--lr", "3e-4",
            "--head.classifier_dropout=0", "--evaluate-test", "false", *extra]
