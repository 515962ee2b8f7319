"""The fast paths (unpadding, fused QKV, activation checkpointing, packed rows, bf16 autocast) equal the
plain path within named tolerances: outputs, gradients and optimizer steps.

`set_fast_paths(model, unpad=False, fused_qkv=False)` is the plain reference path throughout."""

import copy
import pickle

import numpy as np
import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.errors import InputError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.model import BertConfig, BertModel
from bertforge.model.fast_paths import (
    CheckpointedLayer,
    FusedSelfAttention,
    fast_paths_enabled,
    set_activation_checkpointing,
    set_fast_paths,
)
from bertforge.model.layouts import Padded, Unpadded, choose_layout, packed_mask, packed_positions

FP32_ATOL = 1e-5
BF16_ATOL = 6e-2  # bf16 keeps 8 mantissa bits; LayerNorm outputs are O(1)
PRETRAINED_ATOL = 1e-4  # the bound for from_pretrained's default path against the plain one


def plain(model):
    return set_fast_paths(model, unpad=False, fused_qkv=False)


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
    model = plain(BertModel(BertConfig.preset("mini", vocab_size=500)).eval())
    ids, types, mask = ragged_batch(500, [37, 5, 20, 1], 37)
    with torch.no_grad():
        reference = model(ids, types, mask, output_hidden_states=True)
        set_fast_paths(model, unpad=True, fused_qkv=False)
        fast = model(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    for layer, (a, b) in enumerate(zip(reference.hidden_states, fast.hidden_states)):
        assert torch.allclose(a[real], b[real], atol=FP32_ATOL), f"layer {layer} differs"
    assert torch.allclose(reference.pooled_output, fast.pooled_output, atol=FP32_ATOL)
    assert torch.count_nonzero(fast.last_hidden_state[~real]) == 0


def test_unpad_many_sequences_attends_in_one_masked_call_equal_to_padded(monkeypatch):
    """Above `PER_SEQUENCE_ATTENTION_MAX` sequences the CPU unpadded layout attends in one masked call (fewer
    kernels: the contention fix of issue #21); it still equals the padded path at real positions."""
    from bertforge.model import layouts

    torch.manual_seed(0)
    model = plain(BertModel(BertConfig.preset("mini", vocab_size=500)).eval())
    lengths = [37, 5, 20, 1, 12, 30]
    assert len(lengths) > layouts.PER_SEQUENCE_ATTENTION_MAX
    ids, types, mask = ragged_batch(500, lengths, 37)
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(layouts.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real_sdpa(*a, **k))
    with torch.no_grad():
        reference = model(ids, types, mask).last_hidden_state
        set_fast_paths(model, unpad=True, fused_qkv=True)
        calls.clear()
        fast = model(ids, types, mask).last_hidden_state
    assert len(calls) == model.config.num_hidden_layers  # one call per layer, not one per sequence
    real = mask.bool()
    assert torch.allclose(reference[real], fast[real], atol=FP32_ATOL)


def test_fused_qkv_equals_separate_projections():
    torch.manual_seed(1)
    model = plain(BertModel(BertConfig.preset("tiny", vocab_size=300)).eval())
    ids, types, mask = ragged_batch(300, [12, 9], 12)
    with torch.no_grad():
        reference = model(ids, types, mask).last_hidden_state
        set_fast_paths(model, unpad=False, fused_qkv=True)
        fused = model(ids, types, mask).last_hidden_state
    assert isinstance(model.encoder.layers[0].attention, FusedSelfAttention)
    assert torch.allclose(reference, fused, atol=FP32_ATOL)


def test_fused_qkv_state_dict_keeps_checkpoint_keys_and_values():
    torch.manual_seed(1)
    model = plain(BertModel(BertConfig.preset("tiny", vocab_size=300)))
    before = model.state_dict()
    set_fast_paths(model)
    after = model.state_dict()
    assert list(after) == list(before)  # same keys, same order
    for key in before:
        assert torch.equal(before[key], after[key]), key
    # Copies, not views of the fused tensor: safetensors refuses tensors that share storage.
    query, key = (after[f"encoder.layers.0.attention.{name}.weight"] for name in ("query", "key"))
    assert query.untyped_storage().data_ptr() != key.untyped_storage().data_ptr()
    assert not any("qkv" in key for key in after)
    assert any("qkv_weight" in name for name, _ in model.named_parameters())


def test_fused_qkv_loads_plain_state_dict_and_back():
    torch.manual_seed(2)
    source = plain(BertModel(BertConfig.preset("tiny", vocab_size=300)))
    torch.manual_seed(3)
    fused = set_fast_paths(BertModel(BertConfig.preset("tiny", vocab_size=300)))
    result = fused.load_state_dict(source.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    for key, value in source.state_dict().items():
        assert torch.equal(fused.state_dict()[key], value), key
    torch.manual_seed(4)
    target = plain(BertModel(BertConfig.preset("tiny", vocab_size=300)))
    target.load_state_dict(fused.state_dict(), strict=True)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_fused_qkv_partial_load_reports_missing_parts_by_name():
    model = set_fast_paths(BertModel(BertConfig.preset("tiny", vocab_size=100)))
    state = model.state_dict()
    new_key = torch.full_like(state["encoder.layers.0.attention.key.weight"], 0.5)
    partial = {"encoder.layers.0.attention.key.weight": new_key}
    result = model.load_state_dict(partial, strict=False)
    assert "encoder.layers.0.attention.query.weight" in result.missing_keys
    assert "encoder.layers.0.attention.key.weight" not in result.missing_keys
    assert not any("qkv" in key for key in result.missing_keys) and not result.unexpected_keys
    after = model.state_dict()
    assert torch.equal(after["encoder.layers.0.attention.key.weight"], new_key)
    assert torch.equal(after["encoder.layers.0.attention.query.weight"], state["encoder.layers.0.attention.query.weight"])


def test_fused_qkv_unfuse_restores_plain_modules():
    torch.manual_seed(5)
    model = plain(BertModel(BertConfig.preset("tiny", vocab_size=100)))
    names = [name for name, _ in model.named_parameters()]
    state = model.state_dict()
    set_fast_paths(model)
    set_fast_paths(model)  # idempotent
    rng = torch.get_rng_state()
    plain(model)
    assert torch.equal(torch.get_rng_state(), rng), "un-fusing must not draw random numbers"
    assert [name for name, _ in model.named_parameters()] == names
    assert type(model.encoder.layers[0].attention).__name__ == "SelfAttention"
    for key, value in state.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert fast_paths_enabled(model) == {"unpad": False, "fused_qkv": False,
                                          "activation_checkpointing": False}


def test_fused_qkv_keeps_frozen_encoder_frozen():
    config = BertConfig.preset("tiny", vocab_size=100, freeze_encoder=True, id2label={0: "a", 1: "b"})
    model = set_fast_paths(BertForSequenceClassification(config))
    assert not model.bert.encoder.layers[0].attention.qkv_weight.requires_grad
    assert not plain(model).bert.encoder.layers[0].attention.query.weight.requires_grad


@pytest.mark.parametrize("optimizer", ["foreach", "fused"])
@pytest.mark.parametrize("unpad", [False, True])
def test_fused_qkv_adamw_steps_equal_plain(optimizer, unpad):
    """AdamW is elementwise: one [3H, H] parameter steps exactly as the three [H, H] ones."""
    # Dropout stays on for the padded layout (the same masks on both sides); unpadding draws its masks over
    # [R, H] instead of [B, T, H], so that comparison runs without dropout.
    dropout = 0.0 if unpad else 0.1
    config = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=dropout,
                               attention_probs_dropout_prob=dropout)
    ids, types, mask = ragged_batch(300, [16, 7, 11], 16, seed=3)
    positions = torch.tensor([[1, 4, 9], [2, 5, 0], [3, 8, 10]])
    labels = torch.tensor([[7, 8, 9], [10, 11, -100], [12, 13, 14]])
    states, losses = [], []
    for fused in (False, True):
        torch.manual_seed(11)
        model = set_fast_paths(BertForPretraining(config).train(), unpad=fused and unpad, fused_qkv=fused)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **{optimizer: True})
        torch.manual_seed(12)
        for _ in range(3):
            loss = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels,
                         nsp_labels=torch.tensor([0, 1, 0])).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        states.append(model.state_dict())
    assert losses[:3] == pytest.approx(losses[3:], abs=FP32_ATOL)
    for key in states[0]:
        assert torch.allclose(states[0][key], states[1][key], atol=FP32_ATOL), key


