"""`bertforge embed` under torchrun: 2 CPU processes (gloo) write the same shards, ids and manifest as one
process, byte for byte, and a rerun under torchrun resumes what one process left unfinished.

torchrun gives each process one intra-op thread (OMP_NUM_THREADS=1); the one-process runs here get one as
well, because the thread count may change float rounding (see `retrieval.embed_corpus`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TIMEOUT_S = 300  # two workers importing torch on a loaded 2-core machine
TORCHRUN = Path(sys.executable).with_name("torchrun")
WORDS = "a river runs past old stone walls where quiet birds sing at the first light of a cold morning".split()


def corpus(path: Path, count: int) -> Path:
    rng = np.random.default_rng(7)
    lines = [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(2, 25)))) for i in range(count)]
    lines[10:10] = ["", ""]  # blank lines: counted in ids, not records
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def embed(model: Path, inputs: Path, out: Path, *launcher: str, shard_size: int = 7) -> subprocess.CompletedProcess:
    command = [*launcher, "embed", "--model", str(model), "--input", str(inputs), "--out", str(out), "--device",
               "cpu", "--shard-size", str(shard_size), "--batch-size", "4", "--normalize"]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), check=False)


def torchrun(processes: int) -> tuple[str, ...]:
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    return (str(TORCHRUN), "--standalone", "--nproc_per_node", str(processes), "-m", "bertforge")


def output(out: Path) -> dict[str, bytes]:
    """Every file of an output folder (shards, ids, records, manifest) by relative path."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_embed_corpus_two_torchrun_processes_write_what_one_process_writes(tiny_minilm_model, tmp_path):
    inputs = corpus(tmp_path / "corpus.txt", 60)  # 9 shards of 7: rank 0 takes 5, rank 1 takes 4
    single = embed(tiny_minilm_model, inputs, tmp_path / "one", sys.executable, "-m", "bertforge")
    assert single.returncode == 0, single.stderr[-3000:]
    double = embed(tiny_minilm_model, inputs, tmp_path / "two", *torchrun(2))
    assert double.returncode == 0, double.stderr[-3000:]
    one, two = output(tmp_path / "one"), output(tmp_path / "two")
    assert sorted(one) == sorted(two) and len([n for n in one if n.startswith("vectors-")]) == 9
    assert one == two  # vectors, ids, shard records and manifest, byte for byte
    assert "60 vectors" in double.stderr and double.stderr.count("60 vectors") == 1  # rank 0 alone prints


def test_embed_corpus_torchrun_resumes_a_run_one_process_left_unfinished(tiny_minilm_model, tmp_path):
    inputs = corpus(tmp_path / "corpus.txt", 40)
    whole = embed(tiny_minilm_model, inputs, tmp_path / "whole", sys.executable, "-m", "bertforge")
    assert whole.returncode == 0, whole.stderr[-3000:]
    partial = tmp_path / "partial"
    shutil.copytree(tmp_path / "whole", partial)
    for name in ("vectors-00002.npy", "progress/shard-00002.json", "progress/shard-00005.json"):
        (partial / name).unlink()
    manifest = (partial / "manifest.json").read_text(encoding="utf-8").replace('"complete": true', '"complete": false')
    (partial / "manifest.json").write_text(manifest, encoding="utf-8")
    resumed = embed(tiny_minilm_model, inputs, partial, *torchrun(2))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert output(partial) == output(tmp_path / "whole")
