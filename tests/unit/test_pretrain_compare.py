"""benchmarks.pretrain_compare's shapes: the ModernBERT's GeGLU width brings its non-embedding parameters within
2% of the BERT's, counted on the models themselves (every parameter but the embedding tables)."""

from __future__ import annotations

import pytest
from benchmarks.pretrain_compare import non_embedding_parameters, shapes

from bertforge.tokenization import Tokenizer, Vocab


@pytest.mark.parametrize("layers", [3, 4])
def test_pretrain_compare_shapes_match_non_embedding_parameters(tmp_path, layers):
    words = [f"w{i}" for i in range(995)]
    Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])).save_pretrained(tmp_path)
    chosen = shapes(tmp_path, layers)
    counts = chosen["parameters"]
    assert counts["modernbert"]["layers"] == layers and counts["bert"]["layers"] == 2
    assert abs(counts["non_embedding_ratio"] - 1) < 0.02
    assert chosen["modernbert"]["intermediate_size"] % 8 == 0
    # the count leaves out exactly the tables: a model without embeddings counts every parameter
    from torch import nn

    assert non_embedding_parameters(nn.Linear(3, 2)) == 8
    assert non_embedding_parameters(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))) == 20


def test_pretrain_compare_run_takes_the_lr_and_masking_rate_asked(tmp_path):
    from benchmarks.pretrain_compare import PEAK_LR, TRAIN_MASK_RATE, pretrain_config

    default = pretrain_config("bert", tmp_path, tmp_path / "out", 1, 3.0, {})
    assert (default.training.lr, default.masking.mlm_probability) == (PEAK_LR, TRAIN_MASK_RATE)
    swept = pretrain_config("bert", tmp_path, tmp_path / "out", 1, 3.0, {}, lr=5e-4, mask_rate=0.15)
    assert (swept.training.lr, swept.masking.mlm_probability) == (5e-4, 0.15)
    assert swept.training.minutes == 3.0 and swept.training.budget_clock == "cpu"