def test_fused_qkv_survives_dtype_deepcopy_pickle_and_compile():
    torch.manual_seed(6)
    model = set_fast_paths(BertModel(BertConfig.preset("tiny", vocab_size=100)).eval())
    ids, types, mask = ragged_batch(100, [8, 5], 8)
    with torch.no_grad():
        expected = model(ids, types, mask).last_hidden_state
        twin = copy.deepcopy(model)
        assert twin.encoder.layers[0].attention.qkv_weight.data_ptr() != \
            model.encoder.layers[0].attention.qkv_weight.data_ptr()
        assert torch.equal(twin(ids, types, mask).last_hidden_state, expected)
        assert list(twin.state_dict()) == list(model.state_dict())
        restored = pickle.loads(pickle.dumps(model))
        assert torch.equal(restored(ids, types, mask).last_hidden_state, expected)
        wide = copy.deepcopy(model).to(torch.float64)
        assert wide.encoder.layers[0].attention.qkv_weight.dtype == torch.float64
        assert torch.allclose(wide(ids, types, mask).last_hidden_state.float(), expected, atol=FP32_ATOL)
        compiled = torch.compile(model, backend="eager")
        assert torch.allclose(compiled(ids, types, mask).last_hidden_state, expected, atol=FP32_ATOL)


