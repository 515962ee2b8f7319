"""`bertforge prepare` split across processes: two `--part` processes running at the same time into one
folder (as two machines on a shared filesystem would), and two torchrun processes (RANK/WORLD_SIZE), write
the shards and index.json one process writes, byte for byte; `--merge` names a missing part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.unit.test_data_shards import directory_bytes, tiny_tokenizer, write_corpus

from bertforge.data.shards import PART_INDEX_FILE

# Eight bertforge interpreters: 4.5 min for the three tests on the shared 2-core box (load 8). The same
# splitting and merging run in-process in tests/unit/test_data_preparation_parts.py, in the default suite.
pytestmark = pytest.mark.slow

TIMEOUT_S = 300  # processes importing bertforge on a loaded 2-core machine
TORCHRUN = Path(sys.executable).with_name("torchrun")
# Small shards, so that the corpus makes several per part.
SETTINGS = ["--max-seq-length", "24", "--dupe-factor", "2", "--heldout-fraction", "0.1", "--shard-size", "1500"]


def environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def prepare_command(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "--corpus", str(tmp_path / "corpus.txt"), "--tokenizer", str(tmp_path / "vocab"), "--out",
            str(out), *SETTINGS, *extra]


def run(command: list[str], *launcher: str) -> subprocess.CompletedProcess:
    launcher = launcher or (sys.executable, "-m", "bertforge")
    return subprocess.run([*launcher, *command], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=environment(), check=False)


def shards_and_index(directory: Path) -> dict[str, bytes]:
    return {name: data for name, data in directory_bytes(directory).items() if not PART_INDEX_FILE.fullmatch(name)}


@pytest.fixture
def single(tmp_path) -> Path:
    write_corpus(tmp_path / "corpus.txt", documents=60)
    tiny_tokenizer().save_pretrained(tmp_path / "vocab")
    result = run(prepare_command(tmp_path, tmp_path / "one"))
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "one"


def test_prepare_parts_two_concurrent_processes_write_what_one_process_writes(tmp_path, single):
    out = tmp_path / "parts"
    launcher = (sys.executable, "-m", "bertforge")
    processes = [subprocess.Popen([*launcher, *prepare_command(tmp_path, out, "--part", f"{i}/2")], env=environment(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [process.communicate(timeout=TIMEOUT_S) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in outputs]
    assert shards_and_index(out) == directory_bytes(single)
    assert sum("part 0/2" in text or "part 1/2" in text for text, _ in outputs) == 2


def test_prepare_parts_torchrun_ranks_write_what_one_process_writes(tmp_path, single):
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    torchrun = (str(TORCHRUN), "--standalone", "--nproc_per_node", "2", "-m", "bertforge")
    result = run(prepare_command(tmp_path, tmp_path / "ranks"), *torchrun)
    assert result.returncode == 0, result.stderr[-3000:]
    assert shards_and_index(tmp_path / "ranks") == directory_bytes(single)


def test_prepare_parts_merge_names_a_missing_part(tmp_path, single):
    out = tmp_path / "parts"
    first = run(prepare_command(tmp_path, out, "--part", "1/2"))
    assert first.returncode == 0 and "index.json is written once every part has finished" in first.stdout
    merge = run(["prepare", "--merge", str(out)])
    assert merge.returncode == 2 and "1 of 2 parts have not finished (0/2)" in merge.stderr
    assert len(merge.stderr.strip().splitlines()) == 1
    second = run(prepare_command(tmp_path, out, "--part", "0/2"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert shards_and_index(out) == directory_bytes(single)
    again = run(["prepare", "--merge", str(out)])
    assert again.returncode == 0 and shards_and_index(out) == directory_bytes(single)
