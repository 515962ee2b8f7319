"""Tests of `bertforge.data.datasets`: epochs, rank sharding (DDP equivalence), exact resume, evaluation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.datasets import PretrainingData
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus
from bertforge.data.shards import vocab_checksum
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import Tokenizer, Vocab

WORDS = "the cat sat on mat and dog ran to park it was sunny day bird saw fly away big small red blue".split()
TOKENIZER = Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", "un", "##aff", "##able"]))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pretraining")
    rng = random.Random(0)
    blocks = []
    for _ in range(40):
        sentences = [" ".join(rng.choices(WORDS + ["unaffable"], k=rng.randint(3, 12))).capitalize() + "."
                     for _ in range(rng.randint(2, 12))]
        blocks.append("\n".join(sentences))
    (root / "corpus.txt").write_text("\n\n".join(blocks) + "\n")
    prepare_corpus(root / "corpus.txt", TOKENIZER, root / "data", max_seq_length=32, shard_size=1500,
                   heldout_fraction=0.1)
    return root / "data"


def make(data_dir: Path, **overrides) -> PretrainingData:
    settings = {
        "batch_size": 8, "masking": MaskingConfig(), "seed": 3, "vocab_size": TOKENIZER.vocab_size,
        "special_ids": TOKENIZER.all_special_ids, "mask_id": TOKENIZER.mask_token_id, **overrides,
    }
    return PretrainingData(data_dir, **settings)


def rows(batch) -> list[tuple]:
    """Each instance of a batch without padding: (ids, types, positions, labels, nsp)."""
    result = []
    for row in range(len(batch)):
        length = int(batch.attention_mask[row].sum())
        slots = int((batch.mlm_labels[row] != IGNORE_INDEX).sum())
        result.append((
            tuple(batch.input_ids[row, :length].tolist()), tuple(batch.token_type_ids[row, :length].tolist()),
            tuple(batch.mlm_positions[row, :slots].tolist()), tuple(batch.mlm_labels[row, :slots].tolist()),
            int(batch.nsp_labels[row]),
        ))
    return result


def test_datasets_batches_are_well_formed(data_dir):
    data = make(data_dir)
    batch = next(data)
    assert len(batch) == 8 and batch.input_ids.dtype == torch.long
    assert set(batch.nsp_labels.tolist()) <= {0, 1}
    real = batch.attention_mask.bool()
    assert (batch.input_ids[:, 0] == TOKENIZER.cls_token_id).all()
    assert not (batch.input_ids[~real] != TOKENIZER.pad_token_id).any()
    assert (batch.mlm_labels != IGNORE_INDEX).sum(dim=1).min() >= 1
    assert data.steps_per_epoch == data.num_instances // 8


def test_datasets_epoch_visits_every_instance_once(data_dir):
    data = make(data_dir, batch_size=5, drop_last=False, masking=MaskingConfig(mlm_probability=0.01))
    seen = []
    for _ in range(data.steps_per_epoch):
        order = data.epoch_order(0)
        start = data.position
        batch = next(data)
        seen.extend(order[start:start + len(batch)].tolist())
    assert sorted(seen) == list(range(data.num_instances))
    assert data.epoch == 0
    next(data)
    assert data.epoch == 1
    assert not np.array_equal(data.epoch_order(1), make(data_dir).epoch_order(0))


def test_datasets_ranks_together_equal_one_large_batch(data_dir):
    single = make(data_dir, batch_size=8)
    ranks = [make(data_dir, batch_size=4, rank=rank, world_size=2) for rank in range(2)]
    for _ in range(single.steps_per_epoch + 2):  # across an epoch boundary too
        expected = rows(next(single))
        assert rows(next(ranks[0])) + rows(next(ranks[1])) == expected


def test_datasets_masks_do_not_depend_on_batch_size(data_dir):
    small = make(data_dir, batch_size=2)
    large = make(data_dir, batch_size=8)
    combined = sum((rows(next(small)) for _ in range(4)), [])
    assert combined == rows(next(large))


def test_datasets_exact_resume_from_state_dict(data_dir):
    uninterrupted = make(data_dir)
    expected = [rows(next(uninterrupted)) for _ in range(12)]
    first = make(data_dir)
    for _ in range(5):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make(data_dir)
    resumed.load_state_dict(state)
    assert [rows(next(resumed)) for _ in range(7)] == expected[5:]


def test_datasets_resume_with_other_world_size(data_dir):
    single = make(data_dir, batch_size=8)
    expected = [rows(next(single)) for _ in range(4)]
    state = make(data_dir, batch_size=8)
    next(state)
    ranks = [make(data_dir, batch_size=4, rank=rank, world_size=2) for rank in range(2)]
    for data in ranks:
        data.load_state_dict(state.state_dict())
    assert rows(next(ranks[0])) + rows(next(ranks[1])) == expected[1]


def test_datasets_resume_rejects_other_data_or_seed(data_dir):
    data = make(data_dir)
    with pytest.raises(DataError, match="same data directory and seed"):
        data.load_state_dict({**data.state_dict(), "seed": 99})
    with pytest.raises(DataError, match="malformed"):
        data.load_state_dict({"epoch": 0})


def test_datasets_dynamic_masks_change_per_epoch_static_masks_do_not(data_dir):
    dynamic = make(data_dir)
    static = make(data_dir, masking=MaskingConfig(static_masks=1))
    instances = np.arange(8)

    def masked(data, epoch):
        return rows(data.make_batch(instances, data.mask_keys(epoch, instances)))

    assert masked(dynamic, 0) != masked(dynamic, 1)
    assert masked(static, 0) == masked(static, 5)


def test_datasets_workers_give_the_same_stream_positions_and_resume(data_dir):
    plain = make(data_dir, batch_size=4)
    expected, states = [], []
    for _ in range(plain.steps_per_epoch + 3):  # across an epoch boundary
        expected.append(rows(next(plain)))
        states.append(plain.state_dict())
    workers = make(data_dir, batch_size=4, workers=2)
    try:
        for index in range(6):
            assert rows(next(workers)) == expected[index]
            assert workers.state_dict() == states[index]  # the batches handed out, not those made ahead
        workers.load_state_dict(states[1])  # back in the stream: the workers restart from there
        assert [rows(next(workers)) for _ in range(len(expected) - 2)] == expected[2:]
    finally:
        workers.close()


def test_datasets_block_reading_equals_instance_reading(data_dir):
    data = make(data_dir)
    indices = np.array([5, 0, data.num_instances - 1, 5, 17])
    block = data.reader.batch(indices, pad_id=0, pad_to_multiple_of=8)
    assert block.token_ids.shape[1] % 8 == 0
    for row, index in enumerate(indices.tolist()):
        ids, starts, b_start, nsp = data.reader.instance(index)
        length = int(block.lengths[row])
        assert length == len(ids) and not block.token_ids[row, length:].any()
        assert block.token_ids[row, :length].tolist() == ids.tolist()
        assert block.word_starts[row, :length].tolist() == starts.tolist()
        assert (int(block.segment_b_starts[row]), int(block.nsp_labels[row])) == (b_start, nsp)


def test_datasets_evaluation_batches_are_fixed_and_cover_the_split(data_dir):
    data = make(data_dir, split="heldout", batch_size=3, drop_last=False)
    first = [rows(batch) for batch in data.evaluation_batches()]
    next(data)  # training iteration does not disturb evaluation
    again = [rows(batch) for batch in data.evaluation_batches()]
    assert first == again
    assert sum(len(batch) for batch in first) == data.num_instances
    ranks = [make(data_dir, split="heldout", batch_size=2, rank=rank, world_size=2, drop_last=False)
             for rank in range(2)]
    shared = sum((sum((rows(batch) for batch in rank.evaluation_batches()), []) for rank in ranks), [])
    assert sorted(shared) == sorted(sum(first, []))
    assert len(list(data.evaluation_batches(max_batches=1))) == 1


def test_datasets_whole_word_masking_on_prepared_words(data_dir):
    data = make(data_dir, masking=MaskingConfig(whole_word_masking=True, mlm_probability=0.5,
                                                max_predictions_per_seq=64))
    unaffable = TOKENIZER.convert_tokens_to_ids(["un", "##aff", "##able"])
    checked = 0
    for _ in range(10):
        batch = next(data)
        for row in range(len(batch)):
            labels = dict(zip(batch.mlm_positions[row].tolist(), batch.mlm_labels[row].tolist()))
            original = batch.input_ids[row].tolist()
            for position, label in labels.items():
                original[position] = label
            for start in range(len(original) - 2):
                if original[start:start + 3] == unaffable:
                    chosen = [start + offset in labels for offset in range(3)]
                    assert all(chosen) or not any(chosen)
                    checked += 1
    assert checked > 0


def test_datasets_errors_are_clear(data_dir, tmp_path):
    with pytest.raises(DataError, match="vocabulary"):
        make(data_dir, vocab_size=TOKENIZER.vocab_size + 1)
    with pytest.raises(DataError, match="different vocabulary"):
        make(data_dir, vocab_checksum="sha256:0")
    make(data_dir, vocab_checksum=vocab_checksum(TOKENIZER))
    with pytest.raises(DataError, match="fewer than one global batch"):
        make(data_dir, batch_size=10_000)
    with pytest.raises(ConfigError, match="rank"):
        make(data_dir, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="split"):
        make(data_dir, split="dev")
    with pytest.raises(DataError, match="not a prepared"):
        make(tmp_path)