def test_fused_qkv_trains_under_ddp(tmp_path):
    """DDP (one gloo process) wraps the fused model; the step equals the unwrapped one."""
    import torch.distributed as dist

    torch.manual_seed(7)
    model = set_fast_paths(BertModel(BertConfig.preset("tiny", vocab_size=100)).train())
    twin = copy.deepcopy(model)
    ids, types, mask = ragged_batch(100, [8, 5], 8)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        grads = []
        for runner, module in ((wrapped, model), (twin, twin)):
            torch.manual_seed(8)
            runner(ids, types, mask).last_hidden_state.square().sum().backward()
            grads.append({k: p.grad for k, p in module.named_parameters() if p.grad is not None})
    finally:
        dist.destroy_process_group()
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key


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
        model = set_fast_paths(BertForPretraining(config), unpad=unpad, fused_qkv=unpad)
        out = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp)
        out.loss.backward()
        grads.append(split_grads(model))
        losses = out.loss.item()
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key
    assert losses > 0


def split_grads(model) -> dict:
    """Gradients under the plain path's parameter names (a fused [3H, H] gradient split into three)."""
    grads = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        if name.endswith(("qkv_weight", "qkv_bias")):
            base, role = name.rsplit(".qkv_", 1)
            for part, grad in zip(("query", "key", "value"), param.grad.chunk(3)):
                grads[f"{base}.{part}.{role}"] = grad.clone()
        else:
            grads[name] = param.grad.clone()
    return grads


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
        grads.append(split_grads(model))
    assert losses[0] == pytest.approx(losses[1], abs=FP32_ATOL)
    assert grads[0].keys() == grads[1].keys()
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(5)
    model = set_fast_paths(BertModel(BertConfig.preset("mini", vocab_size=500)).eval())
    ids, types, mask = ragged_batch(500, [30, 12], 30)
    with torch.no_grad():
        reference = model(ids, types, mask).last_hidden_state
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids, types, mask).last_hidden_state.float()
    real = mask.bool()
    assert (reference[real] - low[real]).abs().max().item() < BF16_ATOL


@pytest.mark.parametrize("unpad", [False, True])
def test_attention_maps_force_padded_path(unpad):
    model = set_fast_paths(BertModel(BertConfig.preset("tiny", vocab_size=100)).eval(), unpad=unpad)
    ids, types, mask = ragged_batch(100, [6, 3], 6)
    with torch.no_grad():
        out = model(ids, types, mask, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 6, 6)
    assert torch.allclose(out.attentions[0].sum(-1), torch.ones(2, 2, 6))


def test_unpad_handles_masks_with_holes():
    """A mask that is not 1s-then-0s (e.g. a masked-out middle token) takes the scatter path, still exact."""
    torch.manual_seed(6)
    model = plain(BertModel(BertConfig.preset("tiny", vocab_size=100)).eval())
    ids, types, mask = ragged_batch(100, [10, 8], 10)
    mask[0, 4] = 0
    with torch.no_grad():
        reference = model(ids, types, mask).last_hidden_state
        set_fast_paths(model)
        fast = model(ids, types, mask).last_hidden_state
    real = mask.bool()
    assert torch.allclose(reference[real], fast[real], atol=FP32_ATOL)


