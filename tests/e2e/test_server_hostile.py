"""Hostile request bodies are 4xx, decided before any model work (issue #20, item 5): deep nesting, huge integer
literals, NaN, lone surrogates; and `predict` refuses the same lines with one error naming the line."""

from __future__ import annotations

import pytest

from bertforge.cli import main

fastapi = pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def client(tiny_minilm_model):
    from fastapi.testclient import TestClient

    from bertforge.serving.app import create_app

    with TestClient(create_app(tiny_minilm_model, device="cpu")) as test_client:
        yield test_client


@pytest.mark.parametrize("body, message", [
    ('{"inputs": ' + "[" * 1000 + "]" * 1000 + "}", "nested 1001 levels deep"),
    ('{"inputs": ["a"], "parameters": {"layer": ' + "9" * 5000 + "}}", "a number of 5000 characters"),
    ('{"inputs": ["a"], "parameters": {"layer": NaN}}', "NaN is not a JSON number"),
    ('{"inputs": ["\\ud800 text"]}', "lone surrogate"),
    ('{"inputs": ["a"', "not valid JSON"),
])
def test_server_hostile_body_is_a_400_naming_the_problem(client, body, message):
    answer = client.post("/v1/embed", content=body.encode("utf-8"), headers={"content-type": "application/json"})
    assert answer.status_code == 400 and message in answer.json()["error"]
    assert client.post("/v1/embed", json={"inputs": ["still serving"]}).status_code == 200


def test_predict_refuses_a_lone_surrogate_line_naming_it(tiny_minilm_model, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "\\ud800"}\n', encoding="utf-8")
    code = main(["predict", "--model", str(tiny_minilm_model), "--task", "embed", "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl"), "--device", "cpu"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "in.jsonl:2" in error[-1] and "lone surrogate" in error[-1]


def test_a_model_with_nan_weights_is_refused_by_predict_and_serve(tiny_minilm_model, tmp_path, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    from bertforge.errors import CheckpointError
    from bertforge.serving.app import create_app

    broken = tmp_path / "broken"
    shutil.copytree(tiny_minilm_model, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone().fill_(float("nan"))
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    (broken / "checksums.json").unlink()  # as a directory from elsewhere: no checksum refuses the edit first
    source = tmp_path / "in.txt"
    source.write_text("hello\n", encoding="utf-8")
    code = main(["predict", "--model", str(broken), "--task", "embed", "--input", str(source), "--output",
                 str(tmp_path / "out.jsonl"), "--device", "cpu"])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and f"tensor {name} holds" in error[-1]
    assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(CheckpointError, match=f"tensor {name} holds"):
        create_app(broken, device="cpu")
