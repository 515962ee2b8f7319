"""A real `kill -9` in the middle of `bertforge add`, `delete`, `compact` (and `embed` with metadata fields, and
`index`): the command runs in its own process, which sends itself SIGKILL at its k-th file-system step (every
write, rename and unlink under the folder, counted as test_retrieval_folder_growth counts them in-process; the
counting module is tests/e2e/kill_at_step/sitecustomize.py, loaded by Python at start-up). After each kill the
folder reads as the old state or the new one, never a mix: its rows are the old folder's or the changed one's, and
every search (exact, approximate through the HNSW graph, filtered by a metadata field) answers what a folder
embedded from scratch with the old records, or with the new ones, answers (ids, and scores within 1e-6). Then the
same command, run again, completes the change and leaves no file behind that an uninterrupted run does not.

The default run kills an addition at its commit (the manifest's rename; test_retrieval_folder_growth kills every
change at every step in-process); the slow run kills each change at its commit, and every command at every step (a
process start each, a few seconds on two cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertforge import storage
from bertforge.errors import ConfigError
from bertforge.retrieval import folder_growth as G
from bertforge.retrieval.embed_corpus import EmbedSettings, embed_corpus
from bertforge.retrieval.hybrid_search import folder_hits
from bertforge.retrieval.store import MANIFEST_NAME, VectorFolder
from bertforge.retrieval.vector_ann import build_ann

pytest.importorskip("faiss")
pytest.importorskip("pyarrow")

KILLER = Path(__file__).resolve().parent / "kill_at_step"
SRC = Path(__file__).resolve().parents[2] / "src"
WORDS = "apple river stone music light cloud paper green window table bread glass".split()
QUERIES = ["apple river stone", "music cloud green window", "bread glass table"]
SHARD_SIZE = 5


def text(seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, int(rng.integers(3, 9))))


def record(ident: str, seed: int) -> dict:
    return {"id": ident, "text": text(seed), "topic": "odd" if seed % 2 else "even"}


FIRST = [record(f"a{i}", i) for i in range(12)]
START = [r for r in FIRST if r["id"] != "a1"]  # the folder every change starts from: a1 deleted already
ADDED = [record("c0", 900), record("a0", 901), record("c1", 902)]  # a0 replaced
AFTER = {"add": [r for r in START if r["id"] != "a0"] + ADDED,
         "delete": [r for r in START if r["id"] not in {"a2", "a5"}],
         "compact": START}
# --missing-ok: a delete killed after its commit is run again as it was, and finds its ids gone.
CHANGES = {"add": ["add", "--input", "{added}", "--device", "cpu"],
           "delete": ["delete", "--id", "a2", "--id", "a5", "--missing-ok"],
           "compact": ["compact"]}


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def embedded(model: Path, records: list[dict], out: Path, root: Path) -> Path:
    """A folder embedded from scratch (metadata field `topic`; normalized, so that scores are cosines, where
    1e-6 lies above float32 rounding) with an HNSW graph."""
    embed_corpus(model, jsonl(root / f"{out.name}.jsonl", records), out, EmbedSettings(normalize=True),
                 shard_size=SHARD_SIZE, device="cpu", fields=["topic"])
    build_ann(out)
    return out


def searched(directory: Path) -> list:
    """Every search this test compares: exact, through the HNSW graph, and filtered to one topic."""
    found = []
    for search in ({"exact": True}, {"exact": False, "ef_search": 200}, {"exact": True, "filter": {"topic": "odd"}}):
        found.append(folder_hits(directory, QUERIES, top_k=20, device="cpu", **search))
    return found


def same(got: list, want: list) -> bool:
    """The same hits: ids in order, scores within 1e-6."""
    for got_hits, want_hits in zip(got, want, strict=True):
        for got_one, want_one in zip(got_hits, want_hits, strict=True):
            if [h["id"] for h in got_one] != [h["id"] for h in want_one]:
                return False
            if not np.allclose([h["score"] for h in got_one], [h["score"] for h in want_one], atol=1e-6, rtol=0):
                return False
    return True


def rows(directory: Path) -> tuple[int, int]:
    folder = VectorFolder(directory)
    return folder.count, folder.live_count


def leftovers(directory: Path) -> list[str]:
    """Temporary files of a dead writer (the names storage gives them)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if storage.TEMPORARY_NAME.match(p.name))


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.name != G.LOCK_NAME)


