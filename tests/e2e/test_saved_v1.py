"""Models saved by the release before the task description (flat `finetuning.json` records, commit ecf2a32;
tests/fixtures/saved_v1/make_saved_v1.py made them) load and score identically today, through `evaluate` and
through the pipelines; `evaluate` reads a model's config.json once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertforge import checkpoint_format
from bertforge.evaluation.saved_model import evaluate
from bertforge.families.task import read_description
from bertforge.families.tasks import TASKS
from bertforge.inference.pipelines import load_pipeline

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "saved_v1"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
MADE_AT = "/work/main/tests/fixtures/saved_v1"  # where make_saved_v1.py wrote them: the records' ids say so
ROUTES = {"pair": "classify", "regression": "classify", "multilabel": "classify", "ner_iobes_crf": "tag",
          "qa_v2": "answer", "choice": "choose"}


def copied(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """The fixture's model and data file, copied where the test may write beside them."""
    shutil.copytree(FIXTURES / name, tmp_path / name)
    data = next(p for p in (tmp_path / name).iterdir() if p.name.startswith("data."))
    return tmp_path / name / "model", data


def same_ids(records: list[dict], here: Path) -> list[dict]:
    return [{**r, "id": r["id"].replace(MADE_AT, str(here))} for r in records]


def renamed(record: dict) -> dict:
    """An earlier release's QA record under today's field names (issue #23: one meaning per field): the answer's
    `score` (a probability) is `probability`, an n-best candidate's `score` (a logit sum) is `logit_score`,
    (the answer's logit_score and each candidate's probability are new: `without_new_fields`)."""
    if "nbest" not in record:
        return record
    nbest = [{**{k: v for k, v in c.items() if k != "score"}, "logit_score": c["score"]} for c in record["nbest"]]
    answer = {k: v for k, v in record.items() if k not in ("score", "nbest")}
    return {**answer, "probability": record["score"], "nbest": nbest}


def without_new_fields(record: dict) -> dict:
    """A QA record without the fields this release added (the answer's logit_score, each candidate's
    probability), for comparison with an earlier release's."""
    if "nbest" not in record:
        return record
    nbest = [{k: v for k, v in c.items() if k != "probability"} for c in record["nbest"]]
    return {**{k: v for k, v in record.items() if k != "logit_score"}, "nbest": nbest}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_saved_v1_models_score_identically(name, tmp_path):
    model, data = copied(tmp_path, name)
    scored = evaluate(model, data, out_dir=tmp_path / "eval", device="cpu")
    expected = EXPECTED[name]
    # The regression fixture's model predicts almost a constant (std 2.4e-5): a 4e-9 rounding difference of
    # another CPU's kernels moves its Pearson by 2e-5, so metrics get that much room; predictions stay at 1e-5.
    assert scored.metrics == pytest.approx(expected["metrics"], abs=1e-4 if name == "regression" else 1e-6)
    assert set(scored.metrics) == set(expected["metrics"])
    predictions = [without_new_fields(r) for r in json.loads(json.dumps(scored.predictions))]
    assert _close(predictions, same_ids([renamed(r) for r in expected["predictions"]], tmp_path))


def _close(a, b, tol=1e-5) -> bool:
    """Nested JSON values equal, numbers within `tol` (pytest.approx does not recurse into dicts of lists)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), (sorted(a), sorted(b))
        return all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b)
        return all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=tol)
        return True
    assert a == b
    return True


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_saved_v1_models_predict_what_evaluate_scored(name, tmp_path):
    model, data = copied(tmp_path, name)
    scored = evaluate(model, data, out_dir=tmp_path / "eval", device="cpu")
    pipeline = load_pipeline(model, ROUTES[name], device="cpu")
    contexts = {}
    if name == "qa_v2":  # the records name the question by id; its context is in the file
        articles = json.loads(data.read_text())["data"]
        contexts = {qa["id"]: p["context"] for a in articles for p in a["paragraphs"] for qa in p["qas"]}
    inputs = {"pair": lambda r: {"text": r["text_a"], "text_pair": r["text_b"]},
              "regression": lambda r: {"text": r["text_a"], "text_pair": r["text_b"]},
              "multilabel": lambda r: r["text_a"], "ner_iobes_crf": lambda r: {"words": r["words"]},
              "qa_v2": lambda r: {"question": r["question"], "context": contexts[r["id"]]},
              "choice": lambda r: {"context": r["context"], "endings": r["endings"]}}[name]
    records = scored.predictions[:6]
    results = pipeline([inputs(r) for r in records])
    keys = {"pair": "label", "regression": "value", "multilabel": "labels", "ner_iobes_crf": "entities",
            "qa_v2": "answer", "choice": "choice"}[name]
    record_keys = {"qa_v2": "prediction"}.get(name, keys)
    # The same answers; a value (regression) within float rounding of the other batch composition.
    assert _close([r[keys] for r in results], [r[record_keys] for r in records], 1e-6)


def test_saved_v1_flat_records_read_as_the_description_now_written(tmp_path):
    record = json.loads((FIXTURES / "qa_v2" / "model" / "finetuning.json").read_text())
    task = read_description(record, TASKS["squad"].family)
    assert task.options["version_2_with_negative"] is True and task.inputs.doc_stride == 16
    assert read_description(task.to_json(), task.family) == task


def test_evaluate_reads_config_json_once(tmp_path, monkeypatch):
    model, data = copied(tmp_path, "pair")
    reads: list[str] = []
    real = checkpoint_format.read_json_object

    def counting(file, what):
        reads.append(Path(file).name)
        return real(file, what)

    monkeypatch.setattr(checkpoint_format, "read_json_object", counting)
    evaluate(model, data, out_dir=tmp_path / "eval", device="cpu")
    assert reads.count("config.json") == 1, reads
