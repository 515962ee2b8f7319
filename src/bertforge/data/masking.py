"""Masked-language-model masking: which tokens the model must predict, and what it sees in their place.

The rule is BERT's: choose 15% of the maskable tokens (rounded, at least 1, at most
`max_predictions_per_seq`); of the chosen, 80% become ``[MASK]``, 10% a random token, 10% stay unchanged, so
the model cannot learn that only ``[MASK]`` positions matter. Special tokens (``[CLS]``, ``[SEP]``,
``[PAD]``, and whatever else is in `special_ids`) are never chosen, and random replacements never are special.

Two deliberate choices, both documented where a reference differs:

- The 15% is of the maskable (non-special) tokens. Google's `create_masked_lm_predictions` counts the
  ``[CLS]``/``[SEP]`` tokens too, which adds at most half a prediction per sequence.
- With whole-word masking every piece of a chosen word is predicted, and the 80/10/10 decision is drawn once
  per *word* (all pieces become ``[MASK]``, or all random, or all unchanged); labels stay per piece. Google
  draws per piece, which lets one word show a mix (UER-py#200 fixed exactly that for Chinese WWM). Words come
  from word-start flags (`data.pretraining`), so Chinese segmenter words are masked as a whole too.

Masking is applied when batches are made (dynamic masking: fresh masks each epoch), or fixed per instance
with `static_masks` copies (Google's ``dupe_factor`` without multiplying disk use): see `data.datasets`.
All randomness comes from the numpy `Generator` passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from bertforge.configuration import setting
from bertforge.errors import ConfigError


@dataclass(frozen=True)
class MaskingConfig:
    """How MLM targets are chosen (the `[masking]` table of a pretraining run). Each field carries its help
    text (`setting`), which `bertforge pretrain --help` shows."""

    mlm_probability: float = setting(0.15, "the masking rate: share of maskable tokens to predict; 0.15 is BERT's "
                                           "(the default), recent recipes use 0.2-0.3 (MosaicBERT and "
                                           "Wettig et al. 2023: 0.3); in (0, 1)")
    max_predictions_per_seq: int = setting(20, "cap on predictions per sequence (Google: 20 for length 128, 80 "
                                               "for 512)")
    mask_token_probability: float = setting(0.8, "share of chosen tokens replaced by [MASK]")
    random_token_probability: float = setting(0.1, "share of chosen tokens replaced by a random non-special token; "
                                                   "the rest are kept")
    whole_word_masking: bool = setting(False, "choose whole words (all their pieces) instead of single pieces")
    static_masks: int = setting(0, "0 for dynamic masking (new masks every epoch); k >= 1 for k fixed masks per "
                                   "instance, epoch e using copy e mod k (Google's static masking with "
                                   "dupe_factor = k)")

    def __post_init__(self) -> None:
        for name in ("mlm_probability", "mask_token_probability", "random_token_probability"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"masking.{name}={value!r} is invalid: use a probability in [0, 1]")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ConfigError(f"masking.mlm_probability={self.mlm_probability!r} is invalid: use a masking rate in "
                              "(0, 1), e.g. 0.15 (BERT) or 0.3 (recent recipes)")
        if self.mask_token_probability + self.random_token_probability > 1.0 + 1e-9:
            raise ConfigError(
                "masking mask_token_probability + random_token_probability must be at most 1 (the rest keep "
                f"their token), got {self.mask_token_probability} + {self.random_token_probability}"
            )
        for name, low in (("max_predictions_per_seq", 1), ("static_masks", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"masking {name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.whole_word_masking, bool):
            raise ConfigError(f"masking whole_word_masking must be true or false, got {self.whole_word_masking!r}")

    @classmethod
    def for_sequence_length(cls, max_seq_length: int, **overrides) -> MaskingConfig:
        """A config whose prediction cap is 15% of the length, rounded up (20 for 128, 77 for 512; Google's
        README uses 20 and 80)."""
        return cls(**{"max_predictions_per_seq": max(1, -(-max_seq_length * 15 // 100)), **overrides})


@dataclass
class MaskedTokens:
    """The result of masking one sequence.

    Attributes:
        input_ids: int64 [T], the tokens the model sees.
        positions: int64 [M], ascending positions of the tokens to predict.
        labels: int64 [M], their original ids.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    labels: np.ndarray