def test_choose_layout_picks_the_four_cases():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    sequence_ids = torch.tensor([[1, 1, 2], [1, 0, 0]])
    full = torch.ones(2, 3, dtype=torch.long)
    padded = choose_layout(mask, None, unpad=False, output_attentions=False)
    assert isinstance(padded, Padded) and padded.mask.shape == (2, 1, 1, 3)
    assert isinstance(choose_layout(mask, None, unpad=True, output_attentions=False), Unpadded)
    assert isinstance(choose_layout(mask, None, unpad=True, output_attentions=True), Padded)
    no_padding = choose_layout(full, None, unpad=True, output_attentions=False)
    assert isinstance(no_padding, Padded) and no_padding.mask is None
    assert choose_layout(None, None, unpad=True, output_attentions=False).mask is None
    packed = choose_layout(None, sequence_ids, unpad=False, output_attentions=False)
    assert isinstance(packed, Padded) and packed.mask.shape == (2, 1, 3, 3)
    assert isinstance(choose_layout(None, sequence_ids, unpad=True, output_attentions=False), Unpadded)
    assert isinstance(choose_layout(None, sequence_ids, unpad=True, output_attentions=True), Padded)


def test_unpadded_layout_enter_leave_round_trip():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    layout = Unpadded(mask)
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    inside = layout.enter(x)
    assert inside.shape == (5, 3) and layout.lengths == [2, 3]
    back = layout.leave(inside)
    assert torch.equal(back[mask.bool()], x[mask.bool()]) and torch.count_nonzero(back[~mask.bool()]) == 0


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
        model = set_fast_paths(BertForPretraining(config), unpad=unpad, fused_qkv=unpad)
        out = model(**batch.model_inputs())
        out.loss.backward()
        outputs.append(out)
        grads.append(split_grads(model))
    unpacked, packed = outputs
    for name in ("mlm_loss_sum", "mlm_count", "mlm_correct", "nsp_loss_sum", "nsp_count", "nsp_correct"):
        assert torch.allclose(getattr(unpacked, name), getattr(packed, name), atol=1e-4), name
    # One NSP prediction per instance either way (packed ones come in row order, not input order).
    assert packed.nsp_logits.shape == unpacked.nsp_logits.shape
    assert sorted(packed.nsp_logits[:, 0].tolist()) == pytest.approx(sorted(unpacked.nsp_logits[:, 0].tolist()),
                                                                      abs=FP32_ATOL)
    for key in grads[0]:
        assert torch.allclose(grads[0][key], grads[1][key], atol=FP32_ATOL), key


def test_packed_unpadded_equals_packed_padded():
    """Packed rows on the fast path (unpadded, fused) equal packed rows on the plain path."""
    torch.manual_seed(9)
    model = plain(BertModel(BertConfig.preset("tiny", vocab_size=100)).eval())
    ids = torch.randint(5, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    sequence_ids = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 2, 2, 2]])
    with torch.no_grad():
        reference = model(ids, sequence_ids=sequence_ids)
        fast = set_fast_paths(model)(ids, sequence_ids=sequence_ids)
    real = sequence_ids > 0
    assert torch.allclose(reference.last_hidden_state[real], fast.last_hidden_state[real], atol=FP32_ATOL)
    assert fast.pooled_output.shape == (5, model.config.hidden_size)
    assert torch.allclose(reference.pooled_output, fast.pooled_output, atol=FP32_ATOL)


def test_first_fit_decreasing_fills_rows_in_order():
    from bertforge.data.collate import first_fit_decreasing
    from bertforge.errors import ConfigError

    assert first_fit_decreasing([5, 3, 8, 2, 4], capacity=8) == [[2], [0, 1], [3, 4]]
    assert first_fit_decreasing([8, 8], capacity=8) == [[0], [1]]
    with pytest.raises(ConfigError, match="does not fit"):
        first_fit_decreasing([9], capacity=8)


def test_packed_positions_restart_with_every_sequence():
    sequence_ids = torch.tensor([[1, 1, 1, 2, 2, 0], [1, 2, 3, 3, 0, 0]])
    assert packed_positions(sequence_ids)[:, :5].tolist() == [[0, 1, 2, 0, 1], [0, 0, 0, 1, 0]]
    mask = packed_mask(sequence_ids)[:, 0]
    assert mask[0, 0].tolist() == [True, True, True, False, False, False]
    assert mask[0, 5].tolist() == [True] * 5 + [False]  # padding queries see the row, never NaN


