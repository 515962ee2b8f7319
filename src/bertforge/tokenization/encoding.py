"""What `Tokenizer.encode` returns and how it is made from tokenized sequences: `Encoding`, truncation, padding.

Owns the steps after tokenization: fitting one text or a pair into `max_length` (Google's longest-first
pair truncation, or cutting one side), laying the sequences out as ``[CLS] A [SEP] B [SEP]`` through the
`postprocessor` (the one special-token layout) with every per-token list aligned to it (offsets, word ids,
sequence ids, masks), and padding. Long inputs that must be kept whole are windowed by `pairs.pair_windows`
(the one pair-windowing policy), not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bertforge.errors import InputError
from bertforge.tokenization.postprocessor import PostProcessor

Truncation = Literal["longest_first", "only_first", "only_second"]
Padding = Literal["max_length", "longest"]
TRUNCATIONS = ("longest_first", "only_first", "only_second")
PADDINGS = ("max_length", "longest")

# Per sequence, without special tokens: token ids, absolute (start, end) character offsets, word ids.
SequenceTokens = tuple[list[int], list[tuple[int, int]], list[int]]


@dataclass
class Encoding:
    """One encoded sequence (or sequence pair), aligned position by position.

    All lists have the same length L (tokens including specials and padding).

    Attributes:
        ids: token ids, [L].
        type_ids: segment ids, [L]: 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]`` (padding 0).
        tokens: token strings, [L].
        offsets: ``(start, end)`` character span of each token in its original text; ``(0, 0)`` for special
            and padding tokens. For B tokens the span is in the pair text.
        word_ids: index of the punctuation-split word a token belongs to within its sequence, None for
            special and padding tokens.
        sequence_ids: 0 for tokens of the first text, 1 for the pair text, None for special and padding.
        special_tokens_mask: 1 for special and padding tokens, else 0.
        attention_mask: 1 for real tokens (specials included), 0 for padding.
    """

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int]
    attention_mask: list[int]

    def __len__(self) -> int:
        return len(self.ids)


def check_truncation(truncation: Truncation | bool | None) -> Truncation | None:
    """The truncation mode of an `encode` argument (True = longest-first, False/None = none)."""
    if truncation is True:
        return "longest_first"
    if truncation is None or truncation is False:
        return None
    if truncation not in TRUNCATIONS:
        raise InputError(f"truncation must be one of {TRUNCATIONS}, True or None, got {truncation!r}")
    return truncation


def check_padding(padding: Padding | bool) -> Padding | None:
    """The padding mode of an `encode` argument (True = longest, False/None = none)."""
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return None
    if padding not in PADDINGS:
        raise InputError(f"padding must be one of {PADDINGS}, True or False, got {padding!r}")
    return padding


def _cut(sequence: SequenceTokens, length: int) -> SequenceTokens:
    return sequence[0][:length], sequence[1][:length], sequence[2][:length]


def truncate(
    first: SequenceTokens,
    second: SequenceTokens | None,
    *,
    special: int,
    max_length: int | None,
    truncation: Truncation | None,
    default_length: int,
) -> tuple[SequenceTokens, SequenceTokens | None]:
    """Cut the sequences so that they and `special` special tokens fit `max_length` (see `Tokenizer.encode`);
    truncation without a `max_length` cuts to `default_length` (the model's).

    Raises:
        InputError: too long without truncation, or nothing of the cut side would be left.
    """
    length_a = len(first[0])
    length_b = len(second[0]) if second is not None else 0
    if truncation is None:
        if max_length is not None and length_a + length_b + special > max_length:
            raise InputError(
                f"the input has {length_a + length_b + special} tokens (special tokens included), "
                f"more than max_length={max_length}; "
                "pass truncation='longest_first' (or 'only_first'/'only_second') or a larger max_length"
            )
        return first, second
    max_length = default_length if max_length is None else max_length
    budget = max_length - special
    if budget < 1:
        raise InputError(f"max_length={max_length} leaves no room for text after {special} special tokens")
    if truncation == "longest_first":
        if second is None:
            return _cut(first, budget), None
        # Google's _truncate_seq_pair: pop from the longer sequence, from the second when equal.
        while length_a + length_b > budget:
            if length_a > length_b:
                length_a -= 1
            else:
                length_b -= 1
        return _cut(first, length_a), _cut(second, length_b)
    if truncation == "only_first":
        if budget - length_b < 1:
            raise InputError(
                f"truncation='only_first' cannot fit: the second sequence alone has {length_b} "
                f"tokens and max_length={max_length}; use 'longest_first' or 'only_second'"
            )
        return _cut(first, budget - length_b), second
    if second is None:
        raise InputError("truncation='only_second' needs a text pair; use 'only_first' or 'longest_first'")
    if budget - length_a < 1:
        raise InputError(
            f"truncation='only_second' cannot fit: the first sequence alone has {length_a} tokens and "
            f"max_length={max_length}; shorten it (e.g. a max question length) or use 'longest_first'"
        )
    return first, _cut(second, budget - length_a)


def assemble(
    post: PostProcessor,
    id_to_token: Sequence[str],
    first: SequenceTokens,
    second: SequenceTokens | None,
    add_special_tokens: bool,
) -> Encoding:
    """The Encoding of one sequence or a pair: ``[CLS] A [SEP] (B [SEP])`` with specials, else ``A B``."""
    ids_a, offsets_a, words_a = first
    ids_b, offsets_b, words_b = second if second is not None else ([], [], [])
    if add_special_tokens:
        # The layout comes from the post-processor; the other lists follow it position by position.
        ids, type_ids = post.assemble(ids_a, None if second is None else ids_b)
        offsets = [(0, 0), *offsets_a, (0, 0)]
        word_ids: list[int | None] = [None, *words_a, None]
        sequence_ids: list[int | None] = [None, *([0] * len(ids_a)), None]
        special = [1, *([0] * len(ids_a)), 1]
        if second is not None:
            offsets += [*offsets_b, (0, 0)]
            word_ids += [*words_b, None]
            sequence_ids += [*([1] * len(ids_b)), None]
            special += [*([0] * len(ids_b)), 1]
    else:
        ids = [*ids_a, *ids_b]
        type_ids = [0] * len(ids_a) + [1] * len(ids_b)
        offsets = [*offsets_a, *offsets_b]
        word_ids = [*words_a, *words_b]
        sequence_ids = [0] * len(ids_a) + [1] * len(ids_b)
        special = [0] * len(ids)
    return Encoding(
        ids=ids,
        type_ids=type_ids,
        tokens=list(map(id_to_token.__getitem__, ids)),
        offsets=offsets,
        word_ids=word_ids,
        sequence_ids=sequence_ids,
        special_tokens_mask=special,
        attention_mask=[1] * len(ids),
    )


def pad(encoding: Encoding, target: int, pad_id: int, pad_token: str) -> None:
    """Pad `encoding` in place to `target` tokens (nothing when it is as long already)."""
    missing = target - len(encoding.ids)
    if missing <= 0:
        return
    encoding.ids += [pad_id] * missing
    encoding.type_ids += [0] * missing
    encoding.tokens += [pad_token] * missing
    encoding.offsets += [(0, 0)] * missing
    encoding.word_ids += [None] * missing
    encoding.sequence_ids += [None] * missing
    encoding.special_tokens_mask += [1] * missing
    encoding.attention_mask += [0] * missing
