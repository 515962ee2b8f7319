"""The fast paths (unpadding, fused QKV, bf16 autocast) equal the plain path within named tolerances."""

import pytest
import torch

from bertforge.model import BertConfig, BertModel
from bertforge.tasks.pretraining import BertForPretraining

FP32_ATOL = 1e-5
BF16_ATOL = 6e-2  # bf16 keeps 8 mantissa bits; LayerNorm outputs are O(1)


def ragged_batch(vocab: int, lengths: list[int], tokens: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), tokens), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    types = (torch.arange(tokens)[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * mask
    return ids, types, mask


def test_unpad_equals_padded_at_real_positions():
    torch.manual_seed(0)
    model = BertModel(BertConfig.preset("mini", vocab_size=500)).eval()
    ids, types, mask = ragged_batch(500, [37, 5, 20, 1], 37)
    with torch.no_grad():
        plain = model(ids, types, mask, output_hidden_states=True)
        model.set_fast_path(unpad=True)
        fast = model(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    for layer, (a, b) in enumerate(zip(plain.hidden_states, fast.hidden_states)):
        assert torch.allclose(a[real], b[real], atol=FP32_ATOL), f"layer {layer} differs"
    assert torch.allclose(plain.pooled_output, fast.pooled_output, atol=FP32_ATOL)
    assert torch.count_nonzero(fast.last_hidden_state[~real]) == 0


def test_fused_qkv_equals_separate_projections():
    torch.manual_seed(1)
    model = BertModel(BertConfig.preset("tiny", vocab_size=300)).eval()
    ids, types, mask = ragged_batch(300, [12, 9], 12)
    with torch.no_grad():
        plain = model(ids, types, mask).last_hidden_state
        model.set_fast_path(fused_qkv=True)
        fused = model(ids, types, mask).last_hidden_state
    assert torch.allclose(plain, fused, atol=FP32_ATOL)
    # The parameters keep their separate (checkpoint) layout.
    assert "encoder.layers.0.attention.query.weight" in model.state_dict()


def test_unpad_gradients_equal_padded_in_pretraining():
    torch.manual_seed(2)
    config = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids, types, mask = ragged_batch(300, [16, 7, 11], 16, seed=3)
    positions = torch.tensor([[1, 4, 9], [2, 5, 0], [3, 8, 10]])
    labels = torch.tensor([[7, 8, 9], [10, 11, -100], [12, 13, 14]])
    nsp = torch.tensor([0, 1, 0])
    grads = []
    for unpad in (False, True):
        torch.manual_seed(4)
        model = BertForPretraining(config)
        model.bert.set_fast_path(unpad=unpad, fused_qkv=unpad)
        out = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp)
        out.loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        losses = out.loss.item()
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key
    assert losses > 0


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(5)
    model = BertModel(BertConfig.preset("mini", vocab_size=500)).eval()
    model.set_fast_path(unpad=True, fused_qkv=True)
    ids, types, mask = ragged_batch(500, [30, 12], 30)
    with torch.no_grad():
        reference = model(ids, types, mask).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids, types, mask).last_hidden_state.float()
    real = mask.bool()
    assert (reference[real] - low[real]).abs().max().item() < BF16_ATOL


@pytest.mark.parametrize("unpad", [False, True])
def test_attention_maps_force_padded_path(unpad):
    model = BertModel(BertConfig.preset("tiny", vocab_size=100)).eval()
    model.set_fast_path(unpad=unpad)
    ids, types, mask = ragged_batch(100, [6, 3], 6)
    with torch.no_grad():
        out = model(ids, types, mask, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 6, 6)
    assert torch.allclose(out.attentions[0].sum(-1), torch.ones(2, 2, 6))


def test_unpad_handles_masks_with_holes():
    """A mask that is not 1s-then-0s (e.g. a masked-out middle token) takes the scatter path, still exact."""
    torch.manual_seed(6)
    model = BertModel(BertConfig.preset("tiny", vocab_size=100)).eval()
    ids, types, mask = ragged_batch(100, [10, 8], 10)
    mask[0, 4] = 0
    with torch.no_grad():
        plain = model(ids, types, mask).last_hidden_state
        model.set_fast_path(unpad=True)
        fast = model(ids, types, mask).last_hidden_state
    real = mask.bool()
    assert torch.allclose(plain[real], fast[real], atol=FP32_ATOL)
