"""The ONNX Runtime engine (`engine/onnxruntime.py`): its graph is exported once per weights and settings into
the user's cache and reused after, verified against the checksums its export recorded (a foreign, truncated or
unrecorded graph is exported again), it reports its threads, it refuses what it cannot run with the fix, and `serve --engine onnxruntime`
answers as the PyTorch engine does. (Its scores on every family: `test_engine.py`'s parity test over `ENGINES`.)"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from bertforge.engine import onnxruntime as ort_engine  # noqa: E402
from bertforge.engine.build import build_engine, plan_engine  # noqa: E402
from bertforge.errors import ConfigError  # noqa: E402
from bertforge.families import registry  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.pretraining import BertForPretraining  # noqa: E402
from bertforge.model.bert import BertModel  # noqa: E402
from conftest import make_tiny_config  # noqa: E402

# `serve --engine onnxruntime` against `serve --engine torch`, fp32: the bound on every vector.
SERVED_MIN_COSINE = 0.999
LABELS = {0: "negative", 1: "positive"}


@pytest.fixture
def exports(monkeypatch, tmp_path) -> list[str]:
    """The precision of every graph export this test makes, in order, into a user cache of its own."""
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    made: list[str] = []
    export = ort_engine.export_graph

    def counted(module, family, folder, precision):
        made.append(precision)
        return export(module, family, folder, precision)

    monkeypatch.setattr(ort_engine, "export_graph", counted)
    return made


def saved_classifier(directory, seed: int = 0):
    torch.manual_seed(seed)
    BertForSequenceClassification(make_tiny_config(id2label=LABELS)).save_pretrained(directory)
    return directory


def ort_engine_of(directory, precision: str = "fp32", threads: int = 1):
    model, _ = registry.load_model(directory)
    engine = build_engine(model, plan_engine("cpu", precision, "onnxruntime", threads), directory)
    engine.prepare(registry.for_model(model))
    return engine


def test_ort_engine_reuses_its_cached_graph_without_exporting(exports, tmp_path):
    model_dir = saved_classifier(tmp_path / "model")
    first = ort_engine_of(model_dir)
    second = ort_engine_of(model_dir)
    assert exports == ["fp32"]  # the second build loaded the first one's graph
    described = second.describe()
    assert described["graphs"]["model"]["cache"] == "reused"
    assert first.describe()["graphs"]["model"]["cache"] == "exported"
    assert described["graphs"]["model"]["file"].startswith(str(ort_engine.cache_root()))
    ids = torch.tensor([[2, 7, 9, 3]])
    torch.testing.assert_close(first(ids).logits, second(ids).logits, atol=0, rtol=0)

    saved_classifier(model_dir, seed=1)  # other weights in the same directory: another graph
    retrained = ort_engine_of(model_dir)
    assert exports == ["fp32", "fp32"]
    assert retrained.describe()["graphs"]["model"]["file"] != described["graphs"]["model"]["file"]
    keys = {ort_engine.graph_key(second.model, precision, ["logits"])[0] for precision in ("fp32", "int8")}
    assert len(keys) == 2  # other settings: another graph


def test_ort_engine_keeps_its_graph_in_the_user_cache_when_the_model_directory_is_read_only(
        exports, tmp_path, monkeypatch):
    if os.geteuid() == 0:  # root writes anywhere: a read-only directory is then the missing source
        source = None
    else:
        source = saved_classifier(tmp_path / "model")
        source.chmod(0o555)
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    model = BertForSequenceClassification(make_tiny_config(id2label=LABELS))
    for _ in range(2):
        engine = build_engine(model, plan_engine("cpu", "fp32", "onnxruntime", 1), source)
        engine.prepare(registry.for_model(model))
    assert exports == ["fp32"]
    assert engine.describe()["graphs"]["model"]["file"].startswith(str(tmp_path / "cache" / "onnx"))


def graph_folder(engine) -> Path:
    return Path(engine.describe()["graphs"]["model"]["file"]).parent


def logits_of(engine, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return engine(ids).logits


def test_ort_engine_exports_again_when_its_cache_folder_holds_another_models_graph(exports, tmp_path, caplog):
    ids = torch.tensor([[2, 7, 9, 3, 11], [5, 8, 1, 4, 6]])
    ours = ort_engine_of(saved_classifier(tmp_path / "ours", seed=0))
    theirs = ort_engine_of(saved_classifier(tmp_path / "theirs", seed=1))
    assert exports == ["fp32", "fp32"]
    expected = logits_of(ours.model, ids)  # PyTorch, our weights
    assert not torch.allclose(logits_of(theirs, ids), expected, atol=1e-3)
    graph = ort_engine.GRAPH_FILES["fp32"]
    # the other model's graph copied into our key folder (the row: it was served silently)
    shutil.copyfile(graph_folder(theirs) / graph, graph_folder(ours) / graph)
    with caplog.at_level(logging.WARNING, logger=ort_engine.log.name):
        again = ort_engine_of(tmp_path / "ours")
    assert exports == ["fp32"] * 3 and again.describe()["graphs"]["model"]["cache"] == "exported"
    torch.testing.assert_close(logits_of(again, ids), expected, atol=1e-4, rtol=0)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"{graph}: its sha256 differs from the one saved in engine.json" in said[0]
    assert ort_engine_of(tmp_path / "ours").describe()["graphs"]["model"]["cache"] == "reused"
    assert exports == ["fp32"] * 3

    # the other model's whole key folder (its graph and its engine.json) copied under our key
    shutil.rmtree(graph_folder(again))
    shutil.copytree(graph_folder(theirs), graph_folder(again))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=ort_engine.log.name):
        again = ort_engine_of(tmp_path / "ours")
    assert exports == ["fp32"] * 4
    torch.testing.assert_close(logits_of(again, ids), expected, atol=1e-4, rtol=0)
    assert "records a graph of another model or settings (differs in weights)" in caplog.records[0].getMessage()


@pytest.mark.parametrize("damage", ["truncated graph", "no engine.json", "engine.json not JSON"])
def test_ort_engine_exports_again_over_a_damaged_cache_folder_without_a_traceback(exports, tmp_path, caplog, damage):
    ids = torch.tensor([[2, 7, 9, 3]])
    first = ort_engine_of(saved_classifier(tmp_path / "model"), "int8")
    folder = graph_folder(first)
    graph = folder / ort_engine.GRAPH_FILES["int8"]
    if damage == "truncated graph":
        graph.write_bytes(graph.read_bytes()[:1000])  # ONNX Runtime: InvalidProtobuf
    elif damage == "no engine.json":
        (folder / ort_engine.RECORD_NAME).unlink()  # an export killed before its record (older versions)
    else:
        (folder / ort_engine.RECORD_NAME).write_text("{", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger=ort_engine.log.name):
        again = ort_engine_of(tmp_path / "model", "int8")
    assert exports == ["int8", "int8"] and graph_folder(again) == folder
    assert len(caplog.records) == 1 and str(folder) in caplog.records[0].getMessage()
    torch.testing.assert_close(logits_of(again, ids), logits_of(first, ids), atol=0.05, rtol=0)
    record = json.loads((folder / ort_engine.RECORD_NAME).read_text(encoding="utf-8"))
    assert set(record["files"]) == {"model.optimized.onnx", "model.int8.onnx"}
    assert record["files"]["model.int8.onnx"]["bytes"] == graph.stat().st_size
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no temporaries left beside it


def test_ort_engine_never_writes_into_the_model_folder_and_a_killed_export_leaves_no_key_folder(
        exports, tmp_path, monkeypatch):
    model_dir = saved_classifier(tmp_path / "model")  # writable, as an installed package's folder often is
    before = sorted(p.name for p in model_dir.iterdir())
    cache = tmp_path / "xdg"
    monkeypatch.delenv("BERTFORGE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))

    def killed(module, family, folder, precision):
        (folder / "model.optimized.onnx").write_bytes(b"half a graph")
        raise KeyboardInterrupt

    monkeypatch.setattr(ort_engine, "export_graph", killed)
    with pytest.raises(KeyboardInterrupt):
        ort_engine_of(model_dir)
    assert not [p for p in (cache / "bertforge" / "onnx").iterdir() if not p.name.startswith(".")]
    monkeypatch.undo()
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    engine = ort_engine_of(model_dir)
    assert graph_folder(engine).parent == tmp_path / "cache" / "onnx"
    assert sorted(p.name for p in model_dir.iterdir()) == before


def test_ort_engine_names_the_file_and_the_fix_when_a_graph_cannot_be_loaded_or_written(tmp_path, monkeypatch):
    model_dir = saved_classifier(tmp_path / "model")
    engine = ort_engine_of(model_dir)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a graph")
    said = refusal(lambda: engine.on_graph(broken))
    assert said.startswith(f"{broken}: ONNX Runtime cannot load this graph (InvalidProtobuf")
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "a-file" / "cache"))  # a cache that cannot be made
    said = refusal(lambda: ort_engine_of(model_dir))
    assert "the exported graph cannot be written there" in said and "set BERTFORGE_CACHE" in said


def test_ort_engine_describes_its_threads_and_graph(exports, tmp_path):
    engine = ort_engine_of(saved_classifier(tmp_path / "model"), "int8", threads=1)
    described = engine.describe()
    assert (described["kind"], described["precision"]) == ("onnxruntime", "int8")
    assert (described["threads"], described["intra_op_threads"], described["inter_op_threads"]) == (1, 1, 1)
    assert described["allow_spinning"] is False  # idle pool threads sleep: no CPU time burned beside a neighbour
    options = engine.graph.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    graph = described["graphs"]["model"]
    assert graph["file"].endswith("model.int8.onnx") and graph["outputs"] == ["logits"]
    assert graph["fused"]["Attention"] == make_tiny_config().num_hidden_layers
    assert max(graph["max_abs_diff_fp32"].values()) <= 1e-4
    assert described["converters"] == ["onnx_export", "ort_optimizer", "ort_int8"]


def load_tokenizer_of(directory):
    from bertforge.checkpoint_format import load_tokenizer

    return load_tokenizer(directory)


def refusal(call) -> str:
    with pytest.raises(ConfigError) as error:
        call()
    return str(error.value)


def test_ort_engine_refuses_what_it_cannot_run_naming_the_fix(tmp_path, monkeypatch):
    said = refusal(lambda: plan_engine("cpu", "bf16", "onnxruntime"))
    assert "runs at fp32 or int8, not bf16" in said and "--engine torch" in said
    said = refusal(lambda: plan_engine(torch.device("meta"), "fp32", "onnxruntime"))
    assert "runs on cpu" in said and "--device cpu" in said

    encoder = build_engine(BertModel(make_tiny_config()), plan_engine("cpu", "fp32", "onnxruntime", 1))
    said = refusal(lambda: encoder(torch.tensor([[2, 7, 3]]), output_hidden_states=True))  # embed's `layer` option
    assert "output_hidden_states" in said and "--engine torch" in said

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    said = refusal(lambda: build_engine(BertModel(make_tiny_config()), plan_engine("cpu", "fp32", "onnxruntime")))
    assert "pip install 'bertforge[export]'" in said


def cosines(a: list[list[float]], b: list[list[float]]) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_ort_engine_serves_embedding_and_classification_routes_as_torch(tiny_minilm_model, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.serving.app import create_app

    model_dir = tmp_path / "classifier"
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=load_tokenizer(tiny_minilm_model).vocab_size, id2label=LABELS)
    BertForSequenceClassification(config).save_pretrained(model_dir, tokenizer=load_tokenizer(tiny_minilm_model))
    texts = ["a quietly moving film", "the plot makes no sense at all, and the acting is worse", "fine"]
    answers = {}
    for engine in ("torch", "onnxruntime"):
        with TestClient(create_app(model_dir, device="cpu", precision="fp32", engine=engine, threads=1)) as client:
            health = client.get("/health").json()
            classified = client.post("/v1/classify", json={"inputs": texts})
            embedded = client.post("/v1/embed", json={"inputs": texts})
            openai = client.post("/v1/embeddings", json={"input": texts, "model": "classifier"})
        assert classified.status_code == embedded.status_code == openai.status_code == 200, classified.text
        answers[engine] = (health, classified.json()["outputs"], embedded.json()["outputs"],
                           [row["embedding"] for row in openai.json()["data"]])
    (health, classes, rows, openai_vectors), (torch_health, torch_classes, torch_vectors, torch_openai) = (
        answers["onnxruntime"], answers["torch"])
    described = json.dumps(health)  # /health names the engine and its threads
    assert '"kind": "onnxruntime"' in described and '"intra_op_threads": 1' in described
    assert '"inter_op_threads": 1' in described and '"kind": "onnxruntime"' not in json.dumps(torch_health)
    assert [c["label"] for c in classes] == [c["label"] for c in torch_classes]
    scores = [[c["scores"][k] for k in sorted(c["scores"])] for c in classes]
    torch_scores = [[c["scores"][k] for k in sorted(c["scores"])] for c in torch_classes]
    assert cosines(scores, torch_scores).min() >= SERVED_MIN_COSINE
    vectors, torch_vectors = ([row["embedding"] for row in outputs] for outputs in (rows, torch_vectors))
    assert cosines(vectors, torch_vectors).min() >= SERVED_MIN_COSINE
    assert cosines(openai_vectors, torch_openai).min() >= SERVED_MIN_COSINE


def test_ort_engine_runs_mlm_heads_in_pytorch_on_the_encoder_graph(tiny_sparse_model, tmp_path):
    """Fill-mask and SPLADE vectors ask the model for more than a graph's outputs (masked positions; pooling
    over [B, T, V] logits): the engine runs their heads in PyTorch on the encoder's graph, and the PyTorch encoder
    is not called."""
    from bertforge.inference.pipelines import load_pipeline

    torch.manual_seed(0)
    BertForPretraining(make_tiny_config(vocab_size=load_tokenizer_of(tiny_sparse_model).vocab_size)).save_pretrained(
        tmp_path / "mlm", tokenizer=load_tokenizer_of(tiny_sparse_model))
    encoder_calls: list[str] = []
    for model_dir, task, inputs, family in ((tiny_sparse_model, "embed-sparse", ["a cat sat on the mat"],
                                             "sparse_embedding"),
                                            (tmp_path / "mlm", "fill-mask", ["the cat [MASK] on the mat"],
                                             "pretraining")):
        torch_answer = load_pipeline(model_dir, task, device="cpu")(inputs)
        pipeline = load_pipeline(model_dir, task, device="cpu", engine="onnxruntime")
        pipeline.engine.model.bert.register_forward_hook(lambda *_, task=task: encoder_calls.append(task))
        answer = pipeline(inputs)
        assert encoder_calls == []  # the encoder ran as its graph
        described = pipeline.engine.describe()
        assert described["heads_in_pytorch"] == [family] and list(described["graphs"]) == ["encoder"]
        assert json.dumps(answer)[:40] == json.dumps(torch_answer)[:40]  # the same terms / tokens first
