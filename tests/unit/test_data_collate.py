"""Tests of `bertforge.data.collate`: padding, the pretraining batch, and its fit to BertForPretraining."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.collate import PretrainingBatch, PretrainingExample, collate_pretraining, pad_sequences
from bertforge.errors import ConfigError


def examples() -> list[PretrainingExample]:
    return [
        PretrainingExample(np.array([2, 10, 11, 3, 12, 3]), 4, np.array([1, 4]), np.array([10, 12]), 0),
        PretrainingExample(np.array([2, 13, 3, 14, 15, 16, 17, 3]), 3, np.array([5]), np.array([16]), 1),
    ]


def test_collate_pretraining_shapes_padding_and_labels():
    batch = collate_pretraining(examples(), pad_id=0)
    assert len(batch) == 2
    assert batch.input_ids.shape == (2, 8) and batch.mlm_positions.shape == (2, 2)
    assert all(tensor.dtype == torch.long for tensor in batch.model_inputs().values())
    assert batch.input_ids[0].tolist() == [2, 10, 11, 3, 12, 3, 0, 0]
    assert batch.token_type_ids.tolist() == [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1]]
    assert batch.attention_mask.tolist() == [[1] * 6 + [0] * 2, [1] * 8]
    assert batch.mlm_positions.tolist() == [[1, 4], [5, 0]]
    assert batch.mlm_labels.tolist() == [[10, 12], [16, IGNORE_INDEX]]
    assert batch.nsp_labels.tolist() == [0, 1]
    assert batch.num_tokens == 14 and isinstance(batch.num_tokens, int)
    assert batch.num_predictions == 3


def test_collate_pretraining_pads_to_multiple_of_eight():
    batch = collate_pretraining(examples()[:1], pad_to_multiple_of=8)
    assert batch.input_ids.shape == (1, 8)
    assert batch.num_tokens == 6
    with pytest.raises(ConfigError, match="pad_to_multiple_of"):
        collate_pretraining(examples(), pad_to_multiple_of=0)
    with pytest.raises(ConfigError, match="empty"):
        collate_pretraining([])


def test_collate_batch_to_device_keeps_values_and_token_count():
    batch = collate_pretraining(examples())
    moved = batch.to("cpu")
    assert isinstance(moved, PretrainingBatch)
    assert all(torch.equal(moved.model_inputs()[key], value) for key, value in batch.model_inputs().items())
    assert moved.num_tokens == 14


def test_collate_model_inputs_drive_bert_for_pretraining(tiny_config):
    from bertforge.families.pretraining import BertForPretraining

    parameters = inspect.signature(BertForPretraining.forward).parameters
    batch = collate_pretraining(examples())
    assert set(batch.model_inputs()) <= set(parameters)
    torch.manual_seed(0)
    model = BertForPretraining(tiny_config).eval()
    output = model(**batch.model_inputs())
    assert output.mlm_logits.shape == (2, 2, tiny_config.vocab_size)
    assert output.mlm_count.item() == 3  # the padding slot is ignored
    assert output.nsp_count.item() == 2  # both NSP labels count, 0 included
    assert torch.isfinite(output.loss)


def test_pad_sequences_generic():
    padded = pad_sequences([[1, 2, 3], np.array([4]), torch.tensor([5, 6])], pad_value=-1)
    assert padded.tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]]
    assert pad_sequences([[1]], pad_to_multiple_of=8).shape == (1, 8)
    assert pad_sequences([[1]], min_length=4).shape == (1, 4)
    assert pad_sequences([[0.5]], dtype=torch.float32).dtype == torch.float32
    with pytest.raises(ConfigError, match="1-d"):
        pad_sequences([[[1]]])


def test_pack_pretraining_layout():
    from bertforge.data.collate import pack_pretraining

    batch = pack_pretraining(examples(), capacity=16, pad_id=0)
    assert len(batch) == 1 and batch.input_ids.shape == (1, 14)
    # Both fit one row; inside a row the instances keep their batch order.
    assert batch.input_ids[0].tolist() == [2, 10, 11, 3, 12, 3, 2, 13, 3, 14, 15, 16, 17, 3]
    assert batch.sequence_ids[0].tolist() == [1] * 6 + [2] * 8
    assert batch.token_type_ids[0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1]
    assert batch.mlm_positions[0].tolist() == [1, 4, 11]  # shifted by the instance's start in the row
    assert batch.mlm_labels[0].tolist() == [10, 12, 16]
    assert batch.nsp_labels.tolist() == [0, 1]  # one per instance, in row order
    assert batch.num_tokens == 14 and "sequence_ids" in batch.model_inputs()
    assert "sequence_ids" not in collate_pretraining(examples()).model_inputs()
    with pytest.raises(ConfigError, match="does not fit"):
        pack_pretraining(examples(), capacity=7)


def test_collate_block_equals_collating_examples():
    from bertforge.data.collate import collate_block

    items = examples()
    block = np.zeros((2, 8), dtype=np.int64)
    positions = np.zeros((2, 2), dtype=np.int64)
    labels = np.full((2, 2), IGNORE_INDEX, dtype=np.int64)
    for row, example in enumerate(items):
        block[row, :len(example.input_ids)] = example.input_ids
        positions[row, :len(example.mlm_positions)] = example.mlm_positions
        labels[row, :len(example.mlm_labels)] = example.mlm_labels
    batch = collate_block(block, np.array([6, 8]), np.array([4, 3]), positions, labels, np.array([0, 1]))
    expected = collate_pretraining(items)
    for name, tensor in expected.model_inputs().items():
        assert torch.equal(getattr(batch, name), tensor), name
    assert batch.num_tokens == expected.num_tokens
