"""Making pretraining batches, in this process or ahead of the training step in DataLoader workers.

`PretrainingData` (`data.datasets`) decides *which* instances form each batch and with which mask keys: a
`BatchPlan`, cheap, made in the main process in stream order. `BatchMaker` turns a plan into a
`PretrainingBatch`: it reads the instances as one padded block (`SplitReader.batch`), masks the whole block
in a few array operations (`masking.mask_batch`; whole-word masking row by row) and collates it without a
loop over instances. A batch depends on its plan alone, so making it in a worker process, ahead of time,
changes nothing but when the work is done.

`start_loader` runs the makers in `torch.utils.data.DataLoader` workers fed by the plans, with prefetch and,
for a GPU, pinned memory; every batch comes back with its plan, whose cursor becomes the stream's position
when the batch is handed out (so a checkpoint records the batches consumed, not those made ahead).

With `fixed_shapes` (what `pretrain --compile` asks for) batches come in a few shapes the compiler can keep:
packed rows are always `capacity` tokens long, unpacked ones are padded to one of `LENGTH_BUCKETS` lengths
(`length_buckets`), and the prediction slots to a multiple of `SLOT_MULTIPLE`. Padding is ignored by the model
(attention mask, `IGNORE_INDEX` labels), so the losses are those of the tight batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.collate import (
    PretrainingBatch,
    collate_block,
    masked_examples,
    pack_pretraining,
    padded_length,
)
from bertforge.data.masking import MaskedBatch, Masker, mask_batch, mask_rows
from bertforge.data.shards import ShardIndex, SplitReader

# Batches each worker keeps ready: enough to ride out a slow batch, few enough to bound pinned memory.
PREFETCH_PER_WORKER = 4
# `fixed_shapes`: unpacked batches take one of this many lengths up to the prepared length (a compiled step
# meets at most this many token counts: 4 buckets of 32 for 128 tokens, at most 31 padding tokens a row) ...
LENGTH_BUCKETS = 4
# ... and a multiple of this many prediction slots per row (at most 7 empty slots a row, whose labels are ignored).
SLOT_MULTIPLE = 8


def length_buckets(capacity: int, pad_to_multiple_of: int | None = None) -> list[int]:
    """The row lengths of `fixed_shapes` batches of instances up to `capacity` tokens: `LENGTH_BUCKETS`
    even steps (rounded up to `pad_to_multiple_of`), the last one `capacity` itself."""
    step = padded_length(-(-capacity // LENGTH_BUCKETS), pad_to_multiple_of)
    return sorted({min(step * k, capacity) for k in range(1, LENGTH_BUCKETS + 1)})


def bucket_length(width: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `width` tokens (`width` itself beyond the last one)."""
    return next((bucket for bucket in buckets if bucket >= width), width)


def widen(array: np.ndarray, width: int, fill: int) -> np.ndarray:
    """[B, W] -> [B, width] (width >= W), the new columns `fill`."""
    return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=fill)


@dataclass(frozen=True)
class BatchPlan:
    """One batch of the stream: its instances (in batch order), their mask keys, the epoch they belong to,
    and the stream's cursor (epoch, position, micro) once the batch is consumed."""

    instances: np.ndarray
    keys: np.ndarray
    epoch: int
    cursor: tuple[int, int, int]


