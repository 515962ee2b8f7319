"""What every fine-tuning family shares: the feature record, the data report, batching.

The readers (`classification`, `conll`, `squad`, `choice`) turn files into examples and the families turn
examples into `Feature`s; this module owns the pieces they have in common:

- `Feature`: one model input (one window of one example) with its training target and the bookkeeping the
  evaluation needs to map predictions back to the example (offsets, max-context flags, word indices).
- `DataReport`: counts of everything a reader or feature builder did besides copying rows — rows skipped,
  answers repaired, inputs windowed, questions truncated — with the first few file:line locations of each,
  so nothing is ever dropped or changed silently.
- `collate_features` and `FeatureBatches`: the one collator (padding to the longest input of a batch) and
  the in-memory batch source that training, evaluation, predict, the pipelines and the server iterate
  (shuffled per epoch from the seed and resumable mid-epoch for training; sorted by length otherwise).

Windowing is the tokenizer's (`tokenization.windows`); each family's feature builder uses it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.collate import pad_sequences
from bertforge.errors import ConfigError

log = logging.getLogger(__name__)

# How many locations a report keeps per kind of event (the count is always complete).
REPORT_SAMPLES = 5
# Report kinds that are plain tallies rather than something done to the data. Windowing a long input is
# expected behaviour (every window is used), not an alarm: information, with its count.
INFORMATIONAL = ("rows:", "features:", "limited_from:", "rows_without_labels:", "windowed_inputs:", "windows:")


@dataclass
class DataReport:
    """Counts of what reading and feature building did, with sample locations ("file:line") per kind.

    Kinds used across the readers: `rows` (read), `skipped_<reason>` (dropped with `on_invalid="skip"`),
    `answers_repaired`, `answers_unfound`, `bio_problems`, `windowed_inputs`, `windows`, `truncated_*`,
    `words_without_tokens`.
    """

    counts: Counter = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, kind: str, where: str | None = None, amount: int = 1) -> None:
        self.counts[kind] += amount
        if where is not None:
            kept = self.samples.setdefault(kind, [])
            if len(kept) < REPORT_SAMPLES and where not in kept:
                kept.append(where)

    def merge(self, other: DataReport, prefix: str = "") -> DataReport:
        """Add `other`'s counts and samples, their kinds prefixed with `prefix` (e.g. "dev.")."""
        for kind, amount in other.counts.items():
            self.counts[prefix + kind] += amount
        for kind, places in other.samples.items():
            kept = self.samples.setdefault(prefix + kind, [])
            kept.extend(places[: REPORT_SAMPLES - len(kept)])
        return self

    def __getitem__(self, kind: str) -> int:
        return self.counts.get(kind, 0)

    def lines(self) -> list[str]:
        """One human-readable line per kind, e.g. "answers_repaired: 200 (e.g. dev.json:1234, ...)"."""
        out = []
        for kind in sorted(self.counts):
            places = self.samples.get(kind)
            suffix = f" (e.g. {', '.join(places)})" if places else ""
            out.append(f"{kind}: {self.counts[kind]}{suffix}")
        return out

    def to_dict(self) -> dict:
        return {"counts": dict(sorted(self.counts.items())), "samples": dict(sorted(self.samples.items()))}

    def log_warnings(self, what: str) -> None:
        """Log the counts: plain tallies and windowing at INFO, anything dropped, changed or cut at WARNING."""
        for line in self.lines():
            level = logging.INFO if line.startswith(INFORMATIONAL) else logging.WARNING
            log.log(level, "%s: %s", what, line)


@dataclass
class Feature:
    """One model input: a window of one example, with its target and what decoding needs.

    Attributes:
        example_index: index of the example this window belongs to (several windows may share it).
        input_ids: [T] token ids with [CLS]/[SEP], or [C][T] for multiple choice (one row per choice).
        token_type_ids: same shape as input_ids.
        label: sequence target: class id (int), score (float, regression), one 0.0/1.0 per label (multi-label),
            or the right choice; None unlabeled.
        token_labels: [T] tagging targets, IGNORE_INDEX where a token carries no label.
        start_position / end_position: QA targets (token indices; 0 = [CLS] when the answer is not here).
        offsets: [T] character span in the example text of each token, None for [CLS]/[SEP]/question tokens.
        max_context: [T] True where this window is the one where the token has most context.
        word_index: [T] tagging: the word whose prediction this token gives (its first sub-token, in the
            token's max-context window); None elsewhere. Every tokenised word appears exactly once over all
            windows of its example.
        window: position of this window among its example's windows.
        mask_positions: fill-mask: where the [MASK] tokens of the input are.
    """

    example_index: int
    input_ids: list
    token_type_ids: list
    label: int | float | list[float] | None = None
    token_labels: list[int] | None = None
    start_position: int | None = None
    end_position: int | None = None
    offsets: list[tuple[int, int] | None] | None = None
    max_context: list[bool] | None = None
    word_index: list[int | None] | None = None
    window: int = 0
    mask_positions: list[int] | None = None

    def __len__(self) -> int:
        first = self.input_ids[0] if self.input_ids else []
        return max(len(row) for row in self.input_ids) if isinstance(first, list) else len(self.input_ids)


# --- batching ---------------------------------------------------------------------------------------------

