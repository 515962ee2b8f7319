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

import dataclasses
import logging
import math
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
        truncated: the window holds less than its input: cut to fit, not windowed (the embedding-like routes'
            and `bertforge embed`'s rule, `inference.wire_inputs`), so that the cut can be counted and said.
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
    truncated: bool = False

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
    rows = max(len(f.input_ids) for f in features) if choice else 0
    if choice and any(len(f.input_ids) != rows for f in features):
        # Lists of different lengths (listwise reranking): the short ones get one-token padding rows (a row
        # without a real token has nothing to attend to) and NaN labels, which their loss leaves out.
        features = [f if len(f.input_ids) == rows else dataclasses.replace(
            f, input_ids=f.input_ids + [[pad_token_id]] * (rows - len(f.input_ids)),
            token_type_ids=f.token_type_ids + [[0]] * (rows - len(f.input_ids)),
            label=list(f.label) + [math.nan] * (rows - len(f.input_ids)))
            for f in features]

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

    Each pass over the object is (the rest of) one epoch. With `shuffle`, epoch e visits the features in the
    order of a permutation drawn from `numpy.random.default_rng([seed, e])`, so any epoch's order is
    reproducible on its own; without, features come sorted by length (less padding; evaluation decodes by
    feature index).

    The order is cut into optimizer steps of ``batch_size * world_size * grad_accumulation`` features; within
    a step, micro-batch a of rank r takes slice ``a * world_size + r`` of ``batch_size``. So every layout of
    one global step size (4 ranks, 2 ranks x accumulation 2, 1 rank with a 4x batch) takes the same features
    in every step, and all ranks yield the same number of batches (no rank waits for another at a
    collective). An epoch ends on a step: a last, partial step of R features is split as evenly as possible
    over its ``world_size * grad_accumulation`` micro-batches when R is at least that number (always, in one
    process), else left to the next epoch's reshuffle; `drop_last` drops it always.

    `state_dict()` records (epoch, features of the epoch consumed by whole steps over all ranks): a position
    of the global stream, so a run saved at one world size resumes at another in O(1) (the same global step
    size then gives exactly the uninterrupted run's steps). `data.datasets.record_examples` records each
    training batch's feature indices when asked.

    Args:
        features: the features.
        batch_size: features per micro-batch.
        pad_token_id: the tokenizer's [PAD] id.
        shuffle: reshuffle every epoch (training) or keep a fixed order (evaluation).
        seed: seed of the shuffling.
        drop_last: drop a final partial step.
        rank, world_size: this process's share under data parallelism (default: everything).
        grad_accumulation: micro-batches per optimizer step (the run's accumulation).
    """

    def __init__(self, features: Sequence[Feature], batch_size: int, pad_token_id: int, *, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, rank: int = 0, world_size: int = 1,
                 grad_accumulation: int = 1):
        if batch_size <= 0:
            raise ConfigError(f"batch_size={batch_size} must be positive")
        if grad_accumulation <= 0:
            raise ConfigError(f"grad_accumulation={grad_accumulation} must be positive")
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
        self.grad_accumulation = grad_accumulation
        self.epoch = 0
        self.consumed = 0  # features of this epoch taken by whole optimizer steps, over all ranks
        self._by_length = sorted(range(len(self.features)), key=lambda i: len(self.features[i]))

    @property
    def micro_batches(self) -> int:
        """Micro-batches per optimizer step over all ranks."""
        return self.world_size * self.grad_accumulation

    @property
    def step_size(self) -> int:
        """Features per whole optimizer step over all ranks."""
        return self.batch_size * self.micro_batches

    def total_batches(self) -> int:
        """Micro-batches per epoch over all ranks."""
        return len(self) * self.world_size

    def __len__(self) -> int:
        """Micro-batches per epoch on this rank (optimizer steps times `grad_accumulation`)."""
        full, rest = divmod(len(self.features), self.step_size)
        partial = not self.drop_last and rest >= self.micro_batches
        return (full + partial) * self.grad_accumulation

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return self._by_length
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.features)).tolist()

    def step_slices(self, order: list[int], start: int) -> tuple[list[list[int]], int] | None:
        """This rank's micro-batches of the step starting at feature `start` of `order`, and the step's size
        over all ranks; None when no step starts there (the epoch is over)."""
        remaining = len(order) - start
        if remaining >= self.step_size:
            chunk = order[start:start + self.step_size]
            slices = [chunk[i * self.batch_size:(i + 1) * self.batch_size] for i in range(self.micro_batches)]
        elif not self.drop_last and remaining >= self.micro_batches:
            parts = np.array_split(np.asarray(order[start:], dtype=np.int64), self.micro_batches)
            slices = [part.tolist() for part in parts]
        else:
            return None
        mine = [slices[a * self.world_size + self.rank] for a in range(self.grad_accumulation)]
        return mine, min(remaining, self.step_size)

    def __iter__(self) -> Iterator[FinetuneBatch]:
        from bertforge.data.datasets import record_examples

        order = self.order(self.epoch)
        while (step := self.step_slices(order, self.consumed)) is not None:
            mine, size = step
            for a, indices in enumerate(mine):
                if a == len(mine) - 1:
                    self.consumed += size  # the state after a step's last batch is the next step's start
                if self.shuffle:
                    record_examples(self.rank, self.epoch, indices)
                yield collate_features([self.features[i] for i in indices], indices, self.pad_token_id)
        self.epoch += 1
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "consumed", "seed"}``: the same on every rank and for any world size."""
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue after the step `state` was taken at. A state of the earlier format (``position``: batches
        this rank yielded, with the same world size and no accumulation) is read too."""
        self.epoch = int(state["epoch"])
        if "consumed" in state:
            self.consumed = int(state["consumed"])
        else:
            self.consumed = min(int(state["position"]) * self.batch_size * self.world_size, len(self.features))
        self.seed = int(state.get("seed", self.seed))
