"""`bertforge mine-negatives --corpus` under torchrun: 2 CPU processes (gloo) embed the corpus and mine the pairs'
shards between them and write the same triplets, byte for byte, as one process.

torchrun gives each process one intra-op thread (OMP_NUM_THREADS=1); the one-process run gets one as well,
because the thread count may change float rounding (see `retrieval.embed_corpus`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 300  # two workers importing torch on a loaded 2-core machine
TORCHRUN = Path(sys.executable).with_name("torchrun")
WORDS = "a river runs past old stone walls where quiet birds sing at the first light of a cold morning".split()


def environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def torchrun(processes: int) -> tuple[str, ...]:
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    return (str(TORCHRUN), "--standalone", "--nproc_per_node", str(processes), "-m", "bertforge")


def mine(model: Path, pairs: Path, corpus: Path, out: Path, *launcher: str) -> subprocess.CompletedProcess:
    command = [*launcher, "mine-negatives", "--model", str(model), "--train", str(pairs), "--corpus", str(corpus),
               "--out", str(out), "--device", "cpu", "--batch-size", "4", "--shard-size", "3", "--relative-margin",
               "0", "--num-negatives", "2", "--sampling", "random", "--range-max", "10"]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), check=False)


@pytest.mark.slow  # about 22 s on a loaded 2-core machine (two workers importing torch)
def test_mine_corpus_two_torchrun_processes_write_what_one_process_writes(tiny_minilm_model, tmp_path):
    lines = [" ".join(WORDS[(i * 7) % 11:(i * 7) % 11 + 3 + i % 6]) + f" {i}" for i in range(40)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pairs = tmp_path / "pairs.jsonl"  # 11 pairs: 4 shards of 3, rank 0 takes 2, rank 1 takes 2
    pairs.write_text("".join(json.dumps({"anchor": f"where do birds sing {i}?", "positive": lines[3 * i]}) + "\n"
                             for i in range(11)), encoding="utf-8")
    single = mine(tiny_minilm_model, pairs, corpus, tmp_path / "one.tsv", sys.executable, "-m", "bertforge")
    assert single.returncode == 0, single.stderr[-3000:]
    double = mine(tiny_minilm_model, pairs, corpus, tmp_path / "two.tsv", *torchrun(2))
    assert double.returncode == 0, double.stderr[-3000:]
    one = (tmp_path / "one.tsv").read_bytes()
    assert one == (tmp_path / "two.tsv").read_bytes()
    assert one.count(b"\n") == 1 + 22  # header, 2 negatives for each of the 11 pairs
    assert double.stderr.count("rows written to") == 1  # rank 0 alone reports
    assert not (tmp_path / "two.tsv.parts").exists()
