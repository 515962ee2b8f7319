"""The inputs of the wire-format routes that read a text whole or not at all (text-embeddings-inference's
`/embed`, `/rerank`, `/predict`, and OpenAI's `/v1/embeddings`), with TEI's truncation rule in one place
(`fit_tokens`), and their windows, built by the pipelines' feature step (`Pipeline.features` ->
`wire_features`) so that these inputs run the same path as every other: scheduler, model call, the family's
decode.

- `EmbedText` (embed): a text, or token ids of the model's own vocabulary.
- `TruncatedInput` (rerank, classify): the family's parsed input (`example`, which its decode gets back) and
  the text pairs the model reads for it, one window each: a classified text or pair, or each of a reranked
  query's ``(query, text)`` pairs.

TEI's rule (its tokenizer's truncation, `LongestFirst`): an input whose tokens and special tokens do not fit
`max_input_length` (the pipeline's window) is refused naming the limit (422 on the TEI routes), never
windowed, unless it asks to be cut (`truncate`), from `direction`'s end of each segment: "right" keeps the
first tokens, "left" the last. A pair gives way longest first: the shorter segment is kept whole while it
takes at most half the room, and the longer gets the rest; otherwise both are cut, the shorter to half the
room and the longer to the other half. For a reranker's short query and long passage that cuts the passage
only, as a reranker user expects, and it is the cut a TEI server makes, so scores agree with TEI's.

A plain input (a string, a family example) keeps the family's own windowing. Results of `EmbedText` inputs
also say how many tokens ran (`"tokens"`, OpenAI's usage); results of `TruncatedInput` inputs carry the
model's raw output rows (`"logits"`, one per pair: TEI's `raw_scores`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.data.finetuning import Feature
from bertforge.errors import InputError

DIRECTIONS = ("right", "left")


@dataclass(frozen=True)
class EmbedText:
    """One input of a wire-format embedding route: `text`, or `ids` (token ids of the model's vocabulary, no
    special tokens), and what to do when it does not fit the window: `truncate` False refuses it naming the
    limit (TEI's rule); True cuts it from `direction`'s end ("right" or "left")."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    truncate: bool = False
    direction: str = "right"


Pairs = Callable[[Any], Sequence[tuple[str, str | None]]]


@dataclass(frozen=True)
class TruncatedInput:
    """One input of a TEI route over a pair-reading model (rerank, classify), and TEI's `truncate` /
    `direction` (see the module docstring).

    Attributes:
        example: the family's parsed input (what its decode gets back).
        pairs: the ``(text, text_pair or None)`` pairs the model reads for `example`, one window each, in order
            (their position is the window's `Feature.window`): a function of the example, so that its texts
            are held once (the scheduler's size estimate reads every string of a parsed input).
        name: how a refusal names a pair: a pattern of the input's `index` in the request and the pair's
            `position`, e.g. ``"inputs[{index}]"``, ``"texts[{position}] with the query"``.
    """

    example: Any
    pairs: Pairs
    name: str
    truncate: bool = False
    direction: str = "right"

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")


def fit_tokens(first: list[int], second: list[int] | None, room: int, *, truncate: bool, direction: str,
               name: str, max_length: int) -> tuple[list[int], list[int] | None]:
    """TEI's rule: the segments as they fit `room` tokens (the window less its special tokens), cut longest
    first from `direction`'s end when `truncate`; InputError naming the limit when they do not fit and
    `truncate` is false."""
    total = len(first) + (len(second) if second is not None else 0)
    if total <= room:
        return first, second
    if not truncate:
        specials = "[CLS] and [SEP]" if second is None else "[CLS] and two [SEP]"
        raise InputError(f"{name} has {total} tokens; this model takes at most {room} (max_input_length "
                         f"{max_length} with {specials}): shorten it, or ask for truncation where the route "
                         "offers it (TEI: truncate true)")
    if second is None:
        keep_first, keep_second = room, 0
    else:
        shorter, longer = sorted((len(first), len(second)))
        if shorter <= room - shorter:  # the shorter fits in half the room: kept whole, the longer gets the rest
            kept = (shorter, room - shorter)
        else:  # both cut: the shorter (the first on a tie) to half the room, the longer to the other half
            kept = (room // 2, room - room // 2)
        keep_first, keep_second = kept if len(first) <= len(second) else kept[::-1]

    def cut(ids: list[int], keep: int) -> list[int]:
        return ids[:keep] if direction == "right" else ids[len(ids) - keep:]

    return cut(first, keep_first), None if second is None else cut(second, keep_second)


def text_window(item: EmbedText, index: int, tokenizer, max_length: int) -> Feature:
    """The one window `[CLS] ids [SEP]` of input `index`, checked against `max_length` (special tokens
    included) and cut as it asks (`fit_tokens`)."""
    room = max_length - tokenizer.post_processor.added(False)
    ids = list(item.ids) if item.ids is not None else tokenizer.encode(item.text, add_special_tokens=False).ids
    ids, _ = fit_tokens(ids, None, room, truncate=item.truncate, direction=item.direction, name=f"input {index}",
                        max_length=max_length)
    return Feature(index, *tokenizer.post_processor.assemble(ids))


def pair_windows_of(item: TruncatedInput, index: int, tokenizer, max_length: int) -> list[Feature]:
    """One window ``[CLS] text [SEP] (text_pair [SEP])`` per pair of input `index` (`Feature.window`: the pair's
    position), each fitted by `fit_tokens`."""
    post = tokenizer.post_processor
    tokens: dict[str, list[int]] = {}  # a reranked query is tokenized once for all its texts

    def ids_of(text: str) -> list[int]:
        if text not in tokens:
            tokens[text] = tokenizer.encode(text, add_special_tokens=False).ids
        return tokens[text]

    features = []
    for position, (text, pair) in enumerate(item.pairs(item.example)):
        room = max_length - post.added(pair is not None)
        first, second = fit_tokens(ids_of(text), None if pair is None else ids_of(pair), room,
                                   truncate=item.truncate, direction=item.direction,
                                   name=item.name.format(index=index, position=position), max_length=max_length)
        features.append(Feature(index, *post.assemble(first, second), window=position))
    return features


def wire_features(parsed: Sequence[Any], plain_features: Callable[[list[Any]], list[Feature]], tokenizer,
                  max_length: int) -> list[Feature]:
    """The windows of `parsed`, in input order: plain inputs through `plain_features` (the pipeline's own
    feature step), `EmbedText` inputs through `text_window`, `TruncatedInput` ones through `pair_windows_of`."""
    wire = (EmbedText, TruncatedInput)
    plain = [(index, item) for index, item in enumerate(parsed) if not isinstance(item, wire)]
    features = []
    for feature in plain_features([item for _, item in plain]) if plain else []:
        feature.example_index = plain[feature.example_index][0]
        features.append(feature)
    for index, item in enumerate(parsed):
        if isinstance(item, EmbedText):
            features.append(text_window(item, index, tokenizer, max_length))
        elif isinstance(item, TruncatedInput):
            features += pair_windows_of(item, index, tokenizer, max_length)
    features.sort(key=lambda feature: feature.example_index)  # stable: an input's windows stay in order
    return features


def family_examples(parsed: Sequence[Any]) -> list[Any]:
    """What the family's decode gets for `parsed`: a `TruncatedInput`'s own example, any other input itself."""
    return [item.example if isinstance(item, TruncatedInput) else item for item in parsed]


def plain_inputs(parsed: Sequence[Any]) -> list[Any]:
    """The inputs of `parsed` that the family windows (the server's token floor counts only these: a wire
    input is one window per text, cut or refused)."""
    return [item for item in parsed if not isinstance(item, EmbedText | TruncatedInput)]


def count_tokens(results: list[dict[str, Any]], parsed: Sequence[Any], features: Sequence[Feature]
                 ) -> list[dict[str, Any]]:
    """`results` with the tokens each `EmbedText` input ran (one window per input, in input order)."""
    for result, item, feature in zip(results, parsed, features):
        if isinstance(item, EmbedText):
            result["tokens"] = len(feature.input_ids)
    return results


def with_logits(results: list[dict[str, Any]], parsed: Sequence[Any], features: Sequence[Feature],
                outputs: Sequence[Any]) -> list[dict[str, Any]]:
    """`results` with each `TruncatedInput`'s raw model outputs, one row per pair in pair order (`"logits"`:
    TEI's `raw_scores`; its windows are never averaged, so a row is the model's output for that pair), and the
    tokens its windows ran (`"tokens"`: a dialect's usage)."""
    rows: dict[int, list[tuple[int, list[float]]]] = {}
    tokens: dict[int, int] = {}
    for feature, output in zip(features, outputs):
        if isinstance(parsed[feature.example_index], TruncatedInput):
            rows.setdefault(feature.example_index, []).append(
                (feature.window, np.asarray(output, dtype=np.float64).reshape(-1).tolist()))
            tokens[feature.example_index] = tokens.get(feature.example_index, 0) + len(feature.input_ids)
    for index, found in rows.items():
        results[index]["logits"] = [row for _, row in sorted(found, key=lambda pair: pair[0])]
        results[index]["tokens"] = tokens[index]
    return results
