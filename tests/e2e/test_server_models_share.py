"""Two models served by one real uvicorn server on a loopback port share the machine through one compute lane.

While one model works through a large request (a SPLADE model's `/embed_sparse` of 512 texts, many calls), the
other model's small requests and `/health` keep being answered (counted from the moment the large request is sent
until its answer), and no model call of one model runs while a call of the other runs (counted in the model
threads themselves: two models working at once oversubscribe the cores).
"""

from __future__ import annotations

import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from tests.e2e.test_server import running  # noqa: E402

from bertforge.inference.pipelines import feature_tokens  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

ANSWERS = 3  # small answers and /health answers counted while the large request is in progress, at least
SMALL_CLIENTS = 2


@pytest.fixture(scope="module")
def served(tiny_minilm_model, tiny_sparse_model):
    """dense and sparse served together, 64 tokens a call; every model call recorded as (model, tokens) and
    every call that began while the other model's was running counted."""
    app = create_app({"dense": tiny_minilm_model, "sparse": tiny_sparse_model}, device="cpu", request_timeout_s=0,
                     max_batch_tokens=64)
    lock, inside, calls, overlaps = threading.Lock(), [], [], []
    for name, service in app.state.models.services.items():
        for pipeline in service.pipelines.values():
            def recorded(features, options, forward=pipeline.forward, name=name):
                with lock:
                    overlaps.extend(other for other in inside if other != name)
                    inside.append(name)
                    calls.append((name, sum(feature_tokens(feature) for feature in features)))
                try:
                    return forward(features, options)
                finally:
                    with lock:
                        inside.remove(name)

            pipeline.forward = recorded
    with running(app) as client:
        yield client, calls, overlaps


def test_server_models_share_the_machine_while_one_runs_a_large_request(served):
    client, calls, overlaps = served
    large_started, large_done, stop = threading.Event(), threading.Event(), threading.Event()
    counts = {"small": 0, "health": 0, "small_errors": 0}
    count_lock = threading.Lock()

    def during() -> bool:
        return large_started.is_set() and not large_done.is_set()

    def small_client(index: int) -> None:
        with httpx.Client(base_url=client.base_url, timeout=120) as small:
            while not stop.is_set():
                answer = small.post("/models/dense/embed", json={"inputs": [f"short text {index}"]})
                with count_lock:
                    counts["small" if answer.status_code == 200 else "small_errors"] += during()

    def prober() -> None:
        with httpx.Client(base_url=client.base_url, timeout=120) as probe:
            while not stop.is_set():
                answered = probe.get("/health").status_code == 200
                with count_lock:
                    counts["health"] += answered and during()

    threads = [threading.Thread(target=small_client, args=(index,)) for index in range(SMALL_CLIENTS)]
    threads.append(threading.Thread(target=prober))
    for thread in threads:
        thread.start()
    try:
        calls.clear()
        overlaps.clear()
        large_started.set()  # from here until its answer, the counts above count
        with client.stream("POST", "/models/sparse/embed_sparse", json={"inputs": ["a"] * 512}, timeout=300) as large:
            body = large.read()
        large_done.set()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert large.status_code == 200, body[:300]
    sparse_calls = [tokens for name, tokens in calls if name == "sparse"]
    assert sum(sparse_calls) == 512 * 3 and len(sparse_calls) >= 1536 // 64  # [CLS] a [SEP], 64 tokens a call
    assert overlaps == [], f"{len(overlaps)} model calls ran while the other model's call ran"
    assert counts["small_errors"] == 0
    assert counts["small"] >= ANSWERS and counts["health"] >= ANSWERS, counts
