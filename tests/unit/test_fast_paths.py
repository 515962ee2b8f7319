"""The fast paths (unpadding, fused QKV, bf16 autocast) equal the plain path within named tolerances."""

import numpy as np
import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.errors import InputError
from bertforge.model import BertConfig, BertModel
from bertforge.model.bert import set_fast_paths
from bertforge.tasks.classification import BertForSequenceClassification
from bertforge.tasks.multiple_choice import BertForMultipleChoice
from bertforge.tasks.pretraining import BertForPretraining
from bertforge.tasks.question_answering import BertForQuestionAnswering
from bertforge.tasks.token_classification import BertForTokenClassification

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


def finetuning_case(family: str, vocab: int):
    """(model class, inputs with targets) for one task family on a ragged batch."""
    ids, types, mask = ragged_batch(vocab, [16, 7, 11], 16, seed=8)
    inputs = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if family == "qa":
        # Row 2's answer lies outside its window and targets [CLS], as the feature builder does.
        return BertForQuestionAnswering, {**inputs, "start_positions": torch.tensor([3, 2, 0]),
                                          "end_positions": torch.tensor([5, 4, 0])}
    if family == "token":
        labels = torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(9))
        return BertForTokenClassification, {**inputs, "labels": labels.masked_fill(mask == 0, IGNORE_INDEX)}
    if family == "choice":
        return BertForMultipleChoice, {k: v.reshape(1, 3, 16) for k, v in inputs.items()} | \
            {"labels": torch.tensor([2])}
    return BertForSequenceClassification, {**inputs, "labels": torch.tensor([0, 1, 1])}


@pytest.mark.parametrize("family", ["classification", "token", "qa", "choice"])
def test_unpad_finetuning_loss_and_gradients_equal_padded(family):
    # The training loss must not depend on the layout: padding-free hidden states are zero at padding, the
    # padded path's are not, so any head that lets padding into its loss would train a different model.
    config = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               id2label={0: "a", 1: "b", 2: "c"})
    cls, inputs = finetuning_case(family, 300)
    losses, grads = [], []
    for unpad in (False, True):
        torch.manual_seed(10)
        model = set_fast_paths(cls(config).train(), unpad=unpad, fused_qkv=unpad)
        loss = model(**inputs).loss
        loss.backward()
        losses.append(loss.item())
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    assert losses[0] == pytest.approx(losses[1], abs=FP32_ATOL)
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key


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


def packable_examples(vocab: int, lengths: list[int], seed: int = 7) -> list:
    from bertforge.data.collate import PretrainingExample

    rng = np.random.default_rng(seed)
    examples = []
    for number, length in enumerate(lengths):
        ids = rng.integers(5, vocab, length)
        ids[0], ids[-1] = 2, 3
        positions = np.sort(rng.choice(np.arange(1, length - 1), size=max(1, length // 6), replace=False))
        examples.append(PretrainingExample(ids, length // 2, positions, rng.integers(5, vocab, len(positions)),
                                           number % 2))
    return examples


@pytest.mark.parametrize("unpad", [False, True])
def test_packed_pretraining_equals_one_instance_per_row(unpad):
    """Packing changes the layout, not the sums: losses, accuracies, NSP logits and gradients all agree."""
    from bertforge.data.collate import collate_pretraining, pack_pretraining

    config = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    examples = packable_examples(300, [32, 9, 14, 20, 6, 11, 30, 5])
    plain_batch = collate_pretraining(examples)
    packed_batch = pack_pretraining(examples, capacity=32)
    assert len(packed_batch) < len(plain_batch) and packed_batch.num_tokens == plain_batch.num_tokens
    outputs, grads = [], []
    for batch in (plain_batch, packed_batch):
        torch.manual_seed(8)
        model = BertForPretraining(config)
        model.bert.set_fast_path(unpad=unpad, fused_qkv=unpad)
        out = model(**batch.model_inputs())
        out.loss.backward()
        outputs.append(out)
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    plain, packed = outputs
    for name in ("mlm_loss_sum", "mlm_count", "mlm_correct", "nsp_loss_sum", "nsp_count", "nsp_correct"):
        assert torch.allclose(getattr(plain, name), getattr(packed, name), atol=1e-4), name
    # One NSP prediction per instance either way (packed ones come in row order, not input order).
    assert packed.nsp_logits.shape == plain.nsp_logits.shape
    assert sorted(packed.nsp_logits[:, 0].tolist()) == pytest.approx(sorted(plain.nsp_logits[:, 0].tolist()),
                                                                      abs=FP32_ATOL)
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key


def test_first_fit_decreasing_fills_rows_in_order():
    from bertforge.data.collate import first_fit_decreasing
    from bertforge.errors import ConfigError

    assert first_fit_decreasing([5, 3, 8, 2, 4], capacity=8) == [[2], [0, 1], [3, 4]]
    assert first_fit_decreasing([8, 8], capacity=8) == [[0], [1]]
    with pytest.raises(ConfigError, match="does not fit"):
        first_fit_decreasing([9], capacity=8)


def test_packed_positions_restart_with_every_sequence():
    from bertforge.model.bert import packed_mask, packed_positions

    sequence_ids = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 2, 3, 3, 0, 0]])
    assert packed_positions(sequence_ids)[:, :5].tolist() == [[0, 1, 2, 0, 1], [0, 0, 0, 1, 0]]
    mask = packed_mask(sequence_ids)[:, 0]
    assert mask[0, 0].tolist() == [True, True, True, False, False, False]
    assert mask[0, 5].tolist() == [True] * 5 + [False]  # padding queries see the row, never NaN


