"""Sliding-window attention computing only the band (`layouts.banded_attention`) against the masked T x T call
it replaces (`layouts.windowed` + one SDPA call), and a ModernBERT's local layers on it against the masked path,
at lengths that are not multiples of the block, in padded batches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertforge.model import layouts
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.model.layouts import banded_attention, computes_band_only, windowed
from bertforge.model.modernbert import ModernBertModel

# The same float32 products in another order.
ATOL = 1e-5


def masked_reference(q, k, v, heads, window, real):
    """The masked T x T call: q, k, v [B, T, H] -> [B, T, H]."""
    batch, tokens, hidden = q.shape
    mask, sighted = windowed(None if real is None else real[:, None, None, :], tokens, window, q.device)

    def split(x):
        return x.view(batch, tokens, heads, hidden // heads).transpose(1, 2)

    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask) * sighted
    return out.transpose(1, 2).reshape(batch, tokens, hidden)


@pytest.mark.parametrize("tokens,window", [(37, 4), (64, 8), (9, 2), (130, 64), (5, 8)])
@pytest.mark.parametrize("padded", [False, True])
def test_banded_attention_equals_the_masked_call_at_every_position(tokens, window, padded):
    generator = torch.Generator().manual_seed(tokens * window)
    q, k, v = (torch.randn(3, tokens, 12, generator=generator) for _ in range(3))
    real = None
    if padded:  # rows ending early; the last one after 2 tokens, its padding queries far from any real key
        real = torch.ones(3, tokens, dtype=torch.bool)
        real[1, tokens - tokens // 3:] = False
        real[2, 2:] = False
    got = banded_attention(q, k, v, 3, window, real)
    assert got.shape == q.shape
    torch.testing.assert_close(got, masked_reference(q, k, v, 3, window, real), atol=ATOL, rtol=0)


def test_banded_attention_is_chosen_for_rows_longer_than_four_windows_and_never_while_tracing():
    assert computes_band_only(257, 64) and not computes_band_only(256, 64) and not computes_band_only(512, None)
    seen = []  # (tracing, chosen) of every call the tracer makes
    torch.jit.trace(lambda x: (seen.append((torch.jit.is_tracing(), computes_band_only(512, 64))), x)[1] * 2,
                    torch.ones(1))
    assert (True, False) in seen and all(chosen != tracing for tracing, chosen in seen)


def model_pair(window: int):
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                              num_attention_heads=2, pad_token_id=0, local_attention=2 * window)
    return ModernBertModel(config).eval(), config


@pytest.mark.parametrize("unpad", [False, True])
def test_modernbert_local_layers_on_the_band_equal_the_masked_path(monkeypatch, unpad):
    """Rows of 45 tokens (not a multiple of the window of 4 each side), padded and not: the model on its banded
    path equals the model with every local layer on the masked T x T call, at every real position; the banded
    blocks' mask is made once per forward and shared by the local layers."""
    model, config = model_pair(window=4)
    set_fast_paths(model, unpad=unpad)
    ids = torch.randint(1, config.vocab_size, (5, 45), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    for row, length in enumerate([45, 30, 19, 3, 45]):
        mask[row, length:] = 0
    calls, masks_made = [], []
    real_banded, real_mask = layouts.banded_attention, layouts.band_blocks_mask

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real_banded(*args, **kwargs)

    def counted_mask(*args, **kwargs):
        masks_made.append(args[:2])
        return real_mask(*args, **kwargs)

    with torch.no_grad():
        monkeypatch.setattr(layouts, "banded_attention", counted)
        monkeypatch.setattr(layouts, "band_blocks_mask", counted_mask)
        banded = model(ids, attention_mask=mask).last_hidden_state
        monkeypatch.setattr(layouts, "computes_band_only", lambda tokens, window: False)
        masked = model(ids, attention_mask=mask).last_hidden_state
    assert len(calls) == 2  # the two local layers of three (layer 0 is global), once each over the batch
    assert masks_made == [(5, 45)]  # their mask made once, for both
    real = mask.bool()
    torch.testing.assert_close(banded[real], masked[real], atol=ATOL, rtol=0)
    assert not banded.isnan().any()


@pytest.mark.parametrize("tokens", [16, 40])  # the one masked call (T <= 4 windows), the band (T > 4 windows)
def test_local_attention_query_that_sees_no_key_gets_zero_as_torch_sdpa_gives(tokens):
    """A masked query farther than the window from every real key (ColBERT's non-attended query expansion, which
    `compute_masked` keeps) gets a zero context, as torch's SDPA (and so transformers' ModernBERT) gives a query
    whose mask row is empty, not its own value; the others are SDPA's on the plain banded mask."""
    window, heads = 4, 2
    generator = torch.Generator().manual_seed(tokens)
    q, k, v = (torch.randn(2, tokens, 8, generator=generator) for _ in range(3))
    real = torch.ones(2, tokens, dtype=torch.bool)
    real[1, 3:] = False  # row 1: 3 real tokens, queries from position 8 on see no real key
    plain = layouts.band(tokens, window, q.device)[None, None] & real[:, None, None, :]  # [2, 1, T, T]

    def split(x):
        return x.view(2, tokens, heads, 4).transpose(1, 2)

    reference = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=plain)
    reference = reference.transpose(1, 2).reshape(2, tokens, 8)
    got, _ = layouts.Padded(real[:, None, None, :]).attend(q, k, v, heads, 0.0, False, window)
    assert computes_band_only(tokens, window) == (tokens > 16)
    assert (got[1, 3 + window + 1:] == 0).all() and (reference[1, 3 + window + 1:] == 0).all()
    torch.testing.assert_close(got, reference, atol=ATOL, rtol=0)
