"""text-embeddings-inference's /embed_sparse, /embed_all and /similarity as its openapi.json gives them: request
bodies, response shapes ([[{index, value}]], [[[float]]], [float]) and TEI's error envelope, agreeing with our
own pipelines and /embed; and huggingface_hub's InferenceClient (`sentence_similarity`, `feature_extraction`)
against a real socket."""

from __future__ import annotations

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from tests.e2e.test_server import running  # noqa: E402

from bertforge.inference.pipelines import load_pipeline  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

TEI_QUERY = "What is Deep Learning?"
TEXTS = ["Deep Learning is not...", "Deep learning is...", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def app(tiny_sparse_model, tiny_minilm_model):
    return create_app({"splade": tiny_sparse_model, "embedder": tiny_minilm_model}, device="cpu", max_items=8)


@pytest.fixture(scope="module")
def client(app):
    with TestClient(app) as test_client:
        yield test_client


def test_tei_embed_sparse_gives_each_texts_terms_as_index_value(client, tiny_sparse_model):
    response = client.post("/embed_sparse", json={"inputs": [TEI_QUERY, TEXTS[0]]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body) == 2 and all(set(item) == {"index", "value"} for row in body for item in row)
    expected = load_pipeline(tiny_sparse_model, "embed-sparse", device="cpu")([TEI_QUERY, TEXTS[0]])
    for row, ours in zip(body, expected):
        assert [item["index"] for item in row] == ours["indices"]
        assert np.allclose([item["value"] for item in row], ours["values"], atol=1e-5)
    ids = load_pipeline(tiny_sparse_model, "embed-sparse", device="cpu").tokenizer.encode(
        TEI_QUERY, add_special_tokens=False).ids
    by_ids = client.post("/models/splade/embed_sparse", json={"inputs": ids}).json()
    assert [item["index"] for item in by_ids[0]] == [item["index"] for item in body[0]]


def test_tei_root_of_a_sparse_model_answers_as_embed_sparse(client):
    # TEI serves POST / (and /invocations) of an embedding model pooled by "splade" as /embed_sparse
    expected = client.post("/models/splade/embed_sparse", json={"inputs": TEXTS[:2]}).json()
    for path in ("/models/splade", "/models/splade/invocations"):
        response = client.post(path, json={"inputs": TEXTS[:2]})
        assert response.status_code == 200, response.text
        assert response.json() == expected and set(response.json()[0][0]) == {"index", "value"}
    assert client.get("/models/splade/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    assert client.get("/models/embedder/info").json()["model_type"] == {"embedding": {"pooling": "mean"}}
    several = client.post("/", json={"inputs": "a"})  # two models: the refusal names each one's own route
    assert several.status_code == 400 and "/models/splade/embed_sparse" in several.json()["error"]
    body = client.get("/openapi.json").json()["paths"]["/models/splade"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/EmbedSparseRequest")


@pytest.mark.parametrize("path, body, status, words", [
    ("/embed_sparse", {"inputs": "word " * 100, "truncate": False}, 422, "truncate"),  # over the 64-token window
    ("/embed_sparse", {"inputs": ["a"] * 9}, 413, "at most 8"),
    ("/models/embedder/embed_sparse", {"inputs": "a"}, 404, "embed-sparse"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 422, "sentences"),
    ("/embed_all", {"inputs": "a", "truncate": "yes"}, 422, "truncate"),
])
def test_tei_vector_routes_refuse_in_tei_envelope(client, path, body, status, words):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error", "error_type"} and words in response.json()["error"]


def test_tei_embed_all_token_vectors_pool_to_embed(client, tiny_minilm_model):
    tokens = client.post("/models/embedder/embed_all", json={"inputs": TEXTS[:2]})
    assert tokens.status_code == 200, tokens.text
    body = tokens.json()
    tokenizer = load_pipeline(tiny_minilm_model, "embed", device="cpu").tokenizer
    assert [len(rows) for rows in body] == [len(tokenizer.encode(t).ids) for t in TEXTS[:2]]  # [CLS] ... [SEP]
    assert {len(vector) for rows in body for vector in rows} == {32}
    pooled = client.post("/models/embedder/embed", json={"inputs": TEXTS[:2], "normalize": False}).json()
    for rows, vector in zip(body, pooled):  # the embedder pools by mean: the mean of its token vectors
        assert np.allclose(np.mean(rows, axis=0), vector, atol=1e-5)


def test_tei_similarity_is_the_cosine_of_the_embed_vectors(client):
    body = {"inputs": {"source_sentence": TEI_QUERY, "sentences": TEXTS},
            "parameters": {"truncate": True, "truncation_direction": "Left", "prompt_name": None}}
    response = client.post("/models/embedder/similarity", json=body)
    assert response.status_code == 200, response.text
    vectors = np.array(client.post("/models/embedder/embed", json={"inputs": [TEI_QUERY, *TEXTS]}).json())
    assert np.allclose(response.json(), vectors[1:] @ vectors[0], atol=1e-5) and len(response.json()) == 3


def test_tei_vector_routes_in_openapi(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for path, request in (("/embed_sparse", "EmbedSparseRequest"), ("/embed_all", "EmbedAllRequest"),
                          ("/similarity", "SimilarityRequest")):
        operation = spec["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(request)
        assert schemas[request].get("additionalProperties") is not False  # unknown fields are ignored, as TEI
    assert set(schemas["SparseValue"]["properties"]) == {"index", "value"}


def test_inference_client_sentence_similarity_and_feature_extraction(app, tiny_minilm_model):
    hf = pytest.importorskip("huggingface_hub")
    with running(app) as http:
        base = str(http.base_url).rstrip("/")
        scores = hf.InferenceClient(base_url=base + "/models/embedder/similarity").sentence_similarity(
            TEI_QUERY, TEXTS)
        tokens = hf.InferenceClient(base_url=base + "/models/embedder/embed_all").feature_extraction(TEXTS[0])
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu")
    vectors = pipeline.encode([TEI_QUERY, *TEXTS], normalize=True)
    assert np.allclose(scores, vectors[1:] @ vectors[0], atol=1e-5)
    assert np.asarray(tokens).shape == (1, len(pipeline.tokenizer.encode(TEXTS[0]).ids), 32)