@dataclass
class FinetuneBatch:
    """A padded batch of features.

    input_ids, token_type_ids, attention_mask: long [B, T] ([B, C, T] for multiple choice).
    labels: long [B] (classes, choices), float [B] (regression) or long [B, T] (tagging); None unlabeled.
    start_positions, end_positions: long [B] (QA) or None.
    mlm_positions: long [B, M] (fill-mask), the [MASK] positions, 0-padded; or None.
    feature_index: long [B], indices into the feature list the batch was drawn from (for decoding).
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    feature_index: torch.Tensor
    labels: torch.Tensor | None = None
    start_positions: torch.Tensor | None = None
    end_positions: torch.Tensor | None = None
    mlm_positions: torch.Tensor | None = None

    def to(self, device: str | torch.device) -> FinetuneBatch:
        def move(x):
            return None if x is None else x.to(device, non_blocking=True)

        return FinetuneBatch(move(self.input_ids), move(self.token_type_ids), move(self.attention_mask),
                             move(self.feature_index), move(self.labels), move(self.start_positions),
                             move(self.end_positions), move(self.mlm_positions))

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for a task model's forward: the inputs only (the task computes the loss)."""
        return {"input_ids": self.input_ids, "token_type_ids": self.token_type_ids,
                "attention_mask": self.attention_mask}

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate_features(features: Sequence[Feature], indices: Sequence[int], pad_token_id: int) -> FinetuneBatch:
    """Pad `features` to the longest one and stack them into a `FinetuneBatch` (padding by `pad_sequences`,
    the one padding routine, which pretraining batches use too).

    Args:
        features: the batch's features (all of one family).
        indices: their positions in the full feature list (kept as `feature_index`).
        pad_token_id: id used to pad `input_ids` (type ids pad with 0, token labels with IGNORE_INDEX).
    """
    width = max(len(f) for f in features)
    choice = isinstance(features[0].input_ids[0], list) if features[0].input_ids else False

    def pad(rows, value: int) -> torch.Tensor:
        if choice:  # [B][C][T_c] -> [B, C, T]: every choice row padded to the batch's longest
            return torch.stack([pad_sequences(row, value, min_length=width) for row in rows])
        return pad_sequences(rows, value, min_length=width)

    ones = [[[1] * len(r) for r in f.input_ids] if choice else [1] * len(f.input_ids) for f in features]
    batch = FinetuneBatch(pad([f.input_ids for f in features], pad_token_id),
                          pad([f.token_type_ids for f in features], 0), pad(ones, 0),
                          torch.tensor(list(indices), dtype=torch.long))
    first = features[0]
    if first.token_labels is not None:
        batch.labels = pad_sequences([f.token_labels for f in features], IGNORE_INDEX, min_length=width)
    elif first.label is not None:
        # Regression scores and multi-label targets (one 0/1 per label) are floats; class ids are longs.
        dtype = torch.float32 if isinstance(first.label, float | list) else torch.long
        batch.labels = torch.tensor([f.label for f in features], dtype=dtype)
    if first.mask_positions is not None:
        batch.mlm_positions = pad_sequences([f.mask_positions for f in features], 0)
    if first.start_position is not None:
        batch.start_positions = torch.tensor([f.start_position for f in features], dtype=torch.long)
        batch.end_positions = torch.tensor([f.end_position for f in features], dtype=torch.long)
    return batch


class FeatureBatches:
    """In-memory batch source over a feature list: what the training loop and the evaluation iterate.

    Each pass over the object is one epoch. With `shuffle`, epoch e visits the features in the order of a
    permutation drawn from `numpy.random.default_rng([seed, e])`, so any epoch's order is reproducible on
    its own; without, features come sorted by length (less padding; evaluation decodes by feature index).
    `state_dict()` records (epoch, batches already yielded); loading it resumes at the next batch, in O(1).
    Under data parallelism each of `world_size` ranks takes every `world_size`-th batch of the same epoch
    order, and all ranks yield the same number of batches (the last few of an epoch may be left to the
    next epoch's reshuffle) so that no rank waits for another at a collective.

    Args:
        features: the features.
        batch_size: features per batch.
        pad_token_id: the tokenizer's [PAD] id.
        shuffle: reshuffle every epoch (training) or keep a fixed order (evaluation).
        seed: seed of the shuffling.
        drop_last: drop a final short batch.
        rank, world_size: this process's share under data parallelism (default: everything).
    """

    def __init__(self, features: Sequence[Feature], batch_size: int, pad_token_id: int, *, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, rank: int = 0, world_size: int = 1):
        if batch_size <= 0:
            raise ConfigError(f"batch_size={batch_size} must be positive")
        if not features:
            raise ConfigError("no features to batch: the data file gave no usable examples")
        self.features = list(features)
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside world_size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0
        self._by_length = sorted(range(len(self.features)), key=lambda i: len(self.features[i]))

    def total_batches(self) -> int:
        """Batches per epoch over all ranks."""
        full, rest = divmod(len(self.features), self.batch_size)
        return full if self.drop_last or not rest else full + 1

    def __len__(self) -> int:
        total = self.total_batches()
        return total if self.world_size == 1 else max(1, total // self.world_size)

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return self._by_length
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.features)).tolist()

    def __iter__(self) -> Iterator[FinetuneBatch]:
        order = self.order(self.epoch)
        for b in range(self.position, len(self)):
            global_batch = (b * self.world_size + self.rank) % self.total_batches()
            indices = order[global_batch * self.batch_size:(global_batch + 1) * self.batch_size]
            self.position = b + 1
            yield collate_features([self.features[i] for i in indices], indices, self.pad_token_id)
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