def test_packed_sequence_ids_must_be_contiguous_runs():
    model = BertModel(BertConfig.preset("tiny", vocab_size=100)).eval()
    model.set_fast_path(unpad=True)
    ids = torch.randint(5, 100, (1, 6))
    with pytest.raises(InputError, match="contiguous"):
        model(ids, sequence_ids=torch.tensor([[1, 1, 2, 1, 0, 0]]))


@pytest.mark.parametrize("optimizer", ["foreach", "fused", "load_state_dict"])
def test_fused_qkv_inference_cache_follows_weight_updates(optimizer):
    """Inference reuses the concatenated QKV weight; any update of the weights must invalidate it."""
    torch.manual_seed(9)
    model = BertModel(BertConfig.preset("tiny", vocab_size=100))
    model.set_fast_path(fused_qkv=True)
    ids, types, mask = ragged_batch(100, [8, 5], 8)
    model.eval()
    with torch.no_grad():
        model(ids, types, mask)  # fills the cache
    model.train()
    if optimizer == "load_state_dict":
        state = {k: v + 0.01 for k, v in model.state_dict().items()}
        model.load_state_dict(state)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, **{optimizer: True})
        model(ids, types, mask).last_hidden_state.sum().backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        cached = model(ids, types, mask).last_hidden_state
        model.set_fast_path(fused_qkv=False)
        plain = model(ids, types, mask).last_hidden_state
    assert torch.allclose(cached, plain, atol=FP32_ATOL)


@pytest.mark.parametrize("unpad", [False, True])
def test_activation_checkpointing_gradients_equal_plain(unpad):
    """Recomputing layers in the backward pass replays the dropout masks: the same loss and gradients."""
    config = BertConfig.preset("tiny", vocab_size=300)  # dropout 0.1 stays on
    ids, types, mask = ragged_batch(300, [16, 7, 11], 16, seed=3)
    positions = torch.tensor([[1, 4, 9], [2, 5, 0], [3, 8, 10]])
    labels = torch.tensor([[7, 8, 9], [10, 11, -100], [12, 13, 14]])
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(4)
        model = BertForPretraining(config).train()
        model.bert.set_fast_path(unpad=unpad, fused_qkv=unpad)
        model.bert.set_activation_checkpointing(checkpointing)
        torch.manual_seed(5)
        out = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=torch.tensor([0, 1, 0]))
        out.loss.backward()
        results.append((out.loss.item(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (loss_plain, grads_plain), (loss_ckpt, grads_ckpt) = results
    assert loss_plain == pytest.approx(loss_ckpt, abs=1e-6)
    for key in grads_plain:
        assert torch.allclose(grads_plain[key], grads_ckpt[key], atol=FP32_ATOL), key
