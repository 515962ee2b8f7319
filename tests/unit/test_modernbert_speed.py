"""The ModernBERT speed benchmark compares like with like: the same weights give the same outputs."""

from __future__ import annotations

import pytest
from benchmarks.modernbert_speed import parse_shapes, time_shape, twins

from bertforge.model.config.modernbert import ModernBertConfig


def test_modernbert_speed_twins_give_the_same_outputs():
    pytest.importorskip("transformers")
    config = ModernBertConfig.preset("tiny", vocab_size=64, pad_token_id=0, num_hidden_layers=4,
                                     local_attention=8)
    ours, theirs = twins(config)
    ours_s, theirs_s, diff = time_shape(ours, theirs, rows=2, tokens=24, warmup=0, repeats=1)
    assert diff < 1e-5 and ours_s > 0 and theirs_s > 0


def test_modernbert_speed_shapes_parse():
    assert parse_shapes("32x512,8x2048") == [(32, 512), (8, 2048)]