def bertforge(directory: Path, argv: list[str], kill_at: int | None = None, log: Path | None = None,
              ) -> subprocess.CompletedProcess:
    """`python -m bertforge ARGV` in a process that counts its steps under `directory` and, `kill_at`, kills
    itself with SIGKILL at that step."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(KILLER), str(SRC)]), "PYTHONDONTWRITEBYTECODE": "1",
           "BERTFORGE_KILL_ROOT": str(directory), "BERTFORGE_KILL_AT": "" if kill_at is None else str(kill_at),
           "BERTFORGE_KILL_LOG": "" if log is None else str(log)}
    return subprocess.run([sys.executable, "-m", "bertforge", *argv], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def growth(tiny_minilm_model, tmp_path_factory):
    """The start folder (embedded, indexed, a1 deleted) and the searches of folders embedded from scratch with
    the old records and with each change's new ones."""
    root = tmp_path_factory.mktemp("kill9")
    start = embedded(tiny_minilm_model, FIRST, root / "start", root)
    G.delete_records(start, ["a1"])
    added = jsonl(root / "added.jsonl", ADDED)
    references = {"old": searched(embedded(tiny_minilm_model, START, root / "scratch-old", root))}
    for change, records in AFTER.items():
        references[change] = searched(embedded(tiny_minilm_model, records, root / f"scratch-{change}", root))
    assert same(searched(start), references["old"])
    return {"root": root, "start": start, "added": added, "references": references}


def uninterrupted(growth: dict, change: str, directory: Path) -> tuple[list[str], list[str]]:
    """The change run whole on a copy of the start folder: its argv and the steps it took ("NAME PATH")."""
    shutil.copytree(growth["start"], directory)
    argv = [arg.format(added=growth["added"]) for arg in CHANGES[change]] + ["--index", str(directory)]
    log = directory.parent / f"{directory.name}.steps"
    done = bertforge(directory, argv, log=log)
    assert done.returncode == 0, done.stderr
    return argv, log.read_text(encoding="utf-8").splitlines()


def check_kills(growth: dict, change: str, tmp_path: Path, pick) -> None:
    whole = tmp_path / "whole"
    argv, steps = uninterrupted(growth, change, whole)
    references = growth["references"]
    old, new = (rows(growth["start"]), references["old"]), (rows(whole), references[change])
    assert same(searched(whole), new[1]) and old[0] != new[0] and len(steps) > 3, steps
    for k in pick(steps):
        killed = tmp_path / f"kill-{k}"
        shutil.copytree(growth["start"], killed)
        argv_k = [arg.replace(str(whole), str(killed)) for arg in argv]
        died = bertforge(killed, argv_k, kill_at=k)
        assert died.returncode == -9, f"step {k} ({steps[k]}): not killed: {died.stderr[-2000:]}"
        try:
            seen = rows(killed), searched(killed)
        except ConfigError as error:
            pytest.fail(f"kill at step {k} ({steps[k]}): the folder is unreadable ({error})")
        assert (seen[0] == old[0] and same(seen[1], old[1])) or (seen[0] == new[0] and same(seen[1], new[1])), \
            f"kill at step {k} ({steps[k]}): the folder is a mix of the old and the new (rows {seen[0]}, old " \
            f"{old[0]}, new {new[0]})"
        again = bertforge(killed, argv_k)  # the same command, run again after the kill
        assert again.returncode == 0, f"kill at step {k} ({steps[k]}): {again.stderr[-2000:]}"
        assert same(searched(killed), new[1]), f"kill at step {k} ({steps[k]}): the rerun did not finish the change"
        assert leftovers(killed) == [], f"kill at step {k} ({steps[k]})"
        if change != "add":  # a rerun add adds its records once more (new rows, the same live records)
            assert rows(killed) == new[0] and listing(killed) == listing(whole), f"kill at step {k} ({steps[k]})"
        shutil.rmtree(killed)


