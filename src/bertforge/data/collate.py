"""Batching: padding variable-length sequences into tensors, and the pretraining batch.

`pad_sequences` is the one padding routine (fine-tuning collators use it too). `collate_pretraining` turns
masked instances into a `PretrainingBatch` whose `model_inputs()` are exactly the keyword arguments of
`BertForPretraining.forward`. Sequences are padded to the longest in the batch (optionally rounded up to a
multiple of 8 for tensor cores), never to a fixed maximum; the masked positions are padded to the most
predictions in the batch, with `IGNORE_INDEX` labels in the padding so the loss skips them.

`pack_pretraining` is the packing alternative: it places several short instances side by side in one row of
the prepared length (first-fit decreasing), marks which sequence each token belongs to (`sequence_ids`), and
the model keeps them apart (block-diagonal attention, positions restarting at 0, one NSP prediction per
instance). The same instances give the same losses either way; packed batches just have fewer rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.errors import ConfigError


def padded_length(length: int, pad_to_multiple_of: int | None) -> int:
    """`length` rounded up to a multiple of `pad_to_multiple_of` (unchanged when None)."""
    if pad_to_multiple_of is None:
        return length
    if isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
        raise ConfigError(f"pad_to_multiple_of must be a positive integer or None, got {pad_to_multiple_of!r}")
    return -(-length // pad_to_multiple_of) * pad_to_multiple_of


def pad_sequences(
    sequences: Sequence[Sequence[int] | np.ndarray | torch.Tensor],
    pad_value: int = 0,
    *,
    pad_to_multiple_of: int | None = None,
    min_length: int = 0,
    dtype: torch.dtype = torch.long,
) -> torch.Tensor:
    """Right-pad sequences into one [B, T] tensor, T = the longest (or `min_length`), rounded up if asked.

    Args:
        sequences: B sequences of numbers (lists, numpy arrays or 1-d tensors).
        pad_value: the value of padding positions.
        pad_to_multiple_of: round T up to a multiple of this (8 suits tensor cores).
        min_length: T is at least this.
        dtype: the tensor dtype.

    Returns:
        [B, T] tensor.
    """
    arrays = [np.asarray(item.cpu() if isinstance(item, torch.Tensor) else item) for item in sequences]
    for index, array in enumerate(arrays):
        if array.ndim != 1:
            raise ConfigError(f"pad_sequences expects 1-d sequences; item {index} has shape {array.shape}")
    longest = max((len(array) for array in arrays), default=0)
    length = padded_length(max(longest, min_length), pad_to_multiple_of)
    numpy_dtype = torch.empty((), dtype=dtype).numpy().dtype
    out = np.full((len(arrays), length), pad_value, dtype=numpy_dtype)
    for row, array in enumerate(arrays):
        out[row, : len(array)] = array
    return torch.from_numpy(out)


@dataclass
class PretrainingExample:
    """One masked instance, ready to batch.

    Attributes:
        input_ids: int [T] token ids after masking (``[CLS] A [SEP] B [SEP]``).
        segment_b_start: index of the first B token (token type 1 from here on).
        mlm_positions: int [M] positions to predict, ascending.
        mlm_labels: int [M] their original ids.
        nsp_label: 0 = B follows A, 1 = B is random.
    """

    input_ids: np.ndarray
    segment_b_start: int
    mlm_positions: np.ndarray
    mlm_labels: np.ndarray
    nsp_label: int


_MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "mlm_positions", "mlm_labels", "nsp_labels",
                 "sequence_ids")


@dataclass
class PretrainingBatch:
    """A batch for `BertForPretraining` (B sequences of T tokens, M prediction slots each).

    Attributes:
        input_ids: long [B, T].
        token_type_ids: long [B, T]: 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``, 0 in padding.
        attention_mask: long [B, T], 1 = real token, 0 = padding.
        mlm_positions: long [B, M], indices into T (0 in padding slots).
        mlm_labels: long [B, M], original token ids, `IGNORE_INDEX` in padding slots.
        nsp_labels: long [B], 0 = B follows A, 1 = random (never ignored); [S] for packed rows.
        sequence_ids: long [B, T] for packed rows (k = the row's k-th instance, 0 = padding), else None.
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    mlm_positions: torch.Tensor
    mlm_labels: torch.Tensor
    nsp_labels: torch.Tensor
    sequence_ids: torch.Tensor | None = None
    # Real tokens, counted on the host when the batch is built so that reading it never syncs a device.
    _num_tokens: int | None = field(default=None, repr=False, compare=False)

    def to(self, device: torch.device | str, non_blocking: bool | None = None) -> PretrainingBatch:
        """A copy with every tensor on `device`. Copies to a GPU are asynchronous by default (they overlap the
        running step when the batch is pinned: `pin_memory`); copies back never are, as the host would read
        them before they land."""
        if non_blocking is None:
            non_blocking = torch.device(device).type == "cuda"
        moved = {name: tensor.to(device, non_blocking=non_blocking) for name, tensor in self.model_inputs().items()}
        return PretrainingBatch(**moved, _num_tokens=self._num_tokens)

    def pin_memory(self) -> PretrainingBatch:
        """A copy in page-locked memory (the DataLoader's pin thread calls this), so that the copy to a GPU
        runs asynchronously."""
        pinned = {name: tensor.pin_memory() for name, tensor in self.model_inputs().items()}
        return PretrainingBatch(**pinned, _num_tokens=self._num_tokens)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of `BertForPretraining.forward`."""
        return {name: getattr(self, name) for name in _MODEL_INPUTS if getattr(self, name) is not None}

    def __len__(self) -> int:
        """Rows (each holding one instance, or several when packed)."""
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch, as a Python int (no device sync after `collate`)."""
        if self._num_tokens is None:
            self._num_tokens = int(self.attention_mask.sum().item())
        return self._num_tokens

    @property
    def num_predictions(self) -> int:
        """Masked positions to predict in the batch (labels that are not `IGNORE_INDEX`)."""
        return int((self.mlm_labels != IGNORE_INDEX).sum().item())


def collate_pretraining(
    examples: Sequence[PretrainingExample], *, pad_id: int = 0, pad_to_multiple_of: int | None = None
) -> PretrainingBatch:
    """Pad masked instances into a `PretrainingBatch`.

    Args:
        examples: the instances (at least one).
        pad_id: id of ``[PAD]``.
        pad_to_multiple_of: round T up to a multiple of this.

    Returns:
        The batch; T is the longest instance (rounded up), M the most predictions of any instance.
    """
    if not examples:
        raise ConfigError("cannot collate an empty list of pretraining examples")
    lengths = [len(example.input_ids) for example in examples]
    batch, length = len(examples), padded_length(max(lengths), pad_to_multiple_of)
    slots = max(len(example.mlm_positions) for example in examples)
    input_ids = np.full((batch, length), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((batch, length), dtype=np.int64)
    attention_mask = np.zeros((batch, length), dtype=np.int64)
    mlm_positions = np.zeros((batch, slots), dtype=np.int64)
    mlm_labels = np.full((batch, slots), IGNORE_INDEX, dtype=np.int64)
    for row, example in enumerate(examples):
        size = lengths[row]
        input_ids[row, :size] = example.input_ids
        token_type_ids[row, example.segment_b_start:size] = 1
        attention_mask[row, :size] = 1
        count = len(example.mlm_positions)
        mlm_positions[row, :count] = example.mlm_positions
        mlm_labels[row, :count] = example.mlm_labels
    return PretrainingBatch(
        input_ids=torch.from_numpy(input_ids),
        token_type_ids=torch.from_numpy(token_type_ids),
        attention_mask=torch.from_numpy(attention_mask),
        mlm_positions=torch.from_numpy(mlm_positions),
        mlm_labels=torch.from_numpy(mlm_labels),
        nsp_labels=torch.tensor([example.nsp_label for example in examples], dtype=torch.long),
        _num_tokens=sum(lengths),
    )


def masked_examples(masked_ids: np.ndarray, lengths: np.ndarray, segment_b_starts: np.ndarray,
                    positions: np.ndarray, counts: np.ndarray, labels: np.ndarray,
                    nsp_labels: np.ndarray) -> list[PretrainingExample]:
    """The rows of a masked padded block as `PretrainingExample`s (what `pack_pretraining` takes)."""
    return [PretrainingExample(masked_ids[r, :lengths[r]], int(segment_b_starts[r]), positions[r, :counts[r]],
                               labels[r, :counts[r]], int(nsp_labels[r])) for r in range(len(lengths))]


def collate_block(masked_ids: np.ndarray, lengths: np.ndarray, segment_b_starts: np.ndarray,
                  positions: np.ndarray, labels: np.ndarray, nsp_labels: np.ndarray) -> PretrainingBatch:
    """A `PretrainingBatch` from instances already padded as one block (the layout `collate_pretraining`
    builds from examples, without a loop over them).

    Args:
        masked_ids: int64 [B, T] masked token ids, padded.
        lengths, segment_b_starts, nsp_labels: int [B].
        positions, labels: int64 [B, M] prediction slots (`IGNORE_INDEX` labels in unused ones).
    """
    columns = np.arange(masked_ids.shape[1])[None, :]
    real = columns < np.asarray(lengths)[:, None]
    token_type_ids = (real & (columns >= np.asarray(segment_b_starts)[:, None])).astype(np.int64)
    return PretrainingBatch(
        input_ids=torch.from_numpy(np.ascontiguousarray(masked_ids, dtype=np.int64)),
        token_type_ids=torch.from_numpy(token_type_ids),
        attention_mask=torch.from_numpy(real.astype(np.int64)),
        mlm_positions=torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)),
        mlm_labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)),
        nsp_labels=torch.from_numpy(np.asarray(nsp_labels, dtype=np.int64).copy()),
        _num_tokens=int(np.asarray(lengths).sum()),
    )


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices whose lengths sum to at most `capacity`: longest items first, each into the first
    bin with room. Deterministic (ties keep input order); items keep ascending index order inside a bin."""
    bins: list[list[int]] = []
    room: list[int] = []
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        size = lengths[item]
        if size > capacity:
            raise ConfigError(f"an instance of {size} tokens does not fit a packed row of {capacity}; "
                              "pack to at least the prepared max_seq_length")
        target = next((b for b, free in enumerate(room) if free >= size), None)
        if target is None:
            bins.append([item])
            room.append(capacity - size)
        else:
            bins[target].append(item)
            room[target] -= size
    return [sorted(items) for items in bins]


def pack_pretraining(
    examples: Sequence[PretrainingExample], *, capacity: int, pad_id: int = 0,
    pad_to_multiple_of: int | None = None, full_rows: bool = False, slots_multiple_of: int | None = None,
) -> PretrainingBatch:
    """Pack masked instances into rows of at most `capacity` tokens (module docstring).

    Args:
        examples: the instances (at least one).
        capacity: tokens per row (the prepared max_seq_length); no instance may be longer.
        pad_id: id of ``[PAD]``.
        pad_to_multiple_of: round T up to a multiple of this.
        full_rows: T is `capacity` whatever the rows hold (a shape a compiled step keeps).
        slots_multiple_of: round M up to a multiple of this.

    Returns:
        A batch with `sequence_ids`; `nsp_labels` has one entry per instance, in row-major order of the rows.
    """
    if not examples:
        raise ConfigError("cannot collate an empty list of pretraining examples")
    lengths = [len(example.input_ids) for example in examples]
    rows = first_fit_decreasing(lengths, capacity)
    length = capacity if full_rows else padded_length(max(sum(lengths[i] for i in row) for row in rows),
                                                      pad_to_multiple_of)
    slots = padded_length(max(sum(len(examples[i].mlm_positions) for i in row) for row in rows), slots_multiple_of)
    shape = (len(rows), length)
    input_ids = np.full(shape, pad_id, dtype=np.int64)
    token_type_ids = np.zeros(shape, dtype=np.int64)
    sequence_ids = np.zeros(shape, dtype=np.int64)
    mlm_positions = np.zeros((len(rows), slots), dtype=np.int64)
    mlm_labels = np.full((len(rows), slots), IGNORE_INDEX, dtype=np.int64)
    nsp_labels = []
    for r, row in enumerate(rows):
        start = slot = 0
        for number, item in enumerate(row, start=1):
            example, size = examples[item], lengths[item]
            input_ids[r, start:start + size] = example.input_ids
            token_type_ids[r, start + example.segment_b_start:start + size] = 1
            sequence_ids[r, start:start + size] = number
            count = len(example.mlm_positions)
            mlm_positions[r, slot:slot + count] = np.asarray(example.mlm_positions) + start
            mlm_labels[r, slot:slot + count] = example.mlm_labels
            nsp_labels.append(example.nsp_label)
            start, slot = start + size, slot + count
    return PretrainingBatch(
        input_ids=torch.from_numpy(input_ids),
        token_type_ids=torch.from_numpy(token_type_ids),
        attention_mask=torch.from_numpy((sequence_ids > 0).astype(np.int64)),
        mlm_positions=torch.from_numpy(mlm_positions),
        mlm_labels=torch.from_numpy(mlm_labels),
        nsp_labels=torch.tensor(nsp_labels, dtype=torch.long),
        sequence_ids=torch.from_numpy(sequence_ids),
        _num_tokens=sum(lengths),
    )
