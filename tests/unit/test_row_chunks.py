"""Row chunks (`engine/row_chunks.py`): a large CPU inference batch runs through the encoder in chunks of rows,
and gives what one piece gives."""

from __future__ import annotations

import torch
from test_fast_paths import FP32_ATOL, ragged_batch

from bertforge.engine.row_chunks import (
    ROW_CHUNK_BYTES,
    ChunkedRows,
    chunk_rows,
    chunks_rows,
    row_chunk_tokens,
)
from bertforge.model import BertConfig, BertModel
from bertforge.model.fast_paths import set_fast_paths


def test_row_chunks_equal_one_piece_for_every_output(monkeypatch):
    """Hidden states, pooled output, every layer's states and attention maps, plain and packed rows."""
    torch.manual_seed(21)
    model = chunk_rows(BertModel(BertConfig.preset("tiny", vocab_size=200)).eval(), tokens=40)  # 7 x 16: 2 rows
    calls = []
    forward = BertModel.forward
    monkeypatch.setattr(BertModel, "forward", lambda self, ids, *rest: calls.append(ids.shape[0]) or
                        forward(self, ids, *rest))
    ids, types, mask = ragged_batch(200, [16, 3, 9, 16, 1, 12, 7], 16, seed=3)
    with torch.no_grad():
        for outputs in ({}, {"output_hidden_states": True, "output_attentions": True}):
            calls.clear()
            chunked = model(ids, types, mask, **outputs)
            assert calls == [2, 2, 2, 1]
            chunk_rows(model, tokens=0)
            whole = model(ids, types, mask, **outputs)
            chunk_rows(model, tokens=40)
            for field in ("last_hidden_state", "pooled_output"):
                torch.testing.assert_close(getattr(chunked, field), getattr(whole, field), atol=FP32_ATOL, rtol=0)
            for name in ("hidden_states", "attentions"):
                if outputs:
                    for a, b in zip(getattr(chunked, name), getattr(whole, name), strict=True):
                        torch.testing.assert_close(a, b, atol=FP32_ATOL, rtol=0)
        sequence_ids = torch.tensor([[1] * 8 + [2] * 8] * 3 + [[1] * 16])  # packed rows: pooled is [S, H]
        chunked = model(ids[:4], sequence_ids=sequence_ids)
        chunk_rows(model, tokens=0)
        whole = model(ids[:4], sequence_ids=sequence_ids)
    assert chunked.pooled_output.shape == (7, model.config.hidden_size)
    torch.testing.assert_close(chunked.pooled_output, whole.pooled_output, atol=FP32_ATOL, rtol=0)


def test_row_chunks_only_for_inference_without_gradients():
    model = chunk_rows(BertModel(BertConfig.preset("tiny", vocab_size=50)), tokens=32)
    assert isinstance(model, ChunkedRows) and isinstance(model, BertModel) and chunks_rows(model)
    ids = torch.ones(8, 16, dtype=torch.long)
    with torch.no_grad():
        assert model.rows_per_chunk(ids) == 2
        assert model.rows_per_chunk(ids[:2]) == 0  # within the budget: one piece
        assert model.rows_per_chunk(torch.ones(3, 64, dtype=torch.long)) == 1  # a row over the budget: row by row
    assert model.rows_per_chunk(ids) == 0  # gradients on: training keeps its batch whole
    set_fast_paths(model, unpad=False, fused_qkv=False)  # the plain path chunks too: rows never see each other
    with torch.no_grad():
        assert model.rows_per_chunk(ids) == 2
    assert not chunks_rows(chunk_rows(model, tokens=0)) and not chunks_rows(BertModel(model.config))


def test_row_chunk_tokens_hold_the_feed_forward_activation_at_the_byte_budget():
    assert row_chunk_tokens(BertConfig.preset("base", vocab_size=100)) == 1024  # I = 3,072
    assert row_chunk_tokens(BertConfig(vocab_size=100, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                       intermediate_size=1536)) == 2048  # all-MiniLM-L6-v2
    assert row_chunk_tokens(BertConfig.preset("large", vocab_size=100)) == 768  # I = 4,096
    config = BertConfig.preset("tiny", vocab_size=100)
    model = chunk_rows(BertModel(config))
    assert model.row_chunk_tokens == ROW_CHUNK_BYTES // (4 * config.intermediate_size)
