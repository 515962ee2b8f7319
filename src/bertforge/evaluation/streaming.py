"""Running a model over many inputs while the next ones are being made: tokenization off the critical path.

`run_streamed` is `runner.run_features` (through the model's engine, `engine.build.as_engine`) for a long list of inputs whose features (tokenization, windows) are
not built yet. A producer thread turns the inputs into features a chunk at a time, sorts each chunk by length,
cuts it into batches by a token budget (`budget_batches`), collates them and, for a GPU, pins them; the
calling thread only runs the model, batch after batch, from a short queue. So the model never waits for a
tokenizer (it did: every text was tokenized before the first model call), and the host work of the next
batches overlaps the device work of the current one. Outputs come back in input order, with the features
they belong to, exactly as building every feature first and running them would give: a feature's output
depends on its own tokens only (tested equal, thread and no thread, and against `run_features`). Whether the
producer runs as a thread is the engine's plan's (`EnginePlan.tokenizer_threads`: on a CPU whose cores the
intra-op threads take, the features are made in the calling thread, between model calls).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

import torch

from bertforge.data.finetuning import Feature, FinetuneBatch, collate_features
from bertforge.engine.build import as_engine
from bertforge.errors import ConfigError
from bertforge.runtime import DEFAULT_PRECISION

# Inputs tokenized per chunk: enough for well-filled length-sorted batches, few enough that the first batch
# starts at once. Batches ready ahead: a few, so the queue hides a slow chunk without holding much memory.
CHUNK = 2048
AHEAD = 4
_DONE = object()


def budget_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Indices sorted by length (ties keep order), cut into batches of at most `max_rows` rows whose padded
    size (rows x the longest) stays within `max_tokens`; a longer item still gets a batch of its own."""
    if max_rows < 1 or max_tokens < 1:
        raise ConfigError(f"batches need max_rows >= 1 and max_tokens >= 1, got {max_rows} and {max_tokens}")
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        # Sorted ascending: this item is the longest so far, so it sets the batch's padded width.
        if current and (len(current) >= max_rows or (len(current) + 1) * lengths[index] > max_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


# Tokens a batch may pad beyond its own before a new batch starts (`padding_batches`): about what one more
# batch costs on a CPU (its fixed per-call work), so tiny length differences never split a batch.
PADDING_SLACK_TOKENS = 64


def padding_batches(lengths: Sequence[int], max_rows: int) -> list[list[int]]:
    """Indices sorted by length (ties keep order), cut into batches of at most `max_rows` rows, and also
    where the next item would pad the batch by more than it holds (and more than `PADDING_SLACK_TOKENS`): a
    call mixing short and long windows (a server's small requests beside a large one's windows) runs them
    in separate batches instead of padding the short ones to the long ones' length."""
    if max_rows < 1:
        raise ConfigError(f"batches need max_rows >= 1, got {max_rows}")
    batches: list[list[int]] = []
    current: list[int] = []
    held = 0  # tokens of the items in `current`
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        length = lengths[index]
        if current:
            added = len(current) * (length - lengths[current[-1]])  # sorted: the last one is the longest
            if len(current) >= max_rows or added > max(PADDING_SLACK_TOKENS, held):
                batches.append(current)
                current, held = [], 0
        current.append(index)
        held += length
    if current:
        batches.append(current)
    return batches


def pinned(batch: FinetuneBatch) -> FinetuneBatch:
    """The batch in page-locked memory, so that its copy to a GPU runs asynchronously."""
    return replace(batch, **{f.name: getattr(batch, f.name).pin_memory() for f in fields(batch)
                             if isinstance(getattr(batch, f.name), torch.Tensor)})


class _Producer(threading.Thread):
    """Features, batches and pinning of every chunk, into `ready`, in order; `_DONE` or an error last."""

    def __init__(self, items: Sequence[Any], make_features: Callable[[list[Any]], list[Feature]], *,
                 chunk: int, max_rows: int, max_tokens: int, pad_token_id: int, pin: bool):
        super().__init__(daemon=True, name="bertforge-features")
        self.items, self.make_features, self.chunk = items, make_features, chunk
        self.max_rows, self.max_tokens, self.pad_token_id, self.pin = max_rows, max_tokens, pad_token_id, pin
        self.ready: queue.Queue = queue.Queue(maxsize=AHEAD)
        self.stopped = threading.Event()
        self.features: list[Feature] = []

    def batches(self):
        """(feature indices, batch) of every chunk, in order (what the thread queues)."""
        for start in range(0, len(self.items), self.chunk):
            made = self.make_features(list(self.items[start:start + self.chunk]))
            first = len(self.features)
            for feature in made:
                self.features.append(replace(feature, example_index=feature.example_index + start))
            for rows in budget_batches([len(f) for f in made], self.max_rows, self.max_tokens):
                indices = [first + row for row in rows]
                batch = collate_features([self.features[i] for i in indices], indices, self.pad_token_id)
                yield indices, pinned(batch) if self.pin else batch

    def run(self) -> None:
        try:
            for item in self.batches():
                if not self.put(item):
                    return
            self.put(_DONE)
        except BaseException as error:  # handed to the calling thread, which raises it there
            self.put(error)

    def put(self, item: Any) -> bool:
        while not self.stopped.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def run_streamed(model: torch.nn.Module, items: Sequence[Any],
                 make_features: Callable[[list[Any]], list[Feature]],
                 forward: Callable[[torch.nn.Module, FinetuneBatch], list[Any]], *, batch_size: int,
                 max_batch_tokens: int, pad_token_id: int, device: torch.device | str | None = None,
                 precision: str = DEFAULT_PRECISION, chunk: int = CHUNK, overlap: bool | None = None,
                 on_batch: Callable[[int], None] | None = None) -> tuple[list[Feature], list[Any]]:
    """(features, one output per feature in feature order) of `items`, the features made by
    `make_features(list of items)` a chunk at a time (`Feature.example_index` relative to the list it was
    given; returned relative to `items`), while the model runs (module docstring).

    Args:
        batch_size: most rows of a batch. max_batch_tokens: most padded tokens of a batch.
        overlap: False makes the features in this thread, batch by batch (the same batches); None (default): a
            thread makes them where the engine's plan has a tokenizer thread (`EnginePlan.tokenizer_threads`).
        on_batch: told how many features each batch ran, after it ran (a progress display).
    """
    engine = as_engine(model, device=device, precision=precision)
    if overlap is None:
        overlap = engine.plan.tokenizer_threads > 0
    producer = _Producer(items, make_features, chunk=chunk, max_rows=batch_size, max_tokens=max_batch_tokens,
                         pad_token_id=pad_token_id, pin=engine.device.type == "cuda")
    outputs: dict[int, Any] = {}
    try:
        with engine.running():
            for indices, batch in _batches(producer, overlap):
                results = forward(engine, batch.to(engine.device))
                outputs.update(zip(indices, results))
                if on_batch is not None:
                    on_batch(len(indices))
    finally:
        producer.stopped.set()
    return producer.features, [outputs[i] for i in range(len(producer.features))]


def _batches(producer: _Producer, overlap: bool):
    if not overlap:
        yield from producer.batches()
        return
    producer.start()
    while True:
        item = producer.ready.get()
        if item is _DONE:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