def at_commit(steps: list[str]) -> list[int]:
    """The manifest's rename, the change's commit: killed there, every new file is written and the old
    manifest is still in force."""
    return [next(i for i, step in enumerate(steps) if step.startswith("replace ") and
                 Path(step.split(" ", 1)[1]).name.startswith(f".{MANIFEST_NAME}.tmp-"))]


@pytest.mark.parametrize("change", ["add", *(pytest.param(change, marks=pytest.mark.slow) for change in ("delete",
                                                                                                   "compact"))])
def test_retrieval_kill9_at_the_commit_leaves_the_old_folder_and_a_rerun_finishes(change, growth, tmp_path):
    check_kills(growth, change, tmp_path, at_commit)


@pytest.mark.slow
@pytest.mark.parametrize("change", list(CHANGES))
def test_retrieval_kill9_at_every_step_leaves_the_old_folder_or_the_new(change, growth, tmp_path):
    check_kills(growth, change, tmp_path, lambda steps: range(len(steps)))


def finished_hits(directory: Path) -> list | None:
    """The exact hits of a finished folder; None where a search refuses it (no manifest, or an unfinished run)."""
    try:
        return [folder_hits(directory, QUERIES, top_k=20, device="cpu", exact=True)]
    except ConfigError:
        return None


@pytest.mark.slow
def test_retrieval_kill9_embed_with_fields_then_index_at_every_step_resumes(tiny_minilm_model, tmp_path):
    """`bertforge embed --field` killed at any step leaves a folder that searches refuse (unfinished) or the
    finished one; run again it finishes it. `bertforge index` killed at any step leaves the folder searched as
    before (exactly: no graph yet) or through its finished graph, the same hits either way; run again it
    finishes."""
    source = jsonl(tmp_path / "first.jsonl", FIRST)
    embed = ["embed", "--model", str(tiny_minilm_model), "--input", str(source), "--shard-size", str(SHARD_SIZE),
             "--field", "topic", "--normalize", "--device", "cpu", "--text-column", "text", "--id-column", "id",
             "--out"]
    whole = tmp_path / "whole"
    assert bertforge(whole, [*embed, str(whole)], log=tmp_path / "embed.steps").returncode == 0
    want = searched(embedded(tiny_minilm_model, FIRST, tmp_path / "scratch", tmp_path))
    steps = (tmp_path / "embed.steps").read_text(encoding="utf-8").splitlines()
    assert len(steps) > 3 and same([finished_hits(whole)[0]], want[:1]), steps
    for k in range(len(steps)):
        killed = tmp_path / f"embed-{k}"
        assert bertforge(killed, [*embed, str(killed)], kill_at=k).returncode == -9, f"step {k} ({steps[k]})"
        seen = finished_hits(killed)
        assert seen is None or same(seen, want[:1]), f"embed killed at step {k} ({steps[k]}): a mix"
        assert bertforge(killed, [*embed, str(killed)]).returncode == 0, f"step {k} ({steps[k]})"
        assert same(finished_hits(killed), want[:1]) and leftovers(killed) == [], f"step {k} ({steps[k]})"
        assert listing(killed) == listing(whole), f"embed killed at step {k} ({steps[k]})"
        shutil.rmtree(killed)
    indexed = tmp_path / "indexed"
    shutil.copytree(whole, indexed)
    assert bertforge(indexed, ["index", "--index", str(indexed)], log=tmp_path / "index.steps").returncode == 0
    steps = (tmp_path / "index.steps").read_text(encoding="utf-8").splitlines()
    assert steps and same(searched(indexed), want)
    for k in range(len(steps)):
        killed = tmp_path / f"index-{k}"
        shutil.copytree(whole, killed)
        assert bertforge(killed, ["index", "--index", str(killed)], kill_at=k).returncode == -9
        assert same(searched(killed), want), f"index killed at step {k} ({steps[k]})"
        assert bertforge(killed, ["index", "--index", str(killed)]).returncode == 0
        assert same(searched(killed), want) and leftovers(killed) == [], f"index killed at step {k}"
        assert listing(killed) == listing(indexed), f"index killed at step {k} ({steps[k]})"
        shutil.rmtree(killed)
