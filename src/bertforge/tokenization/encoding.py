"""What `Tokenizer.encode` returns and how it is made from tokenized sequences: `Encoding`, truncation, padding.

Owns the steps after tokenization: fitting one text or a pair into `max_length` (Google's longest-first
pair truncation, or cutting one side), laying the sequences out as ``[CLS] A [SEP] B [SEP]`` through the
`postprocessor` (the one special-token layout) with every per-token list aligned to it (offsets, word ids,
sequence ids, masks), and padding. Long inputs that must be kept whole are windowed by `pairs.pair_windows`
(the one pair-windowing policy), not here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate, islice
from typing import Literal

from bertforge.errors import InputError
from bertforge.tokenization.postprocessor import PostProcessor

Truncation = Literal["longest_first", "only_first", "only_second"]
Padding = Literal["max_length", "longest"]
TRUNCATIONS = ("longest_first", "only_first", "only_second")
PADDINGS = ("max_length", "longest")

# Per sequence, without special tokens: token ids; absolute character spans, flat (start, end of the first
# token, then of the second, ...); 1 where a token starts a word, else 0. The spans are one list of ints, not
# (start, end) tuples: ints are not tracked by the garbage collector, a million fresh tuples are, and
# collecting after a batch cost more than encoding it. `Encoding` pairs them up (offsets) and counts the
# word starts (word ids) when read.
SequenceTokens = tuple[list[int], list[int], list[int]]


class _PerToken:
    """A per-token list of `Encoding`: the list a caller assigned, if any, else laid out anew by the
    encoding's `_<name>` method on each read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.build = name, getattr(owner, f"_{name}")

    def __get__(self, encoding: Encoding | None, owner: type | None = None):
        if encoding is None:
            return self
        given = encoding._given
        if given and self.name in given:
            return given[self.name]
        return self.build(encoding)

    def __set__(self, encoding: Encoding, value: list) -> None:
        encoding._set(self.name, value)


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

    `ids` is a list from the start. Every other list is laid out from the tokenized sequences each time it is
    read, as the Rust library's encodings make a Python list on each read: a batch whose caller reads ids
    and offsets pays for those two, and lists read once and dropped are freed young (kept, a batch's
    million offset tuples cost the garbage collector more than encoding it did). Read a list once into a
    local in a loop; a list assigned to an attribute is kept as given (and extended by `pad`).
    """

    __slots__ = ("ids", "_first", "_second", "_special", "_padding", "_id_to_token", "_given")

    def __init__(self, ids: list[int], first: SequenceTokens, second: SequenceTokens | None, special: bool,
                 id_to_token: Sequence[str]):
        self.ids = ids
        self._first, self._second, self._special = first, second, special
        self._padding = 0
        self._id_to_token = id_to_token
        self._given: dict[str, list] | None = None  # lists a caller assigned, by attribute name

    def __len__(self) -> int:
        return len(self.ids)

    # The layout of every per-token list: [CLS] A [SEP] (B [SEP]) with special tokens, else A (B); then
    # `_padding` padding positions. `_laid_out` builds one list from what each part contributes.
    def _laid_out(self, special, first, second, padding) -> list:
        a, b = self._first, self._second
        out = [special, *first(a), special] if self._special else list(first(a))
        if b is not None:
            out += second(b)
            if self._special:
                out.append(special)
        if self._padding:
            out += [padding] * self._padding
        return out

    def _set(self, name: str, value: list) -> None:
        if self._given is None:
            self._given = {}
        self._given[name] = value

    def _tokens(self) -> list[str]:
        return list(map(self._id_to_token.__getitem__, self.ids))

    def _type_ids(self) -> list[int]:
        a, b = self._first, self._second
        first = len(a[0]) + 2 * self._special
        second = 0 if b is None else len(b[0]) + self._special
        return [0] * first + [1] * second + [0] * self._padding

    def _offsets(self) -> list[tuple[int, int]]:
        if self._second is None and self._special and not self._padding:
            bounds = iter(self._first[1])  # the common read (one text, special tokens), without `_laid_out`
            return [(0, 0), *zip(bounds, bounds), (0, 0)]
        return self._laid_out((0, 0), _offsets_of, _offsets_of, (0, 0))

    def _word_ids(self) -> list[int | None]:
        return self._laid_out(None, _words_of, _words_of, None)

    def _sequence_ids(self) -> list[int | None]:
        return self._laid_out(None, lambda a: [0] * len(a[0]), lambda b: [1] * len(b[0]), None)

    def _special_tokens_mask(self) -> list[int]:
        return self._laid_out(1, _zeros, _zeros, 1)

    def _attention_mask(self) -> list[int]:
        return [1] * (len(self.ids) - self._padding) + [0] * self._padding

    tokens = _PerToken()
    type_ids = _PerToken()
    offsets = _PerToken()
    word_ids = _PerToken()
    sequence_ids = _PerToken()
    special_tokens_mask = _PerToken()
    attention_mask = _PerToken()

    def as_dict(self) -> dict[str, list]:
        """Every per-token list by its attribute name."""
        return {name: getattr(self, name) for name in FIELDS}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Encoding):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return "Encoding(" + ", ".join(f"{name}={value!r}" for name, value in self.as_dict().items()) + ")"

    def __reduce__(self):
        # Pickled (DataLoader workers) as its finished lists, without the vocabulary the tokens come from.
        return _from_lists, (self.as_dict(),)


# What each per-token list holds at a padding position (tokens: the vocabulary's padding token).
PADDING_VALUES = {"type_ids": 0, "offsets": (0, 0), "word_ids": None, "sequence_ids": None, "special_tokens_mask": 1,
                  "attention_mask": 0}
FIELDS = ("ids", "type_ids", "tokens", "offsets", "word_ids", "sequence_ids", "special_tokens_mask", "attention_mask")


def _offsets_of(sequence: SequenceTokens) -> Iterator[tuple[int, int]]:
    bounds = iter(sequence[1])
    return zip(bounds, bounds)  # start, end, start, end, ... -> (start, end), ...


def _words_of(sequence: SequenceTokens) -> Iterator[int]:
    return islice(accumulate(sequence[2], initial=-1), 1, None)  # word index: word starts so far, minus one


def _zeros(sequence: SequenceTokens) -> list[int]:
    return [0] * len(sequence[0])


def _from_lists(lists: dict[str, list]) -> Encoding:
    encoding = Encoding(lists["ids"], ([], [], []), None, False, ())
    for name in FIELDS[1:]:
        setattr(encoding, name, lists[name])
    return encoding


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
    return sequence[0][:length], sequence[1][:2 * length], sequence[2][:length]


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
    if add_special_tokens:
        # The layout of the ids comes from the post-processor; `Encoding` lays out the other lists as it does.
        ids = post.ids(first[0]) if second is None else post.assemble(first[0], second[0])[0]
    else:
        ids = first[0] + second[0] if second is not None else list(first[0])
    return Encoding(ids, first, second, add_special_tokens, id_to_token)


def pad(encoding: Encoding, target: int, pad_id: int, pad_token: str) -> None:
    """Pad `encoding` in place to `target` tokens (nothing when it is as long already)."""
    missing = target - len(encoding.ids)
    if missing <= 0:
        return
    encoding.ids += [pad_id] * missing
    # Lists assigned by a caller are extended; the others are laid out with the padding when read.
    for name, given in (encoding._given or {}).items():
        given += [PADDING_VALUES[name] if name != "tokens" else pad_token] * missing
    encoding._padding += missing
