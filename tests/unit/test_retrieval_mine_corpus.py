"""`bertforge mine-negatives --corpus` on a tiny model: candidates from a corpus file besides the pairs' positives,
never the anchor or one of its positives (whitespace aside) nor a repeat, shards resumed after an interruption
with the same bytes, a changed setting refused, the corpus's vectors kept and reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.retrieval import embed_corpus, mine_corpus

PAIRS = [("How old is the universe?", "The universe is about 13.8 billion years old."),
         ("Where do pandas live?", "Giant pandas live in the mountains of central China."),
         ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."),
         ("Who wrote Hamlet?", "Shakespeare wrote Hamlet around 1600."),
         ("What do bees make?", "Bees make honey from the nectar of flowers.")]
CORPUS = ["Rivers carry water to the sea.",
          "  Bees make honey   from the nectar\tof flowers. ",  # pair 5's positive, spaced differently
          "Who wrote Hamlet?",  # an anchor
          "Mountains are formed by tectonic forces.",
          "Rivers carry water to the sea.",  # a repeat
          "Shakespeare wrote Hamlet around 1600.",  # pair 4's positive: also pair 3's anchor's
          "Paris is the capital of France.",
          "Stars are born in clouds of gas."]


def same_text(text: str) -> str:
    return " ".join(text.split())


def write_inputs(root: Path) -> tuple[Path, Path]:
    pairs, corpus = root / "pairs.tsv", root / "corpus.jsonl"
    pairs.write_text("anchor\tpositive\n" + "".join(f"{a}\t{p}\n" for a, p in PAIRS), encoding="utf-8")
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "body": t}) + "\n" for i, t in enumerate(CORPUS)),
                      encoding="utf-8")
    return pairs, corpus


def mine(model: Path, pairs: Path, corpus: Path, out: Path, *extra: str) -> int:
    return main(["mine-negatives", "--model", str(model), "--train", str(pairs), "--corpus", str(corpus),
                 "--text-field", "body", "--out", str(out), "--device", "cpu", "--relative-margin", "0",
                 "--batch-size", "2", *extra])


def test_mine_corpus_never_takes_the_anchor_its_positives_or_a_repeat(tiny_minilm_model, tmp_path, capsys):
    pairs, corpus = write_inputs(tmp_path)
    out = tmp_path / "triplets.jsonl"
    # Every candidate left in range becomes a negative: the exclusions are all that decides the sets.
    assert mine(tiny_minilm_model, pairs, corpus, out, "--num-negatives", "12", "--range-max", "20") == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    everything = {same_text(t) for t in CORPUS} | {p for _, p in PAIRS}
    for anchor, positive in PAIRS:
        negatives = [r["negative"] for r in rows if (r["anchor"], r["positive"]) == (anchor, positive)]
        own = {p for a, p in PAIRS if a == anchor} | {anchor}
        assert len(negatives) == len(set(map(same_text, negatives)))  # no repeat
        assert {same_text(n) for n in negatives} == everything - own
    err = capsys.readouterr().err
    assert "5 pairs, corpus of 13 texts" in err and "skipped as equal" in err
    assert not (tmp_path / "triplets.jsonl.parts").exists()  # merged, then removed
    assert (tmp_path / "triplets.jsonl.corpus-vectors" / "manifest.json").is_file()  # kept for the next mining
    without = tmp_path / "corpus_only.jsonl"
    assert mine(tiny_minilm_model, pairs, corpus, without, "--num-negatives", "12", "--range-max", "20",
                "--no-positives") == 0
    negatives = {same_text(json.loads(line)["negative"]) for line in without.read_text(encoding="utf-8").splitlines()}
    assert "Giant pandas live in the mountains of central China." not in negatives  # a positive, not in the corpus
    assert negatives <= {same_text(t) for t in CORPUS}


def test_mine_corpus_resumes_an_interrupted_run_with_the_same_bytes(tiny_minilm_model, tmp_path, monkeypatch):
    pairs, corpus = write_inputs(tmp_path)
    settings = ("--shard-size", "2", "--sampling", "random", "--num-negatives", "2", "--seed", "5")
    whole = tmp_path / "whole.tsv"
    assert mine(tiny_minilm_model, pairs, corpus, whole, *settings) == 0  # 3 shards: 2, 2 and 1 pairs
    mined_shards = []
    real_mine_shard, real_write_shard = mine_corpus.mine_shard, mine_corpus.write_shard

    def counting(pairs, index, *args):
        mined_shards.append(index)
        return real_mine_shard(pairs, index, *args)

    def stopping(parts, index, mined, report):
        if index == 1:
            raise KeyboardInterrupt  # killed while writing shard 1
        real_write_shard(parts, index, mined, report)

    monkeypatch.setattr(mine_corpus, "mine_shard", counting)
    monkeypatch.setattr(mine_corpus, "write_shard", stopping)
    resumed = tmp_path / "resumed.tsv"
    assert mine(tiny_minilm_model, pairs, corpus, resumed, *settings) == 130  # as Ctrl-C ends it
    assert mined_shards == [0, 1] and not resumed.exists()
    monkeypatch.setattr(mine_corpus, "write_shard", real_write_shard)
    assert mine(tiny_minilm_model, pairs, corpus, resumed, *settings) == 0
    assert mined_shards == [0, 1, 1, 2]  # shard 0 was not mined again
    assert resumed.read_bytes() == whole.read_bytes()


def test_mine_corpus_refuses_to_resume_with_another_setting(tiny_minilm_model, tmp_path, monkeypatch, capsys):
    pairs, corpus = write_inputs(tmp_path)
    out = tmp_path / "triplets.tsv"

    def stop(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(mine_corpus, "merge_shards", stop)  # every shard written, never merged
    assert mine(tiny_minilm_model, pairs, corpus, out, "--shard-size", "2") == 130
    embedded = []
    monkeypatch.setattr(embed_corpus, "embed_shard", lambda *a, **k: embedded.append(1))
    assert mine(tiny_minilm_model, pairs, corpus, out, "--shard-size", "2", "--range-max", "30") == 2
    error = capsys.readouterr().err
    assert "mining.range_max 50 -> 30" in error and "triplets.tsv.parts" in error and "delete" in error
    assert embedded == []  # refused before any embedding


def test_mine_corpus_reuses_the_corpus_vectors_embed_made(tiny_minilm_model, tmp_path, monkeypatch):
    pairs, corpus = write_inputs(tmp_path)
    vectors = tmp_path / "vectors"
    assert main(["embed", "--model", str(tiny_minilm_model), "--input", str(corpus), "--text-field", "body",
                 "--out", str(vectors), "--normalize", "--device", "cpu"]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in vectors.iterdir() if p.is_file()}
    embedded = []
    real = embed_corpus.embed_shard

    def counting(pipeline, options, prompt, records, *args, **kwargs):
        embedded.append(len(records))
        return real(pipeline, options, prompt, records, *args, **kwargs)

    monkeypatch.setattr(embed_corpus, "embed_shard", counting)
    out = tmp_path / "triplets.tsv"
    assert mine(tiny_minilm_model, pairs, corpus, out, "--corpus-vectors", str(vectors)) == 0
    assert embedded == [5]  # the 5 distinct positives only: the corpus's 8 vectors were there
    assert {p.name: p.stat().st_mtime_ns for p in vectors.iterdir() if p.is_file()} == before
    assert mine(tiny_minilm_model, pairs, corpus, tmp_path / "again.tsv", "--corpus-vectors", str(vectors),
                "--max-length", "16") == 2  # another window: embed's own check refuses the folder


def test_mine_negatives_corpus_flags_need_corpus(tiny_minilm_model, tmp_path, capsys):
    pairs, _ = write_inputs(tmp_path)
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out",
                 str(tmp_path / "t.tsv"), "--no-positives"]) == 2
    assert "--no-positives applies to mining from a corpus" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no such file or folder"):
        mine_corpus.mine_corpus(tiny_minilm_model, pairs, PAIRS, tmp_path / "missing", tmp_path / "t.tsv",
                                settings=mine_corpus.MiningSettings())
