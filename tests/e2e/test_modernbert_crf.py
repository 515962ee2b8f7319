"""A CRF tagger on a ModernBERT encoder, as on BERT's: `bertforge finetune --format ner --crf` from a tiny random
ModernBERT masked LM trains the tag scores and the CRF's transitions (the CRF's likelihood as the loss), saves
them (`crf.*` beside transformers' `ModernBertForTokenClassification` weights) and loads them back; `bertforge
evaluate`, `bertforge predict --task tag` and the server decode with the same constrained Viterbi, into valid BIO
only; transformers loads the directory (without the CRF) with the same tag scores.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tests.e2e.test_modernbert_directory import tiny_modernbert
from tests.e2e.test_one_path import COUNT, assert_tagging_paths_agree

from bertforge.families import registry
from bertforge.families.tagging import ModernBertForTokenClassification
from bertforge.metrics.tagging import check_bio

NAMES = ["Ana", "Rui", "Marta", "Paris", "Lisbon", "Tomas", "Porto"]


def sentences(count: int) -> list[list[tuple[str, str]]]:
    """Two-word names and places (B- then I-) among plain words: transitions worth learning."""
    rows = []
    for i in range(count):
        first, second, place = NAMES[i % 7], NAMES[(i + 3) % 7], NAMES[(i + 4) % 7]
        rows.append([(first, "B-PER"), (second, "I-PER"), ("visited", "O"), (place, "B-LOC"), ("today", "O"),
                     ("with", "O"), (NAMES[(i + 1) % 7], "B-PER")])
    return rows


def conll(rows) -> str:
    return "\n\n".join("\n".join(f"{word} {tag}" for word, tag in row) for row in rows) + "\n"


def test_modernbert_crf_tagger_trains_round_trips_and_decodes_valid_bio_everywhere(tmp_path):
    from bertforge.cli import main

    rows = sentences(40)
    (tmp_path / "train.txt").write_text(conll(rows), encoding="utf-8")
    (tmp_path / "dev.txt").write_text(conll(rows[:COUNT]), encoding="utf-8")
    tokenizer = tiny_modernbert(tmp_path / "base", [" ".join(w for w, _ in row) for row in rows])
    assert main(["finetune", "--format", "ner", "--crf", "--train", str(tmp_path / "train.txt"), "--dev",
                 str(tmp_path / "dev.txt"), "--model", str(tmp_path / "base"), "--out", str(tmp_path / "ft"),
                 "--steps", "4", "--batch-size", "8", "--lr", "1e-3", "--device", "cpu", "--max-seq-length", "8",
                 "--doc-stride", "3", "--progress=false"]) == 0
    best = tmp_path / "ft" / "best"
    saved = json.loads((best / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForTokenClassification"]
    assert saved["use_crf"] is True
    metrics = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss_crf_nll" in r["values"] for r in metrics if r["split"] == "train")
    # The CRF trained (its scores moved off zero), was saved under its own names and loads back as it was.
    weights = load_file(best / "model.safetensors")
    assert {"crf.transitions", "crf.start", "crf.end"} <= set(weights)
    assert weights["crf.transitions"].abs().max() > 0
    model, report = registry.load_model(best)
    assert type(model) is ModernBertForTokenClassification and model.crf is not None and report.fresh == []
    torch.testing.assert_close(model.crf.transitions.detach(), weights["crf.transitions"])

    # One path: evaluate, predict and the server decode the same constrained Viterbi; every sentence spans
    # several windows of 8 tokens, joined before decoding; the tags are valid BIO, whatever the tag scores.
    words = [[w for w, _ in row] for row in rows[:COUNT]]
    evaluated = assert_tagging_paths_agree(best, tmp_path / "dev.txt", words, tmp_path)
    assert all(check_bio(e["tags"]) == [] for e in evaluated)
    scored = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert scored["data_report"]["counts"]["windowed_inputs"] == COUNT
    assert scored["metrics"]["invalid_span_share"] == 0.0

    # transformers loads the directory as its tagger (the CRF's names left aside) with the same tag scores.
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForTokenClassification.from_pretrained(best).eval()
    ids = torch.tensor([tokenizer.encode(" ".join(words[0])).ids])
    model.eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(ids).logits.numpy(), theirs(input_ids=ids).logits.numpy(), atol=1e-5)
