"""The one windowing rule for inputs longer than a model's window (Google's `run_squad.py`).

Two quantities, named for what they are:

- `room`: how many tokens of the long segment fit in one window (max length minus special tokens and
  the other segment).
- `doc_stride`: the step between the starts of consecutive windows, as `run_squad.py`'s `--doc_stride`.
  Consecutive windows overlap by `room - doc_stride` tokens when the stride is smaller than the room.

Every long input of every family (classification, tagging, QA) is cut by `window_spans`, and every token
is credited to the window where it has the most context on both sides (`max_context_windows`, Google's
`_check_is_max_context`; see google-research/bert#66). Text pairs reach it through `pairs.pair_windows`,
which decides the room (how the other segment is cut) and lays the windows out.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertforge.errors import ConfigError


def default_doc_stride(room: int) -> int:
    """Half a window: every token appears in two windows, so each has context on both sides somewhere."""
    return max(1, room // 2)


def window_spans(length: int, room: int, doc_stride: int | None = None) -> list[tuple[int, int]]:
    """(start, size) of the windows covering `length` tokens, `room` at a time, `doc_stride` apart.

    As Google's `run_squad.py`: the last window ends at the last token, and consecutive windows move by
    min(size, doc_stride), so a stride larger than the window never skips tokens.

    Args:
        length: tokens to cover (>= 0; zero tokens still gives one empty window).
        room: tokens per window (> 0).
        doc_stride: step between window starts (> 0); None = `default_doc_stride(room)`.
    """
    if room <= 0:
        raise ConfigError(f"no room for any token in a window (room={room}); raise max_seq_length or shorten "
                          "the other segment (e.g. max_query_length)")
    doc_stride = default_doc_stride(room) if doc_stride is None else doc_stride
    if doc_stride <= 0:
        raise ConfigError(f"doc_stride={doc_stride} must be a positive number of tokens")
    spans = []
    start = 0
    while True:
        size = min(length - start, room)
        spans.append((start, size))
        if start + size >= length:
            return spans
        start += min(size, doc_stride)


def max_context_windows(spans: Sequence[tuple[int, int]], length: int) -> list[int]:
    """For each of `length` tokens, the index of the span where it has the most context.

    Score of token i in span (s, n): min(i - s, s + n - 1 - i) + 0.01 * n (the smaller of its left and
    right context, ties to the longer window); the first best span wins.
    """
    best = [-1] * length
    best_score = [float("-inf")] * length
    for index, (start, size) in enumerate(spans):
        for i in range(start, start + size):
            score = min(i - start, start + size - 1 - i) + 0.01 * size
            if score > best_score[i]:
                best_score[i] = score
                best[i] = index
    return best
