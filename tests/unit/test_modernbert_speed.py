"""The ModernBERT speed benchmark compares like with like: the same weights give the same outputs, on each side."""

from __future__ import annotations

import copy

import pytest
import torch
from benchmarks.modernbert_speed import parse_shapes, time_shape, twins

from bertforge.engine.build import build_engine
from bertforge.engine.plan import EnginePlan
from bertforge.model.config.modernbert import ModernBertConfig


def test_modernbert_speed_twins_give_the_same_outputs():
    pytest.importorskip("transformers")
    config = ModernBertConfig.preset("tiny", vocab_size=64, pad_token_id=0, num_hidden_layers=4,
                                     local_attention=8)
    ours, theirs = twins(config)
    engine = build_engine(copy.deepcopy(ours), EnginePlan(torch.device("cpu"), "fp32", "torch", threads=1))
    # 24 tokens, a window of 4 each side: the local layers take the banded path
    result = time_shape(ours, theirs, rows=2, tokens=24, warmup=0, repeats=1, engine=engine)
    assert result["diff"] < 1e-5
    assert all(result[side][0] > 0 and result[side][1] >= 0 for side in ("ours", "theirs", "engine"))


def test_modernbert_speed_shapes_parse():
    assert parse_shapes("32x512,8x2048") == [(32, 512), (8, 2048)]
