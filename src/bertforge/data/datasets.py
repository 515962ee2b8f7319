"""The pretraining batch stream: prepared shards -> shuffled, rank-sharded, dynamically masked batches.

`PretrainingData` is an endless iterator of `PretrainingBatch` over epochs of one split of a directory
written by `prepare_corpus`. Its contracts, which the training loop relies on:

- **Order.** Each epoch visits every instance once, in a permutation drawn from ``(seed, epoch)``.
- **Ranks.** The permutation is cut into *global batches* of ``world_size * batch_size`` instances; rank r
  takes the r-th slice of ``batch_size`` of each. So `world_size` ranks with batch B see, step by step,
  exactly the instances one rank with batch ``world_size * B`` sees, in the same order (rank 0's slice
  first): DDP is equivalent to one large batch. (With ``drop_last=False`` the epoch is padded by repeating
  its first instances to a multiple of `world_size`, so only the last, partial step can differ.)
- **Steps.** With ``grad_accumulation = A`` an optimizer step takes A consecutive global batches, and an
  epoch ends on a step: the instances left after the last whole step of ``batch_size * world_size * A`` are
  not used that epoch (``drop_last``). So every layout of one global step size (4 ranks x batch 8, 2 ranks
  x batch 8 x accumulation 2, 1 rank x batch 32) sees the same instances in every step, epochs included.
- **Masks.** The masks of instance i in epoch e are a function of the key ``(seed, e, i)`` (i is the
  instance's index in the split, not its place in a batch: `data.masking.stream_keys`), so they do not
  depend on batch size, rank layout, resumption or the number of `workers`. With ``static_masks = k`` the
  key is ``(seed, e mod k, i)`` instead.
- **Workers.** With ``workers = n`` batches are read, masked and collated in n DataLoader processes ahead of
  the training step (`data.loading`); the stream, its position and its state are those of the batches
  handed out, exactly as without workers.
- **Resume.** `state_dict` is a small JSON-able dict (epoch and position in the epoch); after
  `load_state_dict` the next batches are exactly those the uninterrupted stream would have produced, at
  O(1) cost (nothing is replayed). The position counts instances of the whole (global) stream, not
  batches of one rank, so a run may resume with another world size or batch size (see
  `training.resume.keep_global_batch`).
- **Record.** With the environment variable ``BERTFORGE_RECORD_EXAMPLES=DIR`` (a debugging and test hook),
  every training batch appends ``{"epoch", "ids"}`` (the indices of its instances or features) as one line to
  ``DIR/examples-rank<r>.jsonl``: which examples each rank consumed, in order (`record_examples`).

`evaluation_batches` is the fixed evaluation stream (held-out split): every instance once, in order, with
masks from the seed alone, so held-out metrics are comparable from one evaluation to the next.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator

import numpy as np

from bertforge.data.collate import PretrainingBatch
from bertforge.data.loading import BatchMaker, BatchPlan, start_loader
from bertforge.data.masking import Masker, MaskingConfig, stream_keys
from bertforge.data.shards import ShardIndex, SplitReader
from bertforge.errors import ConfigError, DataError

# Stream tags mixed into every seed so that shuffling, dynamic, static and evaluation masks never share draws.
_SHUFFLE, _DYNAMIC, _STATIC, _EVALUATION = 0, 1, 2, 3
RECORD_ENV = "BERTFORGE_RECORD_EXAMPLES"


def record_examples(rank: int, epoch: int, ids: Iterable[int]) -> None:
    """Append one training batch's example ids to ``$BERTFORGE_RECORD_EXAMPLES/examples-rank<rank>.jsonl``
    (nothing when the variable is unset): the hook that lets a test check which examples every rank consumed
    over a run, across kills and resumes."""
    folder = os.environ.get(RECORD_ENV)
    if not folder:
        return
    line = json.dumps({"epoch": int(epoch), "ids": [int(i) for i in ids]})
    with open(os.path.join(folder, f"examples-rank{rank}.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class PretrainingData:
    """Batches of masked pretraining instances, endlessly, over epochs (module docstring for the contracts).

    Args:
        data_dir: a directory written by `prepare_corpus`.
        split: ``"train"`` or ``"heldout"``.
        batch_size: instances per batch on this rank.
        masking: the MLM masking rule.
        seed: seeds the epoch order and the masks.
        rank, world_size: this process's place among data-parallel ranks.
        vocab_size: the model's vocabulary size (checked against the shards).
        special_ids: ids never masked nor used as random replacements (``tokenizer.all_special_ids``).
        mask_id: id of ``[MASK]``.
        pad_id: id of ``[PAD]``.
        drop_last: skip the last partial optimizer step of each epoch (keeps every step the same size).
        grad_accumulation: global batches per optimizer step (the run's accumulation), so an epoch ends on a
            step.
        pad_to_multiple_of: round the padded length up to a multiple of this (8 for tensor cores).
        vocab_checksum: when given, the shards must have been written with this vocabulary
            (`data.shards.vocab_checksum(tokenizer)`).
        pack_sequences: pack each batch's instances several to a row of the prepared length
            (`data.collate.pack_pretraining`): the same instances and masks, fewer rows.
        workers: processes that read, mask and collate batches ahead of the training step (0: in this
            process, when asked). The batches and the resume position are the same for any number.
        pin_memory: hand out batches in page-locked memory (for asynchronous copies to a GPU).
        fixed_shapes: batches in a few shapes a compiled step keeps (`data.loading`): packed rows of the
            prepared length, unpacked ones in `LENGTH_BUCKETS` lengths, prediction slots a multiple of 8.

    Raises:
        DataError: the directory is not a complete data directory of this format, its vocabulary does not
            match, or the split has fewer instances than one global batch.
        ConfigError: a setting is out of range.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | ShardIndex,
        *,
        split: str = "train",
        batch_size: int,
        masking: MaskingConfig,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        vocab_size: int,
        special_ids: Iterable[int],
        mask_id: int,
        pad_id: int = 0,
        drop_last: bool = True,
        pad_to_multiple_of: int | None = None,
        vocab_checksum: str | None = None,
        pack_sequences: bool = False,
        grad_accumulation: int = 1,
        workers: int = 0,
        pin_memory: bool = False,
        fixed_shapes: bool = False,
    ):
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.grad_accumulation = _check_int("grad_accumulation", grad_accumulation, 1)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        self.seed = _check_int("seed", seed, 0)
        if self.rank >= self.world_size:
            raise ConfigError(f"rank must be below world_size ({world_size}), got {rank}")
        if not isinstance(masking, MaskingConfig):
            raise ConfigError(f"masking must be a MaskingConfig, got {type(masking).__name__}")
        self.split = split
        self.masking = masking
        self.pad_id = int(pad_id)
        self.drop_last = bool(drop_last)
        self.pad_to_multiple_of = pad_to_multiple_of
        # A run that reads several splits opens the index once and hands it to each of them.
        self.index = data_dir if isinstance(data_dir, ShardIndex) else ShardIndex.load(data_dir)
        self.index.check_vocab(vocab_size=vocab_size, checksum=vocab_checksum)
        self.pack_sequences = bool(pack_sequences)
        self.capacity = int(self.index.settings.get("max_seq_length", 0))
        if self.pack_sequences and self.capacity <= 0:
            raise DataError("pack_sequences needs the prepared max_seq_length, which index.json lacks; "
                            "prepare the data again", data_dir)
        self.reader = SplitReader(self.index, split)
        self.masker = Masker(masking, vocab_size=vocab_size, special_ids=special_ids, mask_id=mask_id)
        self.maker = BatchMaker(self.reader, self.masker, pad_id=self.pad_id, pad_to_multiple_of=pad_to_multiple_of,
                                capacity=self.capacity if self.pack_sequences else 0, fixed_shapes=fixed_shapes,
                                max_seq_length=self.capacity)
        self.workers = _check_int("workers", workers, 0)
        self.pin_memory = bool(pin_memory)
        self._loader: Iterator | None = None
        if len(self.reader) == 0:
            raise DataError(
                f"the {split} split has no instances; prepare more data (or a heldout_fraction for 'heldout')",
                data_dir,
            )
        if self.drop_last and len(self.reader) < self.global_batch_size:
            raise DataError(
                f"the {split} split has {len(self.reader)} instances, fewer than one global batch "
                f"({self.world_size} x {self.batch_size}); lower the batch size or prepare more data",
                data_dir,
            )
        self.epoch = 0
        self.position = 0
        self.micro = 0  # global batches of the current optimizer step already yielded
        self._order_epoch = -1
        self._order = np.zeros(0, dtype=np.int64)

    @property
    def num_instances(self) -> int:
        return len(self.reader)

    @property
    def global_batch_size(self) -> int:
        """Instances per step over all ranks."""
        return self.batch_size * self.world_size

    @property
    def step_size(self) -> int:
        """Instances per optimizer step over all ranks and accumulated batches."""
        return self.global_batch_size * self.grad_accumulation

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch on this rank (optimizer steps times `grad_accumulation`)."""
        if self.drop_last:
            return self.num_instances // self.step_size * self.grad_accumulation
        full, rest = divmod(self.num_instances, self.global_batch_size)
        return full + (0 if rest == 0 else 1)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The instance order of `epoch` (padded to a multiple of world_size when drop_last is off)."""
        if epoch != self._order_epoch:
            order = np.random.default_rng([self.seed, _SHUFFLE, epoch]).permutation(self.num_instances)
            extra = -len(order) % self.world_size
            if not self.drop_last and extra:
                order = np.concatenate([order, order[:extra]])
            self._order, self._order_epoch = order, epoch
        return self._order

    def mask_keys(self, epoch: int, instances: np.ndarray) -> np.ndarray:
        """uint64 [B]: the mask stream keys of `instances` in `epoch` (module docstring, Masks)."""
        if self.masking.static_masks:
            return stream_keys(self.seed, _STATIC, epoch % self.masking.static_masks, instances)
        return stream_keys(self.seed, _DYNAMIC, epoch, instances)

    def make_batch(self, instances: np.ndarray, keys: np.ndarray) -> PretrainingBatch:
        """Instances `instances` of the split, in that order, each masked from its key, as one batch."""
        return self.maker.make(instances, keys)

    def plan_next(self, cursor: list[int]) -> BatchPlan:
        """The next batch of the stream at `cursor` = [epoch, position, micro], which it advances."""
        epoch, position, micro = cursor
        order = self.epoch_order(epoch)
        remaining = len(order) - position
        # An epoch ends on an optimizer step: a new step starts only where a whole one fits (drop_last).
        whole = self.step_size if micro == 0 else self.global_batch_size
        if remaining <= 0 or (self.drop_last and remaining < whole):
            epoch, position = epoch + 1, 0
            order = self.epoch_order(epoch)
        step = order[position:position + self.global_batch_size]
        share = len(step) // self.world_size
        mine = step[self.rank * share:(self.rank + 1) * share]
        cursor[:] = [epoch, position + len(step), (micro + 1) % self.grad_accumulation]
        return BatchPlan(mine, self.mask_keys(epoch, mine), epoch, tuple(cursor))

    def __iter__(self) -> Iterator[PretrainingBatch]:
        return self

    def __next__(self) -> PretrainingBatch:
        if self.workers == 0:
            cursor = [self.epoch, self.position, self.micro]
            plan = self.plan_next(cursor)
            batch = self.make_batch(plan.instances, plan.keys)
        else:
            if self._loader is None:
                self._loader = start_loader(self, self.workers, self.pin_memory)
            plan, batch = next(self._loader)
        # The stream's position is that of the batch handed out, not of those the workers made ahead.
        self.epoch, self.position, self.micro = plan.cursor
        record_examples(self.rank, plan.epoch, plan.instances)
        return batch

    def close(self) -> None:
        """Stop the worker processes (a later batch starts them again from the stream's position)."""
        self._loader = None

    def state_dict(self) -> dict:
        """Where the stream is: ``{"epoch", "position", "seed", "num_instances"}`` (JSON-able); `position`
        counts the epoch's instances all ranks consumed, so it is the same on every rank and any world size."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_instances": self.num_instances}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` was taken (same data and seed; batch and world size may differ).

        Raises:
            DataError: the state belongs to other data or another seed, or is malformed.
        """
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
            seed, instances = int(state["seed"]), int(state["num_instances"])
        except (KeyError, TypeError, ValueError) as error:
            raise DataError(f"malformed data-stream state {state!r} ({error}); it needs epoch and position") from None
        if seed != self.seed or instances != self.num_instances:
            raise DataError(
                f"the data-stream state is for seed {seed} over {instances} instances, but this stream has seed "
                f"{self.seed} over {self.num_instances}: resume with the same data directory and seed"
            )
        if epoch < 0 or position < 0:
            raise DataError(f"data-stream state has a negative epoch or position: {state!r}")
        self.close()  # batches the workers made ahead belong to the old position
        self.epoch, self.position, self.micro = epoch, position, 0

    def evaluation_batches(self, max_batches: int | None = None) -> Iterator[PretrainingBatch]:
        """The fixed evaluation stream: every instance once, in order, with masks fixed by the seed.

        Each call yields the same batches. Ranks split every global batch as in training; the last, partial
        one is cut as evenly as possible (a rank whose share is empty skips it), so together the ranks cover
        every instance exactly once.

        Args:
            max_batches: stop after this many batches on this rank (None: the whole split).
        """
        produced = 0
        for start in range(0, self.num_instances, self.global_batch_size):
            if max_batches is not None and produced >= max_batches:
                return
            step = np.arange(start, min(start + self.global_batch_size, self.num_instances))
            mine = np.array_split(step, self.world_size)[self.rank]
            if mine.size == 0:
                continue
            yield self.make_batch(mine, stream_keys(self.seed, _EVALUATION, mine))
            produced += 1
