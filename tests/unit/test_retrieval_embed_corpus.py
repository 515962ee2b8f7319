"""`bertforge embed`'s engine and `bertforge search`'s, in one process, on a tiny random model with the real
MiniLM vocabulary: shards equal the pipeline's vectors, ids are line-based, a crashed run resumes to the same
bytes, a changed run is refused, bad lines are named, and search is exact."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.errors import ConfigError, DataError, InputError
from bertforge.inference.pipelines import load_pipeline
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import store
from bertforge.retrieval import vector_search as S

EMBED_SETTINGS = {f.name for f in dataclasses.fields(E.EmbedSettings)}

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()


def sentences(count: int, seed: int = 0) -> list[str]:
    """`count` distinct sentences of 3 to 30 words (lengths vary, so batching by length matters)."""
    rng = np.random.default_rng(seed)
    return [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 30)))) for i in range(count)]


def shard_files(out: Path) -> dict[str, bytes]:
    """Every shard file's bytes (vectors and ids), by name."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name.startswith(("vectors-", "ids-"))}


def all_ids(out: Path) -> list[str]:
    manifest = json.loads((out / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    return [json.loads(line) for shard in manifest["shards"]
            for line in (out / shard["ids"]).read_text(encoding="utf-8").splitlines()]


def all_vectors(out: Path) -> np.ndarray:
    manifest = json.loads((out / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    return np.concatenate([np.load(out / shard["vectors"]) for shard in manifest["shards"]])


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, list[str]]:
    """A text file of 23 sentences with blank lines among them (line numbers skip them)."""
    texts = sentences(23)
    lines = []
    for index, text in enumerate(texts):
        lines.append(text)
        if index % 5 == 2:
            lines.extend(["", "   "])
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, texts


def run(model, inputs, out, **options):
    """`embed_corpus` on the CPU in shards of 5, batches of 4; `options` of `EmbedSettings` go into it."""
    embedding = {name: options.pop(name) for name in [*options] if name in EMBED_SETTINGS}
    return E.embed_corpus(model, inputs, out, E.EmbedSettings(**embedding), device="cpu",
                          **{"shard_size": 5, "batch_size": 4, **options})


# --- what the shards hold ------------------------------------------------------------------------------

def test_embed_corpus_shards_equal_pipeline_encode(tiny_minilm_model, corpus, tmp_path):
    path, texts = corpus
    manifest = run(tiny_minilm_model, path, tmp_path / "out", normalize=True)
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu", batch_size=4)
    assert manifest["complete"] and manifest["count"] == 23 and len(manifest["shards"]) == 5
    assert [s["count"] for s in manifest["shards"]] == [5, 5, 5, 5, 3]
    assert manifest["embedding"] == {"pooling": "mean", "normalize": True, "layer": -1, "prompt": "",
                                     "max_length": 64, "precision": "fp32"}
    assert manifest["similarity"] == "cosine" and manifest["dim"] == 32
    for index, shard in enumerate(manifest["shards"]):
        stored = np.load(tmp_path / "out" / shard["vectors"])
        # the same texts through `encode`, batched as the shard was: the same floats
        np.testing.assert_array_equal(stored, pipeline.encode(texts[5 * index:5 * index + 5], normalize=True))
    np.testing.assert_allclose(all_vectors(tmp_path / "out"), pipeline.encode(texts, normalize=True), atol=1e-6)
    assert manifest["tokens"] == sum(len(pipeline.tokenizer.encode(t, max_length=64, truncation=True).ids)
                                     for t in texts)


def test_embed_corpus_ids_are_line_numbers_with_blank_lines_counted(tiny_minilm_model, corpus, tmp_path):
    path, texts = corpus
    run(tiny_minilm_model, path, tmp_path / "out")
    lines = path.read_text(encoding="utf-8").splitlines()
    ids = all_ids(tmp_path / "out")
    assert len(ids) == len(texts) and ids[:4] == ["1", "2", "3", "6"]
    assert [lines[int(i) - 1] for i in ids] == texts


def test_embed_corpus_folder_ids_name_the_file_and_read_files_in_sorted_order(tiny_minilm_model, tmp_path):
    folder = tmp_path / "books"
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "two.txt").write_text("second file first line\n\nsecond file third line\n", encoding="utf-8")
    (folder / "a.txt").write_text("first file\n", encoding="utf-8")
    (folder / ".hidden.txt").write_text("never read\n", encoding="utf-8")
    run(tiny_minilm_model, folder, tmp_path / "out")
    assert all_ids(tmp_path / "out") == ["a.txt:1", "b/two.txt:1", "b/two.txt:3"]


def test_embed_corpus_reads_ids_and_texts_from_tables_and_jsonl(tiny_minilm_model, tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    (folder / "a.tsv").write_text("id\ttext\nt1\tfirst row\n\nt2\tsecond row\n", encoding="utf-8")
    (folder / "b.csv").write_text('text,id\n"a quoted\nmulti-line text",c1\nplain,c2\n', encoding="utf-8")
    (folder / "c.jsonl").write_text('{"text": "with id", "id": 7}\n{"text": "without id"}\n', encoding="utf-8")
    run(tiny_minilm_model, folder, tmp_path / "out")
    assert all_ids(tmp_path / "out") == ["t1", "t2", "c1", "c2", "7", "c.jsonl:2"]
    # another column as the text, by name and by index; a named id column must be in every record
    (folder / "c.jsonl").unlink()
    (folder / "b.csv").unlink()
    run(tiny_minilm_model, folder, tmp_path / "by_index", settings=E.CorpusSettings(text_column="1", id_column="0"))
    assert all_ids(tmp_path / "by_index") == ["t1", "t2"]
    with pytest.raises(DataError, match=r"a\.tsv:1: the header has no text column 'body' .*--text-column"):
        run(tiny_minilm_model, folder, tmp_path / "nobody", settings=E.CorpusSettings(text_column="body"))


def test_embed_corpus_prompt_and_concatenated_pooling_are_encode_s(tiny_minilm_model, corpus, tmp_path):
    path, texts = corpus
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu", batch_size=4)
    manifest = run(tiny_minilm_model, path, tmp_path / "out", shard_size=23, prompt="passage: ", pooling="cls+mean")
    assert manifest["embedding"]["prompt"] == "passage: " and manifest["dim"] == 64  # two poolings side by side
    np.testing.assert_array_equal(all_vectors(tmp_path / "out"),
                                  pipeline.encode(texts, prompt="passage: ", pooling="cls+mean"))
    with pytest.raises(ConfigError, match="prompt 'passage: ' -> ''"):
        run(tiny_minilm_model, path, tmp_path / "out", shard_size=23, pooling="cls+mean")
    with pytest.raises(InputError, match="pooling must be one of"):
        run(tiny_minilm_model, path, tmp_path / "bad", pooling="median")


def test_embed_corpus_float16_holds_the_float32_vectors_rounded(tiny_minilm_model, corpus, tmp_path):
    path, _ = corpus
    run(tiny_minilm_model, path, tmp_path / "f32")
    manifest = run(tiny_minilm_model, path, tmp_path / "f16", dtype="float16")
    half = all_vectors(tmp_path / "f16")
    assert manifest["dtype"] == "float16" and half.dtype == np.float16
    np.testing.assert_array_equal(half, all_vectors(tmp_path / "f32").astype(np.float16))


def test_embed_corpus_batches_by_length_inside_a_shard(tiny_minilm_model, corpus, tmp_path, monkeypatch):
    path, _ = corpus
    widths: list[int] = []
    original = E.EmbedPipeline.family_forward

    def recording(self, options):
        forward = original(self, options)

        def run_batch(model, batch):
            widths.append(int(batch.attention_mask.sum(1).max()))  # the batch's longest text
            return forward(model, batch)
        return run_batch

    monkeypatch.setattr(E.EmbedPipeline, "family_forward", recording)
    run(tiny_minilm_model, path, tmp_path / "out", shard_size=23, batch_size=4)
    shard = widths[1:]  # after the manifest's one-text probe of the vectors' width
    assert shard == sorted(shard) and len(shard) == 6  # one shard of 23, its 6 batches shortest first


# --- resuming ------------------------------------------------------------------------------------------

def test_embed_corpus_resume_after_a_crash_is_byte_identical(tiny_minilm_model, corpus, tmp_path, monkeypatch):
    path, _ = corpus
    run(tiny_minilm_model, path, tmp_path / "whole")
    crashed = tmp_path / "crashed"
    real_write = E.write_shard
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    temporary = f".vectors-00003.npy.tmp-{int(gone.stdout)}-0123456789ab"  # storage's name, of a process now gone

    def crash_in_shard_3(out, index, ids, vectors, dtype, tokens, *rest):
        if index == 3:  # as if killed while writing: a temporary file and shard 3's vectors, no record
            (out / temporary).write_bytes(b"half")
            (out / "vectors-00003.npy").write_bytes(b"stale bytes of an unrecorded shard")
            raise KeyboardInterrupt
        return real_write(out, index, ids, vectors, dtype, tokens, *rest)

    monkeypatch.setattr(E, "write_shard", crash_in_shard_3)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_minilm_model, path, crashed)
    monkeypatch.setattr(E, "write_shard", real_write)
    manifest = json.loads((crashed / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    assert not manifest["complete"] and sorted(p.name for p in (crashed / "progress").iterdir()) == [
        "shard-00000.json", "shard-00001.json", "shard-00002.json"]
    done_before = {name: (crashed / name).stat().st_mtime_ns for name in ("vectors-00000.npy", "ids-00002.jsonl")}

    embedded: list[int] = []
    real_embed = E.embed_shard
    monkeypatch.setattr(E, "embed_shard", lambda *a: embedded.append(len(a[3])) or real_embed(*a))
    run(tiny_minilm_model, path, crashed)
    assert embedded == [5, 3]  # only shards 3 and 4 ran again
    assert shard_files(crashed) == shard_files(tmp_path / "whole")
    assert not (crashed / temporary).exists()
    assert {name: (crashed / name).stat().st_mtime_ns for name in done_before} == done_before
    whole = json.loads((tmp_path / "whole" / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    assert json.loads((crashed / store.MANIFEST_NAME).read_text(encoding="utf-8")) == whole

    embedded.clear()  # a finished folder: nothing to do
    assert run(tiny_minilm_model, path, crashed)["complete"] and embedded == []
    (crashed / "vectors-00001.npy").unlink()  # a shard lost after the run: the rerun rewrites just it
    run(tiny_minilm_model, path, crashed)
    assert embedded == [5] and shard_files(crashed) == shard_files(tmp_path / "whole")


def test_embed_corpus_refuses_a_changed_input_model_or_option(tiny_minilm_model, corpus, tmp_path):
    path, _ = corpus
    out = tmp_path / "out"
    run(tiny_minilm_model, path, out)
    with pytest.raises(ConfigError, match=r"pooling 'mean' -> 'cls'.*choose another --out"):
        run(tiny_minilm_model, path, out, pooling="cls")
    with pytest.raises(ConfigError, match=r"dtype 'float32' -> 'float16'; shard_size 5 -> 6"):
        run(tiny_minilm_model, path, out, dtype="float16", shard_size=6)
    other = tmp_path / "other_model"
    shutil.copytree(tiny_minilm_model, other)
    moved = run(other, path, out)  # the same model's files elsewhere: the same vectors, nothing to redo
    assert moved["complete"]
    weights = other / "model.safetensors"
    from safetensors.torch import load_file, save_file
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, weights)
    (other / "checksums.json").unlink()  # as another tool's save: bertforge's checksum would refuse the edit
    with pytest.raises(ConfigError, match="another model"):
        run(other, path, out)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("one more line\n")
    with pytest.raises(ConfigError, match=r"the input files changed \(corpus\.txt\)"):
        run(tiny_minilm_model, path, out)
    stamp = os.stat(path)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))  # touched: refused as well
    with pytest.raises(ConfigError, match="input files changed"):
        run(tiny_minilm_model, path, out)


def test_embed_corpus_refuses_a_folder_it_did_not_write(tiny_minilm_model, corpus, tmp_path):
    path, _ = corpus
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"busy is not empty \(notes\.txt ...\) and holds no manifest\.json"):
        run(tiny_minilm_model, path, tmp_path / "busy")
    with pytest.raises(ConfigError, match="shard_size must be a positive integer"):
        run(tiny_minilm_model, path, tmp_path / "x", shard_size=0)


# --- bad input -----------------------------------------------------------------------------------------

def test_embed_corpus_bad_jsonl_line_names_file_and_line_before_its_shard_runs(tiny_minilm_model, tmp_path):
    rows = [json.dumps({"text": f"row {i}"}) for i in range(7)]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(rows[:6] + ["{not json"] + rows[6:]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c\.jsonl:7: not valid JSON .*fix or remove the line"):
        run(tiny_minilm_model, path, tmp_path / "out")
    assert (tmp_path / "out" / "vectors-00000.npy").exists()  # shard 0 (lines 1-5) was fine
    assert not (tmp_path / "out" / "vectors-00001.npy").exists()  # shard 1 never reached the model
    path.write_text(rows[0] + "\n" + json.dumps({"body": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c\.jsonl:2: no 'text' in this record \(fields: body\).*--text-field"):
        run(tiny_minilm_model, path, tmp_path / "out2")
    path.write_text(json.dumps({"text": 3}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c\.jsonl:1: the text \('text'\) must be a string, got int"):
        run(tiny_minilm_model, path, tmp_path / "out3")


def test_embed_corpus_not_utf8_and_empty_inputs_are_one_clear_error(tiny_minilm_model, tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    with pytest.raises(DataError, match=r"latin\.txt:2: is not valid UTF-8.*iconv"):
        run(tiny_minilm_model, latin, tmp_path / "out")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match="no texts to embed"):
        run(tiny_minilm_model, blank, tmp_path / "out2")
    with pytest.raises(DataError, match="no such file or folder"):
        run(tiny_minilm_model, tmp_path / "missing.txt", tmp_path / "out3")


# --- shards among ranks --------------------------------------------------------------------------------

def test_embed_corpus_shard_chunks_give_a_rank_only_its_own_records():
    records = [(None, line, f"text {line}") for line in range(1, 24)]  # 23 records, shards of 5
    ranks = E.Ranks(rank=1, world_size=3)
    chunks = list(E.shard_chunks(records, 5, ranks.owns))
    assert [(index, count) for index, count, _ in chunks] == [(0, 5), (1, 5), (2, 5), (3, 5), (4, 3)]
    assert [index for index, _, chunk in chunks if chunk is not None] == [1, 4]
    assert [r[1] for r in chunks[4][2]] == [21, 22, 23]


def test_embed_corpus_ranks_come_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert E.Ranks.from_env() == E.Ranks(2, 4, 0)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="RANK=4 must be below WORLD_SIZE=4 .*; launch with torchrun"):
        E.Ranks.from_env()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    assert E.Ranks.from_env() == E.Ranks(0, 1, 0)


# --- search --------------------------------------------------------------------------------------------

@pytest.fixture
def index(tiny_minilm_model, tmp_path) -> tuple[Path, list[str]]:
    texts = sentences(41, seed=3)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    run(tiny_minilm_model, path, tmp_path / "index", shard_size=9, normalize=True)
    return tmp_path / "index", texts


def test_vector_search_top1_of_a_corpus_text_is_itself(index):
    folder, texts = index
    queries = [texts[0], texts[17], texts[40]]
    results = S.search(folder, queries, top_k=3, device="cpu")
    assert [hits[0][0] for hits in results] == ["1", "18", "41"]
    assert all(hits[0][1] == pytest.approx(1.0, abs=1e-5) for hits in results)  # normalized: the cosine
    assert all(len(hits) == 3 and hits[0][1] >= hits[1][1] >= hits[2][1] for hits in results)


def test_vector_search_equals_brute_force_numpy(index):
    folder, _ = index
    corpus = all_vectors(folder)
    index_ = S.VectorIndex(folder)
    queries = np.random.default_rng(0).standard_normal((7, 32)).astype(np.float32)
    for k in (1, 5, 41, 100):
        scores, rows = index_.search_vectors(queries, k)
        brute = queries @ corpus.T
        order = np.argsort(-brute, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(rows, order)
        np.testing.assert_allclose(scores, np.take_along_axis(brute, order, axis=1), rtol=1e-6, atol=1e-6)
    assert index_.ids_at(rows[:1, :3]) == [[str(r + 1) for r in rows[0, :3]]]


def test_vector_search_scans_float16_shards_and_blocks(index, tiny_minilm_model, tmp_path, monkeypatch):
    folder, texts = index
    path = tmp_path / "corpus.txt"
    run(tiny_minilm_model, path, tmp_path / "half", shard_size=9, normalize=True, dtype="float16")
    monkeypatch.setattr(S, "BLOCK_ROWS", 4)  # several blocks per shard
    monkeypatch.setattr(S, "QUERY_BLOCK", 2)
    half = S.VectorIndex(tmp_path / "half")
    queries = np.random.default_rng(1).standard_normal((5, 32)).astype(np.float32)
    brute = queries @ all_vectors(tmp_path / "half").astype(np.float32).T
    scores, rows = half.search_vectors(queries, 6)
    np.testing.assert_array_equal(rows, np.argsort(-brute, axis=1, kind="stable")[:, :6])


def test_vector_search_equal_scores_rank_the_earlier_row_first():
    scores = np.array([[1, 2, 2, 0, 2, 2], [5, 5, 5, 5, 5, 5]], dtype=np.float32)
    top, rows = S.block_top_k(scores, 100, 3)
    np.testing.assert_array_equal(rows, [[101, 102, 104], [100, 101, 102]])
    merged = S.top_k_merge(np.array([[2.0, 1.0, 2.0]]), np.array([[7, 3, 5]]), 2)
    np.testing.assert_array_equal(merged[1], [[5, 7]])


def test_vector_search_refuses_an_unfinished_index_another_model_or_bad_k(index, tiny_minilm_model, tmp_path):
    folder, texts = index
    with pytest.raises(InputError, match="top_k must be a positive integer"):
        S.search(folder, ["x"], top_k=0, device="cpu")
    from bertforge.model.bert import BertModel
    from bertforge.tokenization import Tokenizer

    other = tmp_path / "other"
    model = BertModel.from_pretrained(tiny_minilm_model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    model.save_pretrained(other, tokenizer=Tokenizer.from_pretrained(tiny_minilm_model))
    with pytest.raises(ConfigError, match="is not the model that embedded"):
        S.search(folder, ["x"], model=other, device="cpu")
    manifest = json.loads((folder / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    (folder / store.MANIFEST_NAME).write_text(json.dumps({**manifest, "complete": False}), encoding="utf-8")
    with pytest.raises(ConfigError, match="has not finished; rerun the same `bertforge embed`"):
        S.VectorIndex(folder)
    with pytest.raises(ConfigError, match="no manifest.json"):
        S.VectorIndex(tmp_path)


def test_vector_search_on_all_minilm_finds_each_text_and_its_paraphrase(minilm_path, tmp_path):
    texts = ["A man is playing a guitar.", "The stock market fell sharply today.", "A cat sleeps on the sofa.",
             "Heavy rain flooded the streets of the city.", "She is cooking pasta in the kitchen.",
             "The football team won the championship.", "Scientists discovered a new planet."]
    (tmp_path / "corpus.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    manifest = run(minilm_path, tmp_path / "corpus.txt", tmp_path / "index", shard_size=3)
    # the sentence-transformers directory's own settings: mean pooling, normalized, 256 tokens
    assert manifest["similarity"] == "cosine" and manifest["dim"] == 384
    assert manifest["embedding"]["max_length"] == 256 and manifest["embedding"]["pooling"] == "mean"
    results = S.search(tmp_path / "index", [texts[3], "Someone plays the guitar.", "a kitten napping on a couch"],
                       top_k=2, device="cpu")
    assert [hits[0][0] for hits in results] == ["4", "1", "3"]
    assert results[0][0][1] == pytest.approx(1.0, abs=1e-5) and results[1][0][1] < 0.99
