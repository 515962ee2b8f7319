"""`bertforge plot-embeddings` end to end: a corpus embedded by `bertforge embed` (several shards), its map
written as a PNG and TensorBoard projector files whose rows are the corpus' records, in order, with the
labels of the chosen column; and the refusals a user meets (a column the file lacks, an input changed since
it was embedded, a text file, UMAP not installed)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from bertforge import cli
from bertforge.retrieval.embedding_map import sample_rows
from bertforge.retrieval.vector_search import VectorIndex

TOPICS = {"sport": "match goal team player score win league", "food": "bread cheese soup cook taste dinner salt"}


def write_table(path, count=30):
    """A TSV of `count` texts, each of one topic's words, with the topic as a column."""
    rng = np.random.default_rng(0)
    lines = ["text\ttopic\textra"]
    for i in range(count):
        topic = "sport" if i % 3 else "food"
        lines.append(f"{i} " + " ".join(rng.choice(TOPICS[topic].split(), size=6)) + f"\t{topic}\tx")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def embedded(tiny_minilm_model, tmp_path):
    inputs = write_table(tmp_path / "corpus.tsv")
    assert cli.main(["embed", "--model", str(tiny_minilm_model), "--input", str(inputs), "--out",
                     str(tmp_path / "index"), "--shard-size", "8", "--device", "cpu"]) == 0
    return inputs, tmp_path / "index"


def read_tsv(path):
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def all_vectors(index_dir):
    index = VectorIndex(index_dir)
    return np.concatenate([np.asarray(index.shard_vectors(i), np.float32) for i in range(len(index.shards))])


def test_plot_embeddings_writes_png_and_projector_files_row_for_row(embedded, tmp_path, capsys):
    inputs, index = embedded
    rows = [line.split("\t") for line in inputs.read_text(encoding="utf-8").splitlines()[1:]]
    assert cli.main(["plot-embeddings", "--index", str(index), "--label", "topic", "--out", str(tmp_path / "map")]) == 0
    assert "tensorboard --logdir" in capsys.readouterr().err
    out = tmp_path / "map"
    png = (out / "map.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    metadata = read_tsv(out / "metadata.tsv")
    assert metadata[0] == ["id", "label", "text"]
    assert metadata[1:] == [[str(i + 2), topic, text] for i, (text, topic, _) in enumerate(rows)]  # id: the line
    tensors = np.loadtxt(out / "tensors.tsv", delimiter="\t", dtype=np.float32)
    assert np.allclose(tensors, all_vectors(index), rtol=1e-5, atol=1e-6)  # 30 rows across 4 shards, in order
    projection = np.loadtxt(out / "projection.tsv", delimiter="\t")
    assert projection.shape == (30, 2)
    config = (out / "projector_config.pbtxt").read_text(encoding="utf-8")
    assert config.count("embeddings {") == 2
    for line in ('tensor_path: "tensors.tsv"', 'tensor_path: "projection.tsv"', 'metadata_path: "metadata.tsv"',
                 'tensor_name: "index"', 'tensor_name: "index (PCA 2-D)"'):
        assert line in config


def test_plot_embeddings_max_points_keeps_the_seeded_rows_aligned(embedded, tmp_path):
    inputs, index = embedded
    texts = [line.split("\t")[0] for line in inputs.read_text(encoding="utf-8").splitlines()[1:]]
    assert cli.main(["plot-embeddings", "--index", str(index), "--out", str(tmp_path / "few"), "--max-points", "7",
                     "--seed", "5", "--no-png"]) == 0
    kept = sample_rows(30, 7, 5)
    metadata = read_tsv(tmp_path / "few" / "metadata.tsv")
    assert metadata[0] == ["id", "text"] and [row[1] for row in metadata[1:]] == [texts[i] for i in kept]
    tensors = np.loadtxt(tmp_path / "few" / "tensors.tsv", delimiter="\t", dtype=np.float32)
    assert np.allclose(tensors, all_vectors(index)[kept], rtol=1e-5, atol=1e-6)
    assert not (tmp_path / "few" / "map.png").exists()


def test_plot_embeddings_labels_from_a_jsonl_field_of_any_type(tiny_minilm_model, tmp_path):
    records = [{"text": f"text number {i}", "stars": i % 3} for i in range(6)] + [{"text": "no stars"}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert cli.main(["embed", "--model", str(tiny_minilm_model), "--input", str(tmp_path / "c.jsonl"), "--out",
                     str(tmp_path / "index"), "--device", "cpu"]) == 0
    assert cli.main(["plot-embeddings", "--index", str(tmp_path / "index"), "--label", "stars", "--no-png"]) == 0
    labels = [row[1] for row in read_tsv(tmp_path / "index" / "map" / "metadata.tsv")[1:]]
    assert labels == ["0", "1", "2", "0", "1", "2", "(none)"]  # a record without the field: "(none)"
    # A field no record has is a misspelt name, not a map of one colour.
    assert cli.main(["plot-embeddings", "--index", str(tmp_path / "index"), "--label", "star", "--no-png"]) == 2


def test_plot_embeddings_refuses_what_would_draw_a_wrong_map(embedded, tmp_path, capsys):
    inputs, index = embedded
    assert cli.main(["plot-embeddings", "--index", str(index), "--label", "colour"]) == 2
    error = capsys.readouterr().err
    assert "no column 'colour' (columns: text, topic, extra)" in error and "--label" in error
    assert "corpus.tsv" in error
    assert not (index / "map").exists()  # refused before anything was written

    with open(inputs, "a", encoding="utf-8") as handle:
        handle.write("30 one more line\tfood\tx\n")
    assert cli.main(["plot-embeddings", "--index", str(index), "--label", "topic"]) == 2
    assert "is not the input that was embedded (changed: corpus.tsv)" in capsys.readouterr().err

    assert cli.main(["plot-embeddings", "--index", str(tmp_path), "--label", "topic"]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_plot_embeddings_text_input_has_no_label_columns(tiny_minilm_model, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("one text\nanother text\na third\n", encoding="utf-8")
    assert cli.main(["embed", "--model", str(tiny_minilm_model), "--input", str(tmp_path / "c.txt"), "--out",
                     str(tmp_path / "index"), "--device", "cpu"]) == 0
    assert cli.main(["plot-embeddings", "--index", str(tmp_path / "index"), "--label", "topic"]) == 2
    assert "a text file has no columns for --label" in capsys.readouterr().err
    if importlib.util.find_spec("umap") is None:
        assert cli.main(["plot-embeddings", "--index", str(tmp_path / "index"), "--method", "umap"]) == 2
        assert "--method umap needs the umap-learn package" in capsys.readouterr().err
