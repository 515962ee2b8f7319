"""Tests of `bertforge.data.masking`: the 15% / 80-10-10 statistics, specials, the cap, whole-word masking."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.constants import IGNORE_INDEX
from bertforge.data.masking import Masker, MaskingConfig, mask_batch, stream_keys
from bertforge.errors import ConfigError

VOCAB = 500
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = [PAD, UNK, CLS, SEP, MASK]


def random_sequences(count: int, rng: np.random.Generator):
    """[CLS] A [SEP] B [SEP] sequences of ordinary ids (5 .. VOCAB-1) with random word starts."""
    for _ in range(count):
        length_a, length_b = rng.integers(20, 70, size=2)
        a = rng.integers(5, VOCAB, size=length_a)
        b = rng.integers(5, VOCAB, size=length_b)
        ids = np.concatenate([[CLS], a, [SEP], b, [SEP]])
        starts = (rng.random(ids.size) < 0.6).astype(np.uint8)
        starts[[0, length_a + 1, ids.size - 1]] = 1
        yield ids, starts


def masking_statistics(config: MaskingConfig, sequences: int = 1200, seed: int = 0):
    masker = Masker(config, vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    rng = np.random.default_rng(seed)
    counts = {"maskable": 0, "chosen": 0, "mask": 0, "random": 0, "kept": 0}
    for ids, starts in random_sequences(sequences, rng):
        out = masker.mask(ids, starts, rng)
        assert np.all(np.diff(out.positions) > 0)
        assert np.array_equal(out.labels, ids[out.positions])
        assert not np.isin(ids[out.positions], SPECIALS).any(), "a special token was chosen"
        untouched = np.ones(ids.size, dtype=bool)
        untouched[out.positions] = False
        assert np.array_equal(out.input_ids[untouched], ids[untouched])
        seen = out.input_ids[out.positions]
        counts["maskable"] += int((~np.isin(ids, SPECIALS)).sum())
        counts["chosen"] += out.positions.size
        counts["mask"] += int((seen == MASK).sum())
        counts["kept"] += int((seen == out.labels).sum())
        counts["random"] += int(((seen != MASK) & (seen != out.labels)).sum())
        replaced = seen[(seen != MASK) & (seen != out.labels)]
        assert not np.isin(replaced, SPECIALS).any(), "a random replacement was a special token"
    return counts


def test_masking_statistics_on_100k_tokens():
    counts = masking_statistics(MaskingConfig(max_predictions_per_seq=1000))
    assert counts["maskable"] >= 100_000
    assert abs(counts["chosen"] / counts["maskable"] - 0.15) < 0.005
    # A random replacement equal to the original (p = 1/495) counts as kept: allow for it in the bounds.
    assert abs(counts["mask"] / counts["chosen"] - 0.8) < 0.01
    assert abs(counts["random"] / counts["chosen"] - 0.1) < 0.01
    assert abs(counts["kept"] / counts["chosen"] - 0.1) < 0.01


def test_masking_whole_word_statistics_on_100k_tokens():
    counts = masking_statistics(MaskingConfig(max_predictions_per_seq=1000, whole_word_masking=True), seed=1)
    assert counts["maskable"] >= 100_000
    assert abs(counts["chosen"] / counts["maskable"] - 0.15) < 0.005
    assert abs(counts["mask"] / counts["chosen"] - 0.8) < 0.01
    assert abs(counts["random"] / counts["chosen"] - 0.1) < 0.01
    assert abs(counts["kept"] / counts["chosen"] - 0.1) < 0.01


def test_masking_whole_word_never_splits_a_word_and_decides_once_per_word():
    masker = Masker(MaskingConfig(whole_word_masking=True, max_predictions_per_seq=1000),
                    vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    rng = np.random.default_rng(7)
    for ids, starts in random_sequences(300, rng):
        out = masker.mask(ids, starts, rng)
        chosen = np.zeros(ids.size, dtype=bool)
        chosen[out.positions] = True
        as_mask = out.input_ids == MASK
        word = np.cumsum(starts) - 1
        for index in np.unique(word):
            members = (word == index) & ~np.isin(ids, SPECIALS)
            if members.any():
                assert chosen[members].all() or not chosen[members].any(), "a word was split"
                if chosen[members].any():
                    assert as_mask[members].all() or not as_mask[members].any(), "mixed 80/10/10 in a word"


def test_masking_whole_word_does_not_join_pieces_across_separators():
    masker = Masker(MaskingConfig(whole_word_masking=True, mlm_probability=0.5),
                    vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    # After truncation B may start with a continuation piece (flag 0) right after [SEP]: its own word.
    ids = np.array([CLS, 10, 11, SEP, 12, 13, SEP])
    starts = np.array([1, 1, 0, 1, 0, 0, 1], dtype=np.uint8)
    for seed in range(30):
        out = masker.mask(ids, starts, np.random.default_rng(seed))
        assert set(out.positions.tolist()) in ({1, 2}, {4, 5})


def test_masking_cap_and_at_least_one_prediction():
    masker = Masker(MaskingConfig(max_predictions_per_seq=20), vocab_size=VOCAB, special_ids=SPECIALS,
                    mask_id=MASK)
    rng = np.random.default_rng(0)
    long_ids = np.concatenate([[CLS], rng.integers(5, VOCAB, 500), [SEP]])
    assert masker.mask(long_ids, None, rng).positions.size == 20
    short_ids = np.array([CLS, 9, SEP, 10, SEP])
    assert masker.mask(short_ids, None, rng).positions.size == 1
    only_specials = np.array([CLS, SEP, SEP])
    assert masker.mask(only_specials, None, rng).positions.size == 0
    assert masker.num_to_predict(100) == 15 and masker.num_to_predict(3) == 1 and masker.num_to_predict(0) == 0


def test_masking_is_deterministic_for_a_generator_seed():
    masker = Masker(MaskingConfig(), vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    ids = np.concatenate([[CLS], np.arange(5, 105), [SEP]])
    first = masker.mask(ids, None, np.random.default_rng(42))
    again = masker.mask(ids, None, np.random.default_rng(42))
    assert np.array_equal(first.input_ids, again.input_ids) and np.array_equal(first.positions, again.positions)


def test_masking_config_validation_messages():
    with pytest.raises(ConfigError, match="mlm_probability"):
        MaskingConfig(mlm_probability=1.5)
    with pytest.raises(ConfigError, match=r"mlm_probability=0.0 is invalid: use a masking rate in \(0, 1\)"):
        MaskingConfig(mlm_probability=0.0)
    with pytest.raises(ConfigError, match="masking rate"):
        MaskingConfig(mlm_probability=1.0)
    with pytest.raises(ConfigError, match="at most 1"):
        MaskingConfig(mask_token_probability=0.9, random_token_probability=0.2)
    with pytest.raises(ConfigError, match="max_predictions_per_seq"):
        MaskingConfig(max_predictions_per_seq=0)
    with pytest.raises(ConfigError, match="static_masks"):
        MaskingConfig(static_masks=-1)
    with pytest.raises(ConfigError, match="whole_word_masking"):
        MaskingConfig(whole_word_masking="yes")
    assert MaskingConfig.for_sequence_length(128).max_predictions_per_seq == 20
    assert MaskingConfig.for_sequence_length(512).max_predictions_per_seq == 77


def test_masker_rejects_ids_outside_vocabulary():
    with pytest.raises(ConfigError, match="vocabulary"):
        Masker(MaskingConfig(), vocab_size=10, special_ids=[0, 1, 2], mask_id=10)
    with pytest.raises(ConfigError, match="only special tokens"):
        Masker(MaskingConfig(), vocab_size=3, special_ids=[0, 1, 2], mask_id=2)


def padded_block(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(ids) for ids in sequences])
    block = np.zeros((len(sequences), lengths.max()), dtype=np.int64)
    for row, ids in enumerate(sequences):
        block[row, :len(ids)] = ids
    return block, lengths


def test_mask_batch_statistics_and_rule_on_100k_tokens():
    config = MaskingConfig(max_predictions_per_seq=20)
    masker = Masker(config, vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    sequences = [ids for ids, _ in random_sequences(1200, np.random.default_rng(0))]
    block, lengths = padded_block(sequences)
    out = mask_batch(masker, block, lengths, stream_keys(7, 1, 0, np.arange(len(sequences))), IGNORE_INDEX)
    counts = {"maskable": 0, "chosen": 0, "mask": 0, "random": 0, "kept": 0}
    for row, ids in enumerate(sequences):
        count = int(out.counts[row])
        positions, labels = out.positions[row, :count], out.labels[row, :count]
        assert (out.labels[row, count:] == IGNORE_INDEX).all()
        maskable = int((~np.isin(ids, SPECIALS)).sum())
        assert count == masker.num_to_predict(maskable)  # the same count rule as one sequence at a time
        assert np.all(np.diff(positions) > 0) and np.array_equal(labels, ids[positions])
        assert not np.isin(ids[positions], SPECIALS).any(), "a special token was chosen"
        seen = out.input_ids[row, :len(ids)]
        untouched = np.ones(len(ids), dtype=bool)
        untouched[positions] = False
        assert np.array_equal(seen[untouched], ids[untouched]) and not out.input_ids[row, len(ids):].any()
        seen = seen[positions]
        replaced = seen[(seen != MASK) & (seen != labels)]
        assert not np.isin(replaced, SPECIALS).any(), "a random replacement was a special token"
        counts["maskable"] += maskable
        counts["chosen"] += count
        counts["mask"] += int((seen == MASK).sum())
        counts["kept"] += int((seen == labels).sum())
        counts["random"] += replaced.size
    assert counts["maskable"] >= 100_000
    assert abs(counts["mask"] / counts["chosen"] - 0.8) < 0.015
    assert abs(counts["random"] / counts["chosen"] - 0.1) < 0.01
    assert abs(counts["kept"] / counts["chosen"] - 0.1) < 0.01


def test_mask_batch_chooses_uniformly_among_positions():
    masker = Masker(MaskingConfig(mlm_probability=0.2), vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    ids = np.concatenate([[CLS], np.arange(5, 55), [SEP]])
    block = np.tile(ids, (4000, 1))
    out = mask_batch(masker, block, np.full(4000, ids.size), stream_keys(1, np.arange(4000)), IGNORE_INDEX)
    hits = np.bincount(out.positions.ravel(), minlength=ids.size)[1:-1]  # 10 of 50 per row
    assert abs(hits.mean() - 800) < 1 and hits.min() > 650 and hits.max() < 950


def test_mask_batch_rows_depend_on_their_key_alone():
    masker = Masker(MaskingConfig(), vocab_size=VOCAB, special_ids=SPECIALS, mask_id=MASK)
    sequences = [ids for ids, _ in random_sequences(6, np.random.default_rng(1))]
    keys = stream_keys(3, 1, 2, np.arange(6))
    block, lengths = padded_block(sequences)
    whole = mask_batch(masker, block, lengths, keys, IGNORE_INDEX)
    for row in (0, 3, 5):  # alone in a batch of its own width: the same masks
        alone = mask_batch(masker, block[row:row + 1, :lengths[row]], lengths[row:row + 1], keys[row:row + 1],
                           IGNORE_INDEX)
        count = int(whole.counts[row])
        assert np.array_equal(alone.input_ids[0], whole.input_ids[row, :lengths[row]])
        assert np.array_equal(alone.positions[0, :count], whole.positions[row, :count])
    other = mask_batch(masker, block, lengths, stream_keys(3, 1, 3, np.arange(6)), IGNORE_INDEX)
    assert not np.array_equal(other.input_ids, whole.input_ids)
