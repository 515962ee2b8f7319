"""Folders that grow and shrink (`bertforge add`, `delete`, `compact`): after adding, replacing and deleting
records, every kind of search (exact, approximate, sparse, hybrid) answers what a folder embedded from scratch
with the same records answers (ids, and scores within 1e-6), before and after compaction; an addition with
another model or settings is refused naming what differs; a change killed at any file-system step leaves the
old folder or the new one, and the next change finishes cleanly.

A kill is simulated in-process as in test_checkpoint_faults: every write, rename and unlink is counted and from
step k on raises `Killed`, a BaseException nothing in the package catches, so what is on disk is what a kill -9
at that instant leaves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bertforge import storage
from bertforge.errors import ConfigError
from bertforge.retrieval import folder_growth as G
from bertforge.retrieval.embed_corpus import EmbedSettings, embed_corpus
from bertforge.retrieval.hybrid_search import folder_hits, hybrid_search_hits
from bertforge.retrieval.searcher import Searcher
from bertforge.retrieval.store import VectorFolder

faiss = pytest.importorskip("faiss")

WORDS = "apple river stone music light cloud paper green window table bread glass".split()
QUERIES = ["apple river stone", "music cloud green window", "bread glass table", "paper light"]


def text(seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, int(rng.integers(3, 9))))


def jsonl(path: Path, records: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in records), encoding="utf-8")
    return path


FIRST = [(f"a{i}", text(i)) for i in range(30)]
ADDED = [(f"b{i}", text(100 + i)) for i in range(9)] + [("a3", text(500))]  # a3 replaced
DELETED = ["a5", "a7", "b2"]
FINAL = [(i, t) for i, t in FIRST if i not in {"a3", "a5", "a7"}] + [(i, t) for i, t in ADDED if i != "b2"]


def same_hits(got: list, want: list) -> None:
    for got_hits, want_hits in zip(got, want, strict=True):
        assert [hit["id"] for hit in got_hits] == [hit["id"] for hit in want_hits]
        np.testing.assert_allclose([hit["score"] for hit in got_hits], [hit["score"] for hit in want_hits],
                                   atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def folders(tiny_minilm_model, tiny_sparse_model, tmp_path_factory):
    """Dense and sparse folders grown (embed, add, delete) and the same records embedded from scratch."""
    root = tmp_path_factory.mktemp("growth")
    first, added, final = jsonl(root / "a.jsonl", FIRST), jsonl(root / "b.jsonl", ADDED), jsonl(root / "f.jsonl",
                                                                                                 FINAL)
    made = {}
    for kind, model, settings in (("dense", tiny_minilm_model, EmbedSettings(normalize=True)),
                                  ("sparse", tiny_sparse_model, EmbedSettings(sparse=True))):
        grown, scratch = root / f"{kind}-grown", root / f"{kind}-scratch"
        embed_corpus(model, first, grown, settings, shard_size=8, device="cpu")
        embed_corpus(model, final, scratch, settings, shard_size=8, device="cpu")
        if kind == "dense":
            G.update_indexes(grown)  # no index yet: nothing to do
            from bertforge.retrieval.vector_ann import build_ann

            build_ann(grown)
            build_ann(scratch)
        done = G.add_records(grown, added, device="cpu")
        assert (done["added"], done["replaced"]) == (10, 1)
        done = G.delete_records(grown, DELETED)
        assert (done["deleted"], done["rows"], done["live"]) == (3, 3, len(FINAL))
        made[kind] = (grown, scratch)
    return made


def test_folder_growth_inverted_index_after_an_add_equals_one_built_from_every_shard(folders, caplog):
    from bertforge.retrieval.sparse_search import SparseIndex, build_inverted

    sparse, _ = folders["sparse"]
    index = SparseIndex(sparse)
    with caplog.at_level("WARNING"):
        saved = index.inverted()  # the one the addition merged and saved: loaded, not built again
    assert "building the inverted index again" not in caplog.text
    whole = build_inverted(index)
    for name in ("term_ptr", "rows", "weights"):
        np.testing.assert_array_equal(np.asarray(getattr(saved, name)), getattr(whole, name))


def test_folder_growth_every_search_equals_a_folder_embedded_from_scratch(folders):
    (dense, dense_ref), (sparse, sparse_ref) = folders["dense"], folders["sparse"]
    for compacted in (False, True):
        for exact in (True, False):  # exact scan, and the HNSW graph extended by the addition
            hits = folder_hits(dense, QUERIES, top_k=len(FINAL), device="cpu", exact=exact,
                               **({} if exact else {"ef_search": 200}))
            want = folder_hits(dense_ref, QUERIES, top_k=len(FINAL), device="cpu", exact=True)
            same_hits(hits, want)
            assert len(hits[0]) == len(FINAL)  # k hits though rows are deleted: the top-k of the live rows
        same_hits(folder_hits(sparse, QUERIES, top_k=10, device="cpu"),
                  folder_hits(sparse_ref, QUERIES, top_k=10, device="cpu"))
        same_hits(hybrid_search_hits(dense, sparse, QUERIES, top_k=10, device="cpu"),
                  hybrid_search_hits(dense_ref, sparse_ref, QUERIES, top_k=10, device="cpu"))
        texts = folder_hits(dense, QUERIES[:1], top_k=len(FINAL), device="cpu", exact=True, show_text=True)[0]
        assert {hit["id"]: hit["text"] for hit in texts} == dict(FINAL)  # each row's text, from its own input
        if not compacted:
            for directory in (dense, sparse):
                assert G.compact_folder(directory)["dropped"] == 4  # a3's old row, a5, a7, b2
            assert VectorFolder(dense).count == VectorFolder(dense).live_count == len(FINAL)


def test_folder_growth_refuses_another_model_or_settings_naming_it(folders, tiny_sparse_model, tmp_path):
    dense, _ = folders["dense"]
    before = sorted(p.name for p in dense.iterdir())
    manifest = (dense / "manifest.json").read_bytes()
    extra = jsonl(tmp_path / "c.jsonl", [("c0", "apple")])
    with pytest.raises(ConfigError, match="pooling 'mean' -> 'cls'"):
        G.add_records(dense, extra, embedding={"pooling": "cls"}, device="cpu")
    with pytest.raises(ConfigError, match="another model"):
        G.add_records(dense, extra, model=tiny_sparse_model, device="cpu")
    with pytest.raises(ConfigError, match="no record of id 'nope'"):
        G.delete_records(dense, ["a0", "nope"])
    assert (dense / "manifest.json").read_bytes() == manifest
    assert sorted(p.name for p in dense.iterdir()) == before


# --- kills ----------------------------------------------------------------------------------------------------

class Killed(BaseException):
    """The process died at this step."""


class Faults:
    """Counts the file-system steps of a change and kills it at step `kill_at`."""

    def __init__(self, monkeypatch, kill_at: int | None = None):
        self.kill_at, self.dead, self.steps = kill_at, False, []
        for owner, name in ((os, "replace"), (os, "rename"), (os, "unlink")):
            monkeypatch.setattr(owner, name, self.step(name, getattr(owner, name)))
        monkeypatch.setattr(Path, "unlink", self.step("unlink", Path.unlink))
        monkeypatch.setattr(storage, "open", self.step("open", open), raising=False)

    def step(self, name, function):
        def counted(*args, **kwargs):
            if self.dead:
                raise Killed(name)
            if self.kill_at == len(self.steps):
                self.dead = True
                raise Killed(name)
            self.steps.append(name)
            return function(*args, **kwargs)

        return counted


def vector_hits(directory: Path, queries: np.ndarray) -> list:
    """The folder's rows, and the exact and approximate hits of fixed query vectors (no model): a compaction
    changes the rows only."""
    folder = VectorFolder(directory)
    out: list = [folder.count, folder.live_count]
    for exact in (True, False):
        searcher = Searcher(directory, exact=exact)
        out.append(searcher.search({"dense": queries}, 12, **({} if exact else {"ef_search": 200})))
    return out


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.name != G.LOCK_NAME)


@pytest.mark.parametrize("change", ["add", "delete", "compact"])
def test_folder_growth_killed_at_every_step_leaves_the_old_folder_or_the_new(change, folders, monkeypatch,
                                                                             tmp_path, tiny_minilm_model):
    import shutil

    start = tmp_path / "start"
    shutil.copytree(folders["dense"][1], start)  # a folder with an HNSW graph
    extra = jsonl(tmp_path / "c.jsonl", [("c0", text(900)), ("a0", text(901)), ("c1", text(902))])
    G.delete_records(start, ["a1"])

    def run(directory: Path) -> None:
        if change == "add":
            G.add_records(directory, extra, device="cpu")
        elif change == "delete":
            G.delete_records(directory, ["a2", "b0"])
        else:
            G.compact_folder(directory)

    queries = np.random.default_rng(0).standard_normal((3, VectorFolder(start).dim)).astype(np.float32)
    old = vector_hits(start, queries)
    whole = tmp_path / "whole"
    shutil.copytree(start, whole)
    with monkeypatch.context() as patched:
        faults = Faults(patched)
        run(whole)
    steps = len(faults.steps)
    new = vector_hits(whole, queries)
    assert new[:2] != old[:2] and steps > 3, (new[:2], old[:2], faults.steps)
    for k in range(steps):
        killed = tmp_path / f"kill-{k}"
        shutil.copytree(start, killed)
        with monkeypatch.context() as patched:
            Faults(patched, kill_at=k)
            with pytest.raises(Killed):
                run(killed)
        seen = vector_hits(killed, queries)
        assert seen in (old, new), f"kill at step {k} ({faults.steps[k]}): a mix of the old and new folder"
        if seen == old:
            run(killed)  # the change, done again after the kill
        else:
            G.delete_records(killed, ["zz"], missing_ok=True)  # any next change sweeps what the dead one left
        assert vector_hits(killed, queries) == new, f"kill at step {k}"
        assert listing(killed) == listing(whole), f"kill at step {k}: files left behind"


def test_folder_growth_commands_add_delete_compact(tiny_minilm_model, tmp_path, capsys):
    from bertforge import cli

    embed_corpus(tiny_minilm_model, jsonl(tmp_path / "a.jsonl", FIRST[:12]), tmp_path / "v", shard_size=5,
                 device="cpu")
    extra = jsonl(tmp_path / "b.jsonl", ADDED[:3])
    index = ["--index", str(tmp_path / "v")]
    assert cli.main(["add", *index, "--input", str(extra), "--device", "cpu"]) == 0
    assert "added 3 records (0 replacing records of the same id)" in capsys.readouterr().err
    (tmp_path / "gone.txt").write_text("a1\nb0\n", encoding="utf-8")
    assert cli.main(["delete", *index, "--ids-file", str(tmp_path / "gone.txt"), "--id", "a2"]) == 0
    assert "deleted 3 records (3 rows): 12 live rows of 15" in capsys.readouterr().err
    assert cli.main(["delete", *index, "--id", "a1"]) == 2  # deleted already: one line naming it
    assert "holds no record of id 'a1'" in capsys.readouterr().err
    assert cli.main(["add", *index, "--input", str(extra), "--pooling", "cls", "--device", "cpu"]) == 2
    assert "pooling 'mean' -> 'cls'" in capsys.readouterr().err
    assert cli.main(["compact", *index]) == 0
    assert "dropped 3 deleted rows: 12 rows" in capsys.readouterr().err
    ids = {hit["id"] for hit in folder_hits(tmp_path / "v", ["apple"], top_k=20, device="cpu")[0]}
    assert ids == {i for i, _ in FIRST[:12] + ADDED[:3]} - {"a1", "a2", "b0"}
