"""Packed rows (`sequence_ids`) in the ModernBERT encoder and its masked LM: each packed sequence gives what it
gives alone in a row of its own, in both layouts, global and local layers, sequences shorter and longer than the
window (and long enough for the band-only attention when alone)."""

from __future__ import annotations

import pytest
import torch

from bertforge.data.collate import IGNORE_INDEX
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.model.modernbert import ModernBertForMaskedLM

ATOL = 1e-5  # fp32: the same products in another order
WINDOW = 4  # each side: `local_attention` 8
# Rows of packed sequence lengths (the rest of a row is padding). "few": at most 4 sequences in the batch, the
# unpadded layout's per-sequence calls; "many": more, its one masked call. Lengths 3 and 6 lie within a window,
# 12 beyond it, 21 and 28 beyond 4 windows (a sequence alone then attends block by block).
PACKINGS = {"few": [[3, 21], [12, 28]], "many": [[3, 21, 6], [12, 28], [2, 2, 5]]}
TOKENS = 40


def masked_lm() -> ModernBertForMaskedLM:
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                              num_attention_heads=2, pad_token_id=0, local_attention=2 * WINDOW,
                              max_position_embeddings=64)
    model = ModernBertForMaskedLM(config).eval()
    assert model.bert.encoder.layers[0].attention.window is None  # global, then two local layers
    assert model.bert.encoder.layers[1].attention.window == WINDOW
    return model


def packed_batch(rows: list[list[int]]):
    """(input_ids [B, T], sequence_ids [B, T], the sequences as (row, start, length))."""
    generator = torch.Generator().manual_seed(7)
    ids = torch.zeros(len(rows), TOKENS, dtype=torch.long)
    sequence_ids = torch.zeros_like(ids)
    spans = []
    for row, lengths in enumerate(rows):
        start = 0
        for number, length in enumerate(lengths, 1):
            ids[row, start:start + length] = torch.randint(5, 97, (length,), generator=generator)
            sequence_ids[row, start:start + length] = number
            spans.append((row, start, length))
            start += length
    return ids, sequence_ids, spans


@pytest.mark.parametrize("packing", sorted(PACKINGS))
@pytest.mark.parametrize("unpad", [False, True])
def test_modernbert_packed_sequences_equal_each_sequence_alone(packing, unpad):
    model = masked_lm()
    ids, sequence_ids, spans = packed_batch(PACKINGS[packing])
    set_fast_paths(model, unpad=unpad, fused_qkv=False)
    with torch.no_grad():
        packed = model.bert(ids, sequence_ids=sequence_ids, output_hidden_states=True)
        set_fast_paths(model, unpad=False, fused_qkv=False)
        for row, start, length in spans:
            alone = model.bert(ids[row:row + 1, start:start + length], output_hidden_states=True)
            for got, expected in zip(packed.hidden_states, alone.hidden_states):
                torch.testing.assert_close(got[row, start:start + length], expected[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(packed.last_hidden_state[row, start:start + length],
                                       alone.last_hidden_state[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("unpad", [False, True])
def test_modernbert_masked_lm_packed_loss_and_logits_equal_each_sequence_alone(unpad):
    model = masked_lm()
    ids, sequence_ids, spans = packed_batch(PACKINGS["many"])
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, ::3] = ids[:, ::3]
    labels[sequence_ids == 0] = IGNORE_INDEX
    set_fast_paths(model, unpad=unpad, fused_qkv=False)
    with torch.no_grad():
        packed = model(ids, attention_mask=(sequence_ids > 0).long(), sequence_ids=sequence_ids, mlm_labels=labels)
        set_fast_paths(model, unpad=False, fused_qkv=False)
        loss_sum = correct = count = 0.0
        for row, start, length in spans:
            piece = slice(start, start + length)
            alone = model(ids[row:row + 1, piece], mlm_labels=labels[row:row + 1, piece])
            torch.testing.assert_close(packed.logits[row, piece], alone.logits[0], atol=ATOL, rtol=0)
            loss_sum, correct = loss_sum + float(alone.mlm_loss_sum), correct + float(alone.mlm_correct)
            count += float(alone.mlm_count)
    assert float(packed.mlm_count) == count > 0 and float(packed.mlm_correct) == correct
    assert float(packed.mlm_loss_sum) == pytest.approx(loss_sum, rel=1e-5)
    assert float(packed.loss) == pytest.approx(loss_sum / count, rel=1e-5)


def test_modernbert_packed_attention_maps_stay_inside_each_sequence_and_window():
    model = masked_lm()
    ids, sequence_ids, _ = packed_batch(PACKINGS["many"])
    with torch.no_grad():
        maps = model.bert(ids, sequence_ids=sequence_ids, output_attentions=True).attentions  # 3 x [B, N, T, T]
    real = sequence_ids > 0
    apart = (sequence_ids[:, :, None] != sequence_ids[:, None, :]) & real[:, :, None]  # [B, T, T] real queries
    index = torch.arange(TOKENS)
    far = (index[:, None] - index[None, :]).abs() > WINDOW  # [T, T]
    assert float(maps[0].amax(1)[apart].max()) == 0.0  # global layer: nothing from another sequence
    for local in maps[1:]:
        assert float(local.amax(1)[apart | (far & real[:, :, None])].max()) == 0.0
        assert float(local.amax(1)[~apart & ~far & real[:, :, None] & real[:, None, :]].min()) > 0.0
