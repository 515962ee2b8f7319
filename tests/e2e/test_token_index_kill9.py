"""A real `kill -9` in the middle of `bertforge index` over a multi-vector folder (the compressed token index,
retrieval/token_index.py): the command runs in its own process, which sends itself SIGKILL at its k-th file-system
step under the folder (tests/e2e/kill_at_step, as test_retrieval_kill9 uses it). After the kill the folder has no
token index (searched exactly) or the finished one, never a half-built one; the same command run again finishes
it, and its files are byte for byte those of a build never killed, with nothing left behind.

The default run kills the build in the middle (after the training and the first part, as the second part's first
file is written) and at its commit (the rename of token-index.json); the slow run kills it at every step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.unit.test_retrieval_token_index import synthetic, write_folder

from bertforge import storage
from bertforge.retrieval import token_index as T
from bertforge.retrieval.multi_vector_search import MultiVectorIndex

pytest.importorskip("faiss")

KILLER = Path(__file__).resolve().parent / "kill_at_step"
SRC = Path(__file__).resolve().parents[2] / "src"
INDEX = ["index", "--centroids", "32", "--residual", "SQ4", "--index"]


def indexing(directory: Path, kill_at: int | None = None, log: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m bertforge index` over `directory` in a process that counts its steps under it and, `kill_at`,
    kills itself with SIGKILL at that step."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(KILLER), str(SRC)]), "PYTHONDONTWRITEBYTECODE": "1",
           "BERTFORGE_KILL_ROOT": str(directory), "BERTFORGE_KILL_AT": "" if kill_at is None else str(kill_at),
           "BERTFORGE_KILL_LOG": "" if log is None else str(log)}
    return subprocess.run([sys.executable, "-m", "bertforge", *INDEX, str(directory)], env=env, capture_output=True,
                          text=True, timeout=600)


def index_bytes(directory: Path) -> dict[str, bytes]:
    """Every file of the token index: token-index.json and the folder token-index/."""
    files = [directory / T.RECORD_NAME, *sorted((directory / T.FOLDER_NAME).rglob("*"))]
    return {str(path.relative_to(directory)): path.read_bytes() for path in files if path.is_file()}


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A folder of three shards, and the same folder indexed by a build never killed (with its steps)."""
    root = tmp_path_factory.mktemp("token-kill9")
    start = write_folder(root / "start", synthetic(documents=300)[0])
    whole = root / "whole"
    shutil.copytree(start, whole)
    done = indexing(whole, log=root / "steps")
    assert done.returncode == 0, done.stderr
    steps = (root / "steps").read_text(encoding="utf-8").splitlines()
    assert len(steps) > 10 and (whole / T.RECORD_NAME).is_file()
    return {"start": start, "whole": whole, "steps": steps}


def check_kills(built: dict, tmp_path: Path, picks: list[int]) -> None:
    want, steps = index_bytes(built["whole"]), built["steps"]
    for k in picks:
        killed = tmp_path / f"kill-{k}"
        shutil.copytree(built["start"], killed)
        died = indexing(killed, kill_at=k)
        assert died.returncode == -9, f"step {k} ({steps[k]}): not killed: {died.stderr[-2000:]}"
        opened = T.open_token_index(MultiVectorIndex(killed))  # none (exact search) or the finished index
        assert opened is None or index_bytes(killed) == want, f"kill at step {k} ({steps[k]})"
        again = indexing(killed)
        assert again.returncode == 0, f"kill at step {k} ({steps[k]}): {again.stderr[-2000:]}"
        assert index_bytes(killed) == want, f"kill at step {k} ({steps[k]}): the resumed index differs"
        assert listing(killed) == listing(built["whole"]), f"kill at step {k} ({steps[k]})"
        assert not [p for p in killed.rglob("*") if storage.TEMPORARY_NAME.match(p.name)]
        shutil.rmtree(killed)


def test_token_index_kill9_mid_build_and_at_commit_resumes_to_the_same_bytes(built, tmp_path):
    steps = built["steps"]
    middle = next(i for i, step in enumerate(steps) if "cells-00001.npy" in step)
    commit = next(i for i, step in enumerate(steps) if step.startswith("replace ")
                  and Path(step.split(" ", 1)[1]).name.startswith(f".{T.RECORD_NAME}.tmp-"))
    check_kills(built, tmp_path, [middle, commit])


@pytest.mark.slow
def test_token_index_kill9_at_every_step_resumes_to_the_same_bytes(built, tmp_path):
    check_kills(built, tmp_path, list(range(len(built["steps"]))))