def test_packed_sequence_ids_must_be_contiguous_runs():
    model = set_fast_paths(BertModel(BertConfig.preset("tiny", vocab_size=100)).eval())
    ids = torch.randint(5, 100, (1, 6))
    with pytest.raises(InputError, match="contiguous"):
        model(ids, sequence_ids=torch.tensor([[1, 1, 2, 1, 0, 0]]))


@pytest.mark.parametrize("fast", [False, True])
def test_activation_checkpointing_gradients_equal_plain(fast):
    """Recomputing layers in the backward pass replays the dropout masks: the same loss and gradients."""
    config = BertConfig.preset("tiny", vocab_size=300)  # dropout 0.1 stays on
    ids, types, mask = ragged_batch(300, [16, 7, 11], 16, seed=3)
    positions = torch.tensor([[1, 4, 9], [2, 5, 0], [3, 8, 10]])
    labels = torch.tensor([[7, 8, 9], [10, 11, -100], [12, 13, 14]])
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(4)
        model = set_fast_paths(BertForPretraining(config).train(), unpad=fast, fused_qkv=fast)
        keys = list(model.state_dict())
        set_activation_checkpointing(model, checkpointing)
        assert list(model.state_dict()) == keys
        assert isinstance(model.bert.encoder.layers[0], CheckpointedLayer) == checkpointing
        torch.manual_seed(5)
        out = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels, nsp_labels=torch.tensor([0, 1, 0]))
        out.loss.backward()
        results.append((out.loss.item(), split_grads(model)))
    (loss_plain, grads_plain), (loss_ckpt, grads_ckpt) = results
    assert loss_plain == pytest.approx(loss_ckpt, abs=1e-6)
    for key in grads_plain:
        assert torch.allclose(grads_plain[key], grads_ckpt[key], atol=FP32_ATOL), key


def test_activation_checkpointing_only_in_training_with_grad(monkeypatch):
    calls = []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = set_activation_checkpointing(BertModel(BertConfig.preset("tiny", vocab_size=100)))
    ids, types, mask = ragged_batch(100, [8, 5], 8)
    with torch.no_grad():
        model.train()(ids, types, mask)
    model.eval()(ids, types, mask)
    assert not calls
    model.train()(ids, types, mask)
    assert len(calls) == 2  # one per layer
    set_activation_checkpointing(model, False)
    assert not fast_paths_enabled(model)["activation_checkpointing"]


def test_model_from_pretrained_fast_by_default(tmp_path):
    """`from_pretrained` with no further calls runs unpadded with fused QKV, within 1e-4 of the plain path
    on variable-length batches; `fast_path=False` is the plain path."""
    torch.manual_seed(12)
    BertModel(BertConfig.preset("mini", vocab_size=500)).save_pretrained(tmp_path / "model")
    model = BertModel.from_pretrained(tmp_path / "model")
    assert fast_paths_enabled(model) == {"unpad": True, "fused_qkv": True,
                                          "activation_checkpointing": False}
    reference = BertModel.from_pretrained(tmp_path / "model", fast_path=False)
    assert fast_paths_enabled(reference) == {"unpad": False, "fused_qkv": False,
                                          "activation_checkpointing": False}
    assert not model.training
    for seed, lengths in enumerate(([37, 5, 20, 1], [12, 12, 3], [40])):
        ids, types, mask = ragged_batch(500, lengths, max(lengths), seed=seed)
        with torch.no_grad():
            fast, slow = model(ids, types, mask), reference(ids, types, mask)
        real = mask.bool()
        assert (fast.last_hidden_state[real] - slow.last_hidden_state[real]).abs().max() < PRETRAINED_ATOL
        assert (fast.pooled_output - slow.pooled_output).abs().max() < PRETRAINED_ATOL


def test_task_model_from_pretrained_fast_by_default(tmp_path):
    config = BertConfig.preset("tiny", vocab_size=300, id2label={0: "a", 1: "b", 2: "c"})
    torch.manual_seed(13)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "model")
    model = BertForSequenceClassification.from_pretrained(tmp_path / "model")
    assert fast_paths_enabled(model)["unpad"] and fast_paths_enabled(model)["fused_qkv"]
    reference = BertForSequenceClassification.from_pretrained(tmp_path / "model", fast_path=False)
    ids, types, mask = ragged_batch(300, [16, 7, 11], 16)
    with torch.no_grad():
        assert torch.allclose(model(ids, types, mask).logits, reference(ids, types, mask).logits,
                              atol=PRETRAINED_ATOL)