class Masker:
    """Applies a `MaskingConfig` for one vocabulary.

    Args:
        config: the masking rule.
        vocab_size: number of token ids.
        special_ids: ids never masked and never used as random replacements.
        mask_id: id of ``[MASK]``.

    Raises:
        ConfigError: an id is outside the vocabulary, or no non-special token is left for replacements.
    """

    def __init__(self, config: MaskingConfig, *, vocab_size: int, special_ids: Iterable[int], mask_id: int):
        special = sorted({int(index) for index in special_ids})
        if vocab_size < 1 or any(not 0 <= index < vocab_size for index in [*special, mask_id]):
            raise ConfigError(
                f"special ids {special} and mask id {mask_id} must lie in the vocabulary [0, {vocab_size})"
            )
        self.config = config
        self.mask_id = int(mask_id)
        self._special = np.zeros(vocab_size, dtype=bool)
        self._special[special] = True
        self._replacements = np.flatnonzero(~self._special)
        if self._replacements.size == 0:
            raise ConfigError("the vocabulary has only special tokens; nothing to use as a random replacement")

    def num_to_predict(self, maskable: int) -> int:
        """How many of `maskable` tokens to predict: round(p * n), at least 1, at most the cap."""
        if maskable == 0:
            return 0
        wanted = max(1, int(round(maskable * self.config.mlm_probability)))
        return min(self.config.max_predictions_per_seq, wanted, maskable)

    def mask(self, token_ids: np.ndarray, word_starts: np.ndarray | None, rng: np.random.Generator) -> MaskedTokens:
        """Mask one sequence.

        Args:
            token_ids: [T] token ids, special tokens included.
            word_starts: [T] 1 where a word starts (needed for whole-word masking; ignored otherwise).
            rng: the only source of randomness.

        Returns:
            `MaskedTokens` with positions in ascending order.
        """
        ids = np.array(token_ids, dtype=np.int64)
        candidates = np.flatnonzero(~self._special[ids])
        count = self.num_to_predict(candidates.size)
        if count == 0:
            empty = np.zeros(0, dtype=np.int64)
            return MaskedTokens(ids, empty, empty.copy())
        config = self.config
        if config.whole_word_masking and word_starts is not None:
            starts = np.asarray(word_starts, dtype=bool)[candidates]
            # A word also starts after a gap (a special token): pieces never join across [SEP].
            starts[1:] |= np.diff(candidates) != 1
            starts[0] = True
            group_starts = np.flatnonzero(starts)
            group_sizes = np.diff(np.append(group_starts, candidates.size))
            chosen = []
            total = 0
            for group in rng.permutation(group_starts.size):
                if total >= count:
                    break
                size = int(group_sizes[group])
                if total + size > count:
                    continue  # Google's rule: skip a word that would overshoot, keep looking for smaller ones
                chosen.append(group)
                total += size
            chosen = np.sort(np.asarray(chosen, dtype=np.int64))
            sizes = group_sizes[chosen]
            # One 80/10/10 draw per word, repeated for each of its pieces.
            draws = np.repeat(rng.random(chosen.size), sizes)
            offsets = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
            positions = candidates[np.repeat(group_starts[chosen], sizes) + offsets]
        else:
            positions = np.sort(candidates[rng.permutation(candidates.size)[:count]])
            draws = rng.random(count)
        labels = ids[positions]
        to_mask = draws < config.mask_token_probability
        to_random = ~to_mask & (draws < config.mask_token_probability + config.random_token_probability)
        ids[positions[to_mask]] = self.mask_id
        random_count = int(to_random.sum())
        if random_count:
            ids[positions[to_random]] = self._replacements[rng.integers(0, self._replacements.size, random_count)]
        return MaskedTokens(ids, positions.astype(np.int64), labels)


