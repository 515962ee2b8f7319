"""The one pair-windowing policy: a text pair longer than a model's window becomes ``[CLS] A [SEP] B [SEP]`` windows.

Owns the steps between "two segments of token ids" and "the windows a family's features are made of": the
budget (``max_seq_length`` minus the special tokens), cutting the short segment so that the long one keeps
room, windowing the long segment (`windows.window_spans`, the one windowing rule) and laying out each
window (`postprocessor.PostProcessor`, the one layout) with its token types, character offsets and the
segment each token comes from. Classification, multiple choice and question answering build their
features from `pair_windows`; how they differ is a parameter, not a copy:

- which segment is windowed (`long`): classification the longer one (either side), multiple choice the
  context (first), question answering the context (second);
- how the short segment is cut: to half the budget only when the pair does not fit (classification,
  multiple choice), or always to `short_limit` and half the budget (question answering's max_query_length);
- `short_length`, the length the short segment is budgeted at: multiple choice budgets every ending at the
  longest one, so that all choices share the same windows;
- the default step between windows, half the room, capped by `stride_limit` (question answering: 128, as
  Google's run_squad).

A single text (``second=None``) is the same policy with no short segment: ``[CLS] A [SEP]`` windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from bertforge.errors import ConfigError
from bertforge.tokenization.postprocessor import PostProcessor
from bertforge.tokenization.windows import default_doc_stride, window_spans

LongSide = Literal["longer", "first", "second"]
Offsets = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class _Segments:
    """The two segments of one pair (ids and, where given, character offsets)."""

    first: Sequence[int]
    second: Sequence[int] | None
    first_offsets: Offsets | None
    second_offsets: Offsets | None


@dataclass(frozen=True)
class PairWindow:
    """One window, aligned position by position over its T tokens.

    Attributes:
        ids: token ids, ``[CLS] A [SEP] (B [SEP])``, [T].
        type_ids: segment ids, 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``, [T].
        index: position of this window among the windows of its pair.
        start: index in the long segment of the window's first long-segment token.
        size: long-segment tokens in the window.
        long_at: position in `ids` of the window's first long-segment token.
        ranges: the ``[begin, end)`` token range of the first and of the second segment (None for a
            single text) that this window holds.
        offsets, sequence_ids: see the properties (made on demand: only some families need them).
    """

    ids: list[int]
    type_ids: list[int]
    index: int
    start: int
    size: int
    long_at: int
    ranges: tuple[tuple[int, int], tuple[int, int] | None]
    segments: _Segments = field(repr=False, compare=False)

    @property
    def offsets(self) -> list[tuple[int, int] | None]:
        """Character span of each token in its text where its segment's offsets were given, else None
        (special tokens always None), [T]."""
        (begin_a, end_a), range_b = self.ranges
        given = self.segments.first_offsets
        spans: list[tuple[int, int] | None] = [None]
        spans += [None] * (end_a - begin_a) if given is None else given[begin_a:end_a]
        spans.append(None)
        if range_b is not None:
            given = self.segments.second_offsets
            spans += [None] * (range_b[1] - range_b[0]) if given is None else given[range_b[0]:range_b[1]]
            spans.append(None)
        return spans

    @property
    def sequence_ids(self) -> list[int | None]:
        """0 for tokens of the first segment, 1 for the second, None for special tokens, [T]."""
        (begin_a, end_a), range_b = self.ranges
        sides: list[int | None] = [None, *([0] * (end_a - begin_a)), None]
        if range_b is not None:
            sides += [*([1] * (range_b[1] - range_b[0])), None]
        return sides


@dataclass(frozen=True)
class PairWindows:
    """The windows of one pair: `windows` (one at least), whether the short segment lost tokens
    (`short_cut`), and whether the windowed segment is the first (`long_is_first`)."""

    windows: list[PairWindow]
    short_cut: bool
    long_is_first: bool

    @property
    def spans(self) -> list[tuple[int, int]]:
        """(start, size) of each window over the long segment, as `windows.window_spans` gives them."""
        return [(window.start, window.size) for window in self.windows]


def pair_windows(
    first: Sequence[int],
    second: Sequence[int] | None,
    post: PostProcessor,
    max_seq_length: int,
    *,
    long: LongSide = "longer",
    doc_stride: int | None = None,
    stride_limit: int | None = None,
    short_limit: int | None = None,
    short_length: int | None = None,
    first_offsets: Offsets | None = None,
    second_offsets: Offsets | None = None,
) -> PairWindows:
    """Windows of ``[CLS] first [SEP] (second [SEP])`` at most `max_seq_length` tokens long.

    Args:
        first, second: token ids of the segments, without special tokens; `second` None for a single text.
        post: the vocabulary's special-token layout.
        max_seq_length: tokens per window, special tokens included.
        long: the segment that is windowed: ``"longer"`` (the first on ties, and always for a single
            text), ``"first"`` or ``"second"``. The other, short, segment is in every window.
        doc_stride: step between window starts over the long segment; None = half the room.
        stride_limit: the default step (`doc_stride` None) is at most this many tokens.
        short_limit: always cut the short segment to this many tokens (and to half the budget); None:
            cut it to half the budget only when the pair does not fit one window.
        short_length: the length the short segment is budgeted at, at least its own (default: its own;
            multiple choice passes the longest ending so that every ending gets the same windows).
        first_offsets, second_offsets: character spans of the segments' tokens, copied into `offsets`.

    Raises:
        ConfigError: no room is left for the long segment, or `long` names a missing segment.
    """
    if long not in ("longer", "first", "second") or (long == "second" and second is None):
        raise ConfigError(f"long={long!r}: use 'longer', 'first' or 'second' (with a second segment)")
    budget = max_seq_length - post.added(second is not None)
    long_is_first = long == "first" or (long == "longer" and (second is None or len(first) >= len(second)))
    long_ids, short_ids = (first, second) if long_is_first else (second, first)
    reserved = 0 if short_ids is None else len(short_ids) if short_length is None else short_length
    fits = len(long_ids) + reserved <= budget
    limit = budget // 2 if short_limit is None else min(short_limit, budget // 2)
    # The short segment gives way only as far as the long one needs: to half the budget, when the pair
    # does not fit (or always, to the caller's limit, as QA's max_query_length).
    cut = short_ids is not None and reserved > limit and (short_limit is not None or not fits)
    kept = limit if cut else reserved
    room = budget - kept
    if fits and not cut:
        spans = [(0, len(long_ids))]  # everything fits: one window, however little room is left over
    elif room <= 0:
        raise ConfigError(f"max_seq_length={max_seq_length} leaves no room for the windowed segment after "
                          f"{kept} tokens of the other and the special tokens; raise max_seq_length "
                          "(or lower max_query_length)")
    else:
        if doc_stride is None and stride_limit is not None:
            doc_stride = min(stride_limit, default_doc_stride(room))
        spans = window_spans(len(long_ids), room, doc_stride)
    short_cut = short_ids is not None and len(short_ids) > kept
    segments = _Segments(first, second, first_offsets, second_offsets)
    windows = []
    for index, (start, size) in enumerate(spans):
        long_range, short_range = (start, start + size), (0, min(kept, len(short_ids or ())))
        range_a, range_b = (long_range, short_range) if long_is_first else (short_range, long_range)
        ids_a = first[range_a[0]:range_a[1]]
        ids_b = None if second is None else second[range_b[0]:range_b[1]]
        ids, type_ids = post.assemble(ids_a, ids_b)
        first_at, second_at = post.positions(len(ids_a), None if ids_b is None else len(ids_b))
        long_at = first_at if long_is_first or second_at is None else second_at
        windows.append(PairWindow(ids, type_ids, index, start, size, long_at,
                                  (range_a, None if second is None else range_b), segments))
    return PairWindows(windows, short_cut, long_is_first)
