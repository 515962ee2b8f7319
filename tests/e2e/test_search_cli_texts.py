"""What a user of `bertforge embed` / `bertforge search` sees: a progress count per model batch (not per
shard), hits with their texts or another field of the input, and `search --precision` (the queries' precision,
as docs/serving.md says)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from bertforge import cli
from bertforge.errors import ConfigError
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import query_embedding
from bertforge.retrieval import vector_search as S

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()


def write_jsonl(path: Path, count: int) -> list[dict]:
    rng = np.random.default_rng(5)
    rows = [{"id": f"doc{i}", "text": f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 20)))),
             "title": f"Title {i}"} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return rows


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, total: int, done: int) -> None:
        self.calls.append(("start", total, done))

    def advance(self, texts: int) -> None:
        self.calls.append(("advance", texts))

    def truncated(self, texts: int) -> None:  # `EmbedProgress` is told the texts cut to the window too
        self.calls.append(("truncated", texts))


def test_embed_progress_is_told_every_batch_with_the_total_up_front(tiny_minilm_model, tmp_path):
    write_jsonl(tmp_path / "c.jsonl", 11)
    bar = Recorder()
    E.embed_corpus(tiny_minilm_model, tmp_path / "c.jsonl", tmp_path / "out", device="cpu", shard_size=100,
                   batch_size=3, progress=bar)
    # one shard of 11 texts, batches of 3: four updates inside the shard, the total known before the first
    assert bar.calls[0] == ("start", 11, 0)
    assert [c[1] for c in bar.calls[1:]] == [3, 3, 3, 2]
    resumed = Recorder()  # a rerun of a finished folder embeds nothing
    E.embed_corpus(tiny_minilm_model, tmp_path / "c.jsonl", tmp_path / "out", device="cpu", shard_size=100,
                   batch_size=3, progress=resumed)
    assert resumed.calls in ([], [("start", 11, 11)])


def test_embed_cli_logs_progress_with_count_and_eta(tiny_minilm_model, tmp_path, caplog):
    write_jsonl(tmp_path / "c.jsonl", 9)
    with caplog.at_level(logging.INFO):
        assert cli.main(["embed", "--model", str(tiny_minilm_model), "--input", str(tmp_path / "c.jsonl"),
                         "--out", str(tmp_path / "out"), "--device", "cpu", "--batch-size", "2"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("text ")]
    assert lines and lines[-1].startswith("text 9/9 (100%)") and "elapsed" in lines[-1]
    assert any("ETA" in line for line in lines)


@pytest.fixture
def embedded(tiny_minilm_model, tmp_path) -> tuple[Path, list[dict]]:
    rows = write_jsonl(tmp_path / "c.jsonl", 12)
    E.embed_corpus(tiny_minilm_model, tmp_path / "c.jsonl", tmp_path / "out", device="cpu", shard_size=5, embedding=E.EmbedSettings(normalize=True))
    return tmp_path, rows


def test_search_cli_show_text_and_field_join_the_input_back(embedded, capsys):
    folder, rows = embedded
    base = ["search", "--index", str(folder / "out"), "--query", rows[7]["text"], "--top-k", "2", "--device", "cpu"]
    assert cli.main([*base, "--show-text"]) == 0
    hit = json.loads(capsys.readouterr().out)["hits"][0]
    assert hit["id"] == "doc7" and hit["text"] == rows[7]["text"]
    assert cli.main([*base, "--field", "title"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits[0]["title"] == "Title 7" and all(set(h) == {"id", "score", "title"} for h in hits)
    assert cli.main(base) == 0  # without either: ids and scores only
    assert set(json.loads(capsys.readouterr().out)["hits"][0]) == {"id", "score"}


def test_search_show_text_refuses_an_input_changed_since_embedding(embedded):
    folder, rows = embedded
    with open(folder / "c.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "new", "text": "a new line"}) + "\n")
    with pytest.raises(ConfigError, match="c.jsonl changed since it was embedded"):
        S.search_hits(folder / "out", ["fox"], show_text=True, device="cpu")


def test_search_show_text_reads_a_symlinked_input_under_its_own_name(tiny_minilm_model, tmp_path):
    # texts.txt -> lines.txt: the manifest names the file as the user did, so --show-text finds it again
    rows = write_jsonl(tmp_path / "lines.jsonl", 6)
    (tmp_path / "texts.jsonl").symlink_to(tmp_path / "lines.jsonl")
    E.embed_corpus(tiny_minilm_model, tmp_path / "texts.jsonl", tmp_path / "out", device="cpu", embedding=E.EmbedSettings(normalize=True))
    hits = S.search_hits(tmp_path / "out", [rows[2]["text"]], show_text=True, device="cpu")
    assert hits[0][0]["text"] == rows[2]["text"]


def test_search_cli_precision_is_the_queries_precision(embedded, capsys, monkeypatch):
    folder, rows = embedded
    seen = []
    real_load = query_embedding.load_pipeline  # what loads the queries' pipeline
    monkeypatch.setattr(query_embedding, "load_pipeline", lambda *a, **k: seen.append(k["precision"]) or real_load(*a, **k))
    base = ["search", "--index", str(folder / "out"), "--query", rows[3]["text"], "--top-k", "1", "--device", "cpu"]
    assert cli.main([*base, "--precision", "int8"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "doc3"
    assert cli.main(base) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "doc3"
    assert seen == ["int8", "fp32"]  # the flag, else the corpus's precision