# Counter-based random numbers for batch masking: every draw is a hash of (the instance's stream key, the
# token position, the draw's purpose), so a batch is masked in a few array operations while each instance's
# masks still depend on its own key alone (not on its batch, rank or resumption). splitmix64's finaliser.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_CHOOSE, _DECIDE, _REPLACE = 1, 2, 3


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array: a bijection whose outputs look independent and uniform."""
    x = np.asarray(values, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def stream_keys(*parts: int | np.ndarray) -> np.ndarray:
    """One uint64 key per row from integer parts (scalars or [B] arrays), e.g. (seed, stream tag, epoch,
    instance): the identity of an instance's masks."""
    key = np.zeros((), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for part in parts:
            key = mix64(key + _GOLDEN + np.asarray(part, dtype=np.int64).astype(np.uint64))
    return np.atleast_1d(key)


def _token_draws(keys: np.ndarray, width: int, purpose: int) -> np.ndarray:
    """uint64 [B, width]: draw `purpose` at every position of every row."""
    positions = np.arange(width, dtype=np.uint64) * np.uint64(4) + np.uint64(purpose)
    with np.errstate(over="ignore"):
        return mix64(keys[:, None] ^ mix64(positions + _GOLDEN)[None, :])


def _uniform(bits: np.ndarray) -> np.ndarray:
    """Floats in [0, 1) from the top 53 bits."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass
class MaskedBatch:
    """The result of masking a padded batch (B rows, T tokens, M = the most predictions of a row).

    Attributes:
        input_ids: int64 [B, T], the tokens the model sees (padding unchanged).
        positions: int64 [B, M], ascending positions to predict per row, 0 in unused slots.
        labels: int64 [B, M], their original ids, `fill` in unused slots.
        counts: int64 [B], predictions per row.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    labels: np.ndarray
    counts: np.ndarray


def mask_batch(masker: Masker, token_ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray,
               fill: int) -> MaskedBatch:
    """Mask every row of a padded batch at once, with the rule of `Masker.mask` (not whole-word masking).

    The same number of predictions per row as `Masker.num_to_predict`; the chosen tokens are a uniform
    random subset of the row's maskable tokens (those with the smallest draws), each then [MASK] / random /
    kept by 80/10/10 as configured. Row r's masks are a function of ``keys[r]`` and its tokens only.

    Args:
        masker: the rule and vocabulary.
        token_ids: int [B, T] padded token ids.
        lengths: int [B] real tokens per row (the rest is padding, never chosen).
        keys: uint64 [B] each row's stream key (`stream_keys`).
        fill: the label of unused prediction slots (`IGNORE_INDEX`).
    """
    ids = np.array(token_ids, dtype=np.int64)
    rows, width = ids.shape
    config = masker.config
    maskable = ~masker._special[ids] & (np.arange(width)[None, :] < np.asarray(lengths)[:, None])
    available = maskable.sum(axis=1)
    # round half to even, as Python's round() in `num_to_predict`
    wanted = np.maximum(1, np.rint(available * config.mlm_probability).astype(np.int64))
    counts = np.where(available == 0, 0, np.minimum(np.minimum(wanted, config.max_predictions_per_seq), available))
    choose = np.where(maskable, _token_draws(keys, width, _CHOOSE), np.iinfo(np.uint64).max)
    order = np.argsort(choose, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(width)[None, :].repeat(rows, axis=0), axis=1)
    chosen = ranks < counts[:, None]
    draws = _uniform(_token_draws(keys, width, _DECIDE))
    to_mask = chosen & (draws < config.mask_token_probability)
    to_random = chosen & ~to_mask & (draws < config.mask_token_probability + config.random_token_probability)
    replacement = masker._replacements[
        (_uniform(_token_draws(keys, width, _REPLACE)) * masker._replacements.size).astype(np.int64)]
    row_of, position = np.nonzero(chosen)  # row-major: ascending positions within a row
    slot = np.cumsum(chosen, axis=1)[row_of, position] - 1
    slots = int(counts.max()) if rows else 0
    positions = np.zeros((rows, slots), dtype=np.int64)
    labels = np.full((rows, slots), fill, dtype=np.int64)
    positions[row_of, slot] = position
    labels[row_of, slot] = ids[row_of, position]
    ids[to_mask] = masker.mask_id
    ids[to_random] = replacement[to_random]
    return MaskedBatch(ids, positions, labels, counts)


def mask_rows(masker: Masker, token_ids: np.ndarray, word_starts: np.ndarray, lengths: np.ndarray,
              keys: np.ndarray, fill: int) -> MaskedBatch:
    """`mask_batch`'s result with every row masked by `Masker.mask` (whole-word masking, whose word choice is
    sequential), each from a generator seeded with the row's key."""
    ids = np.array(token_ids, dtype=np.int64)
    results = [masker.mask(ids[r, :length], word_starts[r, :length], np.random.default_rng(int(keys[r])))
               for r, length in enumerate(np.asarray(lengths).tolist())]
    counts = np.array([result.positions.size for result in results], dtype=np.int64)
    slots = int(counts.max()) if counts.size else 0
    positions = np.zeros((len(results), slots), dtype=np.int64)
    labels = np.full((len(results), slots), fill, dtype=np.int64)
    for r, result in enumerate(results):
        ids[r, :result.input_ids.size] = result.input_ids
        positions[r, :counts[r]] = result.positions
        labels[r, :counts[r]] = result.labels
    return MaskedBatch(ids, positions, labels, counts)
