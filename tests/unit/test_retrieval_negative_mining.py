"""Hard-negative mining (an anchor's nearest texts minus its positives and near-positives, in range, top or
random), teacher margins from a cross-encoder, the triplet files they write (round trip), and the two commands
on a tiny model: one row per negative, bad input named by file and line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.data.embedding import read_text_groups, write_text_groups
from bertforge.errors import ConfigError
from bertforge.retrieval.negative_mining import MiningReport, MiningSettings, mine_negatives, teacher_margins
from conftest import make_tiny_config

# Unit vectors at these angles (degrees) from the anchors' direction: cosine = cos(angle).
ANGLES = {"q1": 0, "q2": 0, "pos1": 10, "pos1b": 12, "pos2": 40, "near": 11, "hard": 30, "mid": 50, "far": 80}


def encode(texts: list[str]) -> np.ndarray:
    radians = np.radians([ANGLES[t] for t in texts])
    return np.stack([np.cos(radians), np.sin(radians)], axis=1).astype(np.float32)


def test_mine_negatives_skips_positives_and_near_positives():
    pairs = [("q1", "pos1"), ("q1", "pos1b"), ("q2", "pos2")]
    report = MiningReport()
    mined = mine_negatives(pairs, encode, MiningSettings(relative_margin=0.05), corpus=["near", "hard", "mid", "far"],
                           report=report)
    by_pair = {(m.anchor, m.positive): m for m in mined}
    # q1's positives (pos1, pos1b) are never its negatives; "near" (cos 0.982 > 0.95 x cos 10°) is too close.
    assert by_pair[("q1", "pos1")].negative == "hard"
    assert by_pair[("q1", "pos1b")].negative == "hard"
    # q2's positive is at 40°: pos1, pos1b, near and hard all score above it; "mid" is the first below 95% of it.
    assert by_pair[("q2", "pos2")].negative == "mid"
    assert by_pair[("q2", "pos2")].rank == 4  # pos1, near, pos1b, hard, then mid (its own positive not counted)
    assert by_pair[("q2", "pos2")].positive_score == pytest.approx(np.cos(np.radians(40)), abs=1e-6)
    assert report.pairs == 3 and report.corpus == 7 and report.rows == 3 and report.dropped_pairs == 0
    assert report.removed_by_margin == 1 + 1 + 4  # near for each q1 pair; for q2 the four above "mid"


def test_mine_negatives_range_and_count():
    pairs = [("q1", "pos1")]
    settings = MiningSettings(num_negatives=2, range_min=1, range_max=4, relative_margin=None)
    mined = mine_negatives(pairs, encode, settings, corpus=["near", "hard", "mid", "far"])
    # Candidates without the positive: near, hard, mid, far (ranks 0..3); range 1..4 and the best two left.
    assert [(m.negative, m.rank) for m in mined] == [("hard", 1), ("mid", 2)]
    with_margin = mine_negatives(pairs, encode, MiningSettings(margin=0.5, relative_margin=None, range_max=10),
                                 corpus=["near", "hard", "mid", "far"])
    assert [m.negative for m in with_margin] == ["far"]  # cos 80° = 0.17 <= cos 10° - 0.5 = 0.48, mid (0.64) is not


def test_mine_negatives_random_sampling_is_seeded_and_drops_pairs_without_candidates():
    pairs = [("q1", "pos1"), ("q2", "pos2")]
    corpus = ["near", "hard", "mid", "far"]
    settings = MiningSettings(num_negatives=2, sampling="random", seed=3, relative_margin=None)
    first = mine_negatives(pairs, encode, settings, corpus=corpus)
    assert first == mine_negatives(pairs, encode, settings, corpus=corpus)
    assert len(first) == 4 and all(m.negative not in ("pos1", "pos1b", "pos2") for m in first if m.anchor == "q1")
    assert all(m.negative != "pos2" for m in first)
    report = MiningReport()
    # A margin of 0.7 leaves q1 (positive cos 0.98) only "far" (cos 0.17), q2 (positive cos 0.77) nothing.
    none = mine_negatives(pairs, encode, MiningSettings(margin=0.7, relative_margin=None, num_negatives=2),
                          corpus=corpus, report=report)
    assert [m.negative for m in none] == ["far"] and report.short_pairs == 2 and report.dropped_pairs == 1


@pytest.mark.parametrize("given, message", [({"num_negatives": 0}, "1 or more"), ({"range_max": 0}, "range_min"),
                                            ({"range_min": 4, "range_max": 5, "num_negatives": 2}, "fewer than"),
                                            ({"relative_margin": 1.0}, "share"), ({"sampling": "bm25"}, "one of")])
def test_mining_settings_refuse_bad_values(given, message):
    with pytest.raises(ConfigError, match=message):
        MiningSettings(**given)


def test_teacher_margins_are_positive_minus_negative_relevance():
    def rank(inputs):  # a fake reranker: relevance = the text's length / 100, best first as the route returns
        results = []
        for item in inputs:
            scored = [{"index": i, "score": len(t) / 100, "logit": float(len(t))} for i, t in enumerate(item["texts"])]
            results.append({"results": sorted(scored, key=lambda r: -r["score"])})
        return results

    triplets = [("q", "a" * 30, "b" * 10), ("q", "c" * 5, "d" * 25)]
    assert teacher_margins(triplets, rank) == pytest.approx([0.2, -0.2])
    assert teacher_margins(triplets, rank, kind="logit") == pytest.approx([20.0, -20.0])
    with pytest.raises(ConfigError, match="margin kind"):
        teacher_margins(triplets, rank, kind="probability")


@pytest.mark.parametrize("name", ["t.tsv", "t.csv", "t.jsonl"])
def test_write_text_groups_round_trips_texts_and_margins(tmp_path, name):
    rows = [("who?", "a text,\twith a tab", "another \"quoted\" text", 0.1 + 0.2), ("why?", "b", "c", -1e-7)]
    path = tmp_path / name
    assert write_text_groups(path, ("anchor", "positive", "negative", "margin"), rows) == 2
    groups = read_text_groups(path, texts=["anchor", "positive", "negative"], score="margin")
    assert [g.score for g in groups] == [0.1 + 0.2, -1e-7]  # exact: written as Python prints floats
    assert groups[1].texts == ("why?", "b", "c")
    expected = "a text, with a tab" if name == "t.tsv" else "a text,\twith a tab"  # TSV has no quoting
    assert groups[0].texts[1] == expected and groups[0].texts[2] == "another \"quoted\" text"
    assert not list(tmp_path.glob(".*tmp*"))  # written through a temporary file, renamed


PAIRS = [("How old is the universe?", "The universe is about 13.8 billion years old."),
         ("Where do pandas live?", "Giant pandas live in the mountains of central China."),
         ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."),
         ("What do bees make?", "Bees make honey from the nectar of flowers."),
         ("Where is the Eiffel Tower?", "The Eiffel Tower stands in Paris, France.")]


def test_mine_negatives_and_score_margins_commands_write_training_files(tmp_path, tiny_minilm_model, capsys):
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.tokenization import Tokenizer

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\n" + "".join(f"{a}\t{p}\n" for a, p in PAIRS), encoding="utf-8")
    triplets = tmp_path / "triplets.jsonl"
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out", str(triplets),
                 "--num-negatives", "2", "--relative-margin", "0", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in triplets.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 2 * len(PAIRS)
    assert all(r["negative"] != r["positive"] and r["negative"] in {p for _, p in PAIRS} for r in rows)
    assert "10 rows written" in capsys.readouterr().err
    labelled = tmp_path / "cross_encoder.csv"
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out", str(labelled),
                 "--relative-margin", "0", "--output-format", "labeled-pair", "--device", "cpu"]) == 0
    groups = read_text_groups(labelled, texts=["anchor", "text"], score="label")
    assert [g.score for g in groups] == [1.0, 0.0] * len(PAIRS)  # each positive, then its negative
    assert [g.texts for g in groups[::2]] == PAIRS
    lists = tmp_path / "lists.jsonl"
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out", str(lists),
                 "--num-negatives", "2", "--relative-margin", "0", "--output-format", "labeled-list",
                 "--device", "cpu"]) == 0
    from bertforge.data.reranking import read_rerank_lists

    read = read_rerank_lists(lists)  # what `finetune --format rerank-lists` reads
    assert [(q.query, q.texts[0]) for q in read] == PAIRS
    assert all(q.labels == (1.0, 0.0, 0.0) and len(set(q.texts)) == 3 for q in read)
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out",
                 str(tmp_path / "lists.tsv"), "--output-format", "labeled-list"]) == 2
    assert "name the file .jsonl" in capsys.readouterr().err

    tokenizer = Tokenizer.from_pretrained(tiny_minilm_model)
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=128)
    BertForSequenceClassification(config.with_labels(["LABEL_0"])).save_pretrained(tmp_path / "ce",
                                                                                    tokenizer=tokenizer)
    margins = tmp_path / "margins.tsv"
    assert main(["score-margins", "--model", str(tmp_path / "ce"), "--triplets", str(triplets), "--out",
                 str(margins), "--device", "cpu"]) == 0
    scored = read_text_groups(margins, texts=["anchor", "positive", "negative"], score="margin")
    assert [g.texts for g in scored] == [(r["anchor"], r["positive"], r["negative"]) for r in rows]
    assert all(-1 <= g.score <= 1 for g in scored) and len({g.score for g in scored}) > 1
    scores = tmp_path / "scores.tsv"
    assert main(["score-margins", "--model", str(tmp_path / "ce"), "--triplets", str(triplets), "--out",
                 str(scores), "--device", "cpu", "--output-format", "scores", "--margin-of", "score"]) == 0
    per_text = read_text_groups(scores, texts=["anchor", "positive", "negative"],
                                score=["positive_score", "negative_score"])
    assert [g.texts for g in per_text] == [g.texts for g in scored]
    assert [g.score[0] - g.score[1] for g in per_text] == pytest.approx([g.score for g in scored], abs=1e-9)
    assert "train with --format embedding-scores" in capsys.readouterr().err


def test_mine_negatives_names_the_bad_line(tmp_path, tiny_minilm_model, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\nWho?\tHe did.\nWhere?\t \n", encoding="utf-8")
    out = tmp_path / "triplets.tsv"
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"{pairs}:3" in error and "'positive' is empty" in error
    assert not out.exists()
    pairs.write_text("question\tanswer\nWho?\tHe did.\n", encoding="utf-8")
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out", str(out)]) == 2
    assert "no column named 'anchor'" in capsys.readouterr().err
    pairs.write_text("anchor\tpositive\nWho?\tHe did.\nWhere?\tThere.\n", encoding="utf-8")
    assert main(["mine-negatives", "--model", str(tiny_minilm_model), "--train", str(pairs), "--out", str(out),
                 "--relative-margin", "0.99"]) == 2
    assert "found a negative" in capsys.readouterr().err and not out.exists()