class BatchMaker:
    """Reads, masks and collates the batch of a plan (module docstring). Picklable: a worker started by
    spawn reopens the memory-mapped shards instead of receiving copies."""

    def __init__(self, reader: SplitReader, masker: Masker, *, pad_id: int, pad_to_multiple_of: int | None,
                 capacity: int = 0, fixed_shapes: bool = False, max_seq_length: int = 0):
        self.reader, self.masker = reader, masker
        self.pad_id, self.pad_to_multiple_of, self.capacity = pad_id, pad_to_multiple_of, capacity
        # (packed rows are `capacity` long; unpacked ones take a bucket up to the prepared length)
        self.buckets = length_buckets(max_seq_length, pad_to_multiple_of) if fixed_shapes and max_seq_length else []
        self.fixed_shapes = fixed_shapes

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["reader"] = (str(self.reader.index.data_dir), self.reader.split)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        data_dir, split = state["reader"]
        self.__dict__.update(state, reader=SplitReader(ShardIndex.load(data_dir), split))

    def make(self, instances: np.ndarray, keys: np.ndarray) -> PretrainingBatch:
        """The batch of `instances` (in that order), instance r masked from `keys[r]`."""
        block = self.reader.batch(instances, self.pad_id, self.pad_to_multiple_of)
        if self.masker.config.whole_word_masking:
            masked = mask_rows(self.masker, block.token_ids, block.word_starts, block.lengths, keys, IGNORE_INDEX)
        else:
            masked = mask_batch(self.masker, block.token_ids, block.lengths, keys, IGNORE_INDEX)
        slots = SLOT_MULTIPLE if self.fixed_shapes else None
        if self.capacity:
            examples = masked_examples(masked.input_ids, block.lengths, block.segment_b_starts, masked.positions,
                                       masked.counts, masked.labels, block.nsp_labels)
            return pack_pretraining(examples, capacity=self.capacity, pad_id=self.pad_id,
                                    pad_to_multiple_of=self.pad_to_multiple_of, full_rows=self.fixed_shapes,
                                    slots_multiple_of=slots)
        if self.fixed_shapes:
            masked = self.fixed(masked)
        return collate_block(masked.input_ids, block.lengths, block.segment_b_starts, masked.positions,
                             masked.labels, block.nsp_labels)

    def fixed(self, masked: MaskedBatch) -> MaskedBatch:
        """`masked` widened to its length bucket and to a multiple of `SLOT_MULTIPLE` prediction slots."""
        width = bucket_length(masked.input_ids.shape[1], self.buckets)
        slots = padded_length(masked.positions.shape[1], SLOT_MULTIPLE)
        return MaskedBatch(widen(masked.input_ids, width, self.pad_id), widen(masked.positions, slots, 0),
                           widen(masked.labels, slots, IGNORE_INDEX), masked.counts)


class PlannedStream(Protocol):
    """What the loader reads of a stream (`data.datasets.PretrainingData`): its position, its batch maker and
    the plan after a cursor. Named here so that this module does not import the stream that imports it."""

    epoch: int
    position: int
    micro: int
    maker: BatchMaker

    def plan_next(self, cursor: list[int]) -> BatchPlan: ...


class _PlannedBatches(torch.utils.data.Dataset):
    """What a worker holds: the maker; the DataLoader hands it plans as 'indices'."""

    def __init__(self, maker: BatchMaker):
        self.maker = maker

    def __getitem__(self, plan: BatchPlan) -> tuple[BatchPlan, PretrainingBatch]:
        return plan, self.maker.make(plan.instances, plan.keys)


class _Plans(torch.utils.data.Sampler):
    """The stream's plans from its current position on, endlessly (a cursor of its own: it runs ahead)."""

    def __init__(self, data: PlannedStream):
        self.data = data

    def __iter__(self) -> Iterator[BatchPlan]:
        cursor = [self.data.epoch, self.data.position, self.data.micro]
        while True:
            yield self.data.plan_next(cursor)


def _as_is(item: Any) -> Any:
    return item


def start_loader(data: PlannedStream, workers: int, pin_memory: bool) -> Iterator[tuple[BatchPlan, PretrainingBatch]]:
    """(plan, batch) pairs made by `workers` processes from `data`'s position on, in stream order."""
    loader = torch.utils.data.DataLoader(
        _PlannedBatches(data.maker), sampler=_Plans(data), batch_size=None, num_workers=workers,
        collate_fn=_as_is, prefetch_factor=PREFETCH_PER_WORKER,
        # The DataLoader's pin thread calls `PretrainingBatch.pin_memory` (plans have none: kept as they are).
        pin_memory=pin_memory,
        # Its own generator: the DataLoader draws a worker seed, which must not come from the run's stream
        # (dropout masks would change with the number of workers). Batches use no worker randomness.
        generator=torch.Generator().manual_seed(0),
    )
    return iter(loader)
