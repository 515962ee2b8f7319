"""Row buckets: padding a projection's input rows up to one of a bounded set of row counts.

oneDNN, which runs the CPU int8 (`engine.int8`) and packed bf16 (`engine.bf16`) linears, compiles a kernel
for every row count it meets and keeps at most 1,024 of them. Measured on a 2-core AMX Xeon (one [384 -> 1536]
linear, row counts 60-99 each called twice; docs/notes/cpu_inference.md, "Row buckets"): int8's first call 823 us, its
second 169 us; bf16's 904 / 165 us. Without padding, a batch-1 MiniLM call at a length not met before cost ~2.6 ms
more, and a server meeting lengths of 16-512 tokens needed ~2,000 kernels, more than the cache holds, so it kept
paying. With it, every call of `rows` rows runs at `bucket_rows(rows)`: steps of BUCKET_STEP rows below
2 x BUCKET_STEP x BUCKETS_PER_OCTAVE (256), then BUCKETS_PER_OCTAVE steps per doubling, so at most 7 rows or 1/16
of a call is padding and a process meets 48 row counts up to 512 rows, 128 up to 16,384, per projection shape.

The padding rows are zeros and their outputs are dropped. Each row of a linear's output depends on its own input
row only, with one exception the int8 kernel has: it quantizes its input on one range for the whole call, and that
range always includes 0, so zero rows leave it as it was. Both functions are TorchScript-compatible, so a traced
layer graph that reaches them through a function compiled by `scripted` (`int8.bucketed_linear_dynamic`,
`bf16.Bf16Linear`) pads each call by its own size, not by the size it was traced at.
"""

from __future__ import annotations

import functools
import warnings

import torch

BUCKET_STEP = 8
BUCKETS_PER_OCTAVE = 16


def bucket_rows(rows: int, step: int = BUCKET_STEP, per_octave: int = BUCKETS_PER_OCTAVE) -> int:
    """The row count a call of `rows` rows runs at (see the module docstring)."""
    while step * per_octave * 2 <= rows:
        step *= 2
    return (rows + step - 1) // step * step


def rows_to_bucket(x: torch.Tensor) -> torch.Tensor:
    """x [..., I] -> [P, I]: its rows, then zero rows up to P = bucket_rows(rows) (a view where P = rows)."""
    features = x.size(-1)
    rows = x.numel() // features
    flat = x.reshape(rows, features)
    padded = bucket_rows(rows)
    if padded == rows:
        return flat
    return torch.nn.functional.pad(flat, [0, 0, 0, padded - rows])


def rows_from_bucket(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y [P, O], the output for `rows_to_bucket(x)` -> [..., O] in x's leading shape, padding rows dropped."""
    rows = x.numel() // x.size(-1)
    shape = list(x.shape[:-1])
    shape.append(y.size(-1))
    return y[:rows].reshape(shape)


@functools.cache
def scripted(function):
    """`function` compiled by TorchScript, once, on first use (a few ms; importing bertforge compiles nothing).

    Why: `torch.jit.trace` (the layer graph, `layer_graph.LayerGraph`) records a Python function's arithmetic on
    sizes as constants of the call it traced; a compiled function called from the traced code keeps it live, so
    each call pads by its own size."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice (torch pinned at 2.13.0)
        return torch.jit.script(function)
