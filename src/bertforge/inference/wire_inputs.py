"""The inputs of the routes and commands that read a text whole or not at all (text-embeddings-inference's
`/embed`, `/embed_sparse`, `/embed_all`, `/similarity`, `/rerank`, `/predict`, OpenAI's `/v1/embeddings`, our
own `/v1/embed`, `/v1/embed-sparse` and `/v1/rerank`, and `bertforge embed`), with the one truncation rule of
them all in one place (`fit_tokens`, counted through `Feature.truncated`), and their windows, built by the
pipelines' feature step (`Pipeline.features` -> `wire_features`) so that these inputs run the same path as
every other: scheduler, model call, the family's decode.

- `EmbedText` (embed, embed-sparse): a text, or token ids of the model's own vocabulary.
- `TruncatedInput` (rerank, classify): the family's parsed input (`example`, which its decode gets back) and
  the text pairs the model reads for it, one window each: a classified text or pair, or each of a reranked
  query's ``(query, text)`` pairs.

The rule (TEI's, with its tokenizer's truncation, `LongestFirst`): an input whose tokens and special tokens do
not fit `max_input_length` (the pipeline's window) is cut to it (`truncate`, the default, `AUTO_TRUNCATE`: what
TEI's `--auto-truncate` does, since the clients that send long chunks cannot ask for it), from `direction`'s
end of each segment: "right" keeps the first tokens, "left" the last; or, when the caller asked to refuse
(`truncate` false: a request's own field, `bertforge serve --auto-truncate false`, `bertforge embed --truncate
false`), refused naming the input, the limit and the fix. Never windowed. A cut is said: each cut window is
marked (`Feature.truncated`), results count their cut texts (`TRUNCATED`), and the server's answers and
`bertforge embed`'s progress and manifest report the count. A pair gives way longest first: the shorter
segment is kept whole while it takes at most half the room, and the longer gets the rest; otherwise both are
cut, the shorter to half the room and the longer to the other half. For a reranker's short query and long
passage that cuts the passage only, as a reranker user expects, and it is the cut a TEI server makes, so
scores agree with TEI's.

A plain input (a string, a family example) keeps the family's own windowing. Results of `EmbedText` inputs
also say how many tokens ran (`"tokens"`, OpenAI's usage); results of `TruncatedInput` inputs carry the
model's raw output rows (`"logits"`, one per pair: TEI's `raw_scores`); both say how many of their texts were
cut (`TRUNCATED`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.data.finetuning import Feature
from bertforge.errors import InputError

DIRECTIONS = ("right", "left")
# The rule's default: an over-long input is cut to the window (and the cut counted), not refused.
AUTO_TRUNCATE = True


class Fix:
    """What a refusal under the rule tells its caller to do (each caller names its own way to ask for the cut).
    Not a string field of the inputs: a request's size estimate (`admission.estimate_tokens`) reads every
    string of its parsed inputs, and this text is not the client's."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fix) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


SHORTEN = Fix("shorten it, or let it be cut to the window (truncate: true)")
# A result's count of its texts that were cut to fit (0 or 1 for an `EmbedText`, up to its pairs for a
# `TruncatedInput`).
TRUNCATED = "truncated"


@dataclass(frozen=True)
class EmbedText:
    """One input of an embedding route or of `bertforge embed`: `text`, or `ids` (token ids of the model's
    vocabulary, no special tokens), and what to do when it does not fit the window (the module's rule): `truncate`
    True cuts it from `direction`'s end ("right" or "left"), False refuses it naming the limit and `fix`."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    truncate: bool = AUTO_TRUNCATE
    direction: str = "right"
    fix: Fix = SHORTEN


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
        fix: what a refusal tells the caller to do.
    """

    example: Any
    pairs: Pairs
    name: str
    truncate: bool = AUTO_TRUNCATE
    direction: str = "right"
    fix: Fix = SHORTEN

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")


def fit_tokens(first: list[int], second: list[int] | None, room: int, *, truncate: bool, direction: str,
               name: str, max_length: int, fix: Fix = SHORTEN) -> tuple[list[int], list[int] | None]:
    """The rule: the segments as they fit `room` tokens (the window less its special tokens), cut longest
    first from `direction`'s end when `truncate`; InputError naming the limit and `fix` when they do not fit
    and `truncate` is false."""
    total = len(first) + (len(second) if second is not None else 0)
    if total <= room:
        return first, second
    if not truncate:
        specials = "[CLS] and [SEP]" if second is None else "[CLS] and two [SEP]"
        raise InputError(f"{name} has {total} tokens; this model takes at most {room} (max_input_length "
                         f"{max_length} with {specials}): {fix}")
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


def text_window(item: EmbedText, index: int, tokenizer, max_length: int, name: str | None = None) -> Feature:
    """The one window `[CLS] ids [SEP]` of input `index`, checked against `max_length` (special tokens
    included) and cut as it asks (`fit_tokens`; `Feature.truncated` says whether it was); a refusal names it
    `name` (default ``"input {index}"``)."""
    room = max_length - tokenizer.post_processor.added(False)
    ids = list(item.ids) if item.ids is not None else tokenizer.encode(item.text, add_special_tokens=False).ids
    fitted, _ = fit_tokens(ids, None, room, truncate=item.truncate, direction=item.direction,
                           name=name or f"input {index}", max_length=max_length, fix=item.fix)
    return Feature(index, *tokenizer.post_processor.assemble(fitted), truncated=len(fitted) < len(ids))


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
        whole = (ids_of(text), None if pair is None else ids_of(pair))
        first, second = fit_tokens(*whole, room, truncate=item.truncate, direction=item.direction,
                                   name=item.name.format(index=index, position=position), max_length=max_length,
                                   fix=item.fix)
        cut = (first, second) != whole
        features.append(Feature(index, *post.assemble(first, second), window=position, truncated=cut))
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
    """`results` with the tokens each `EmbedText` input ran (one window per input, in input order; a family's own
    `"tokens"`, sparse terms' names, stays)."""
    for result, item, feature in zip(results, parsed, features):
        if isinstance(item, EmbedText):
            result.setdefault("tokens", len(feature.input_ids))
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


def with_cuts(results: list[dict[str, Any]], parsed: Sequence[Any], features: Sequence[Feature]
              ) -> list[dict[str, Any]]:
    """`results` with how many texts of each wire input were cut to the window (`TRUNCATED`: an `EmbedText`'s
    one window, a `TruncatedInput`'s pairs)."""
    wire = (EmbedText, TruncatedInput)
    for feature in features:
        if isinstance(parsed[feature.example_index], wire):
            result = results[feature.example_index]
            result[TRUNCATED] = result.get(TRUNCATED, 0) + int(feature.truncated)
    return results


def truncated_count(results: Sequence[dict[str, Any]]) -> int:
    """How many texts of `results` were cut to fit the window (each result's `TRUNCATED`; 0 without)."""
    return sum(result.get(TRUNCATED, 0) for result in results)


def family_results(results: list[dict[str, Any]], parsed: Sequence[Any]) -> list[dict[str, Any]]:
    """`results` as the family made them: without what the wire inputs of `parsed` added (`TRUNCATED`, an
    `EmbedText`'s token count, a `TruncatedInput`'s raw rows), for routes that answer the family's results
    (our own `/v1/<task>`; count the cut texts with `truncated_count` first)."""
    for result, item in zip(results, parsed):
        result.pop(TRUNCATED, None)
        if isinstance(item, EmbedText) and isinstance(result.get("tokens"), int):
            del result["tokens"]
        elif isinstance(item, TruncatedInput):
            result.pop("logits", None)
    return results


def query_pairs(query: Any) -> list[tuple[str, str]]:
    """What a cross-encoder reads for a rerank query: (query, text) per text, in order (TEI's pairs)."""
    return [(query.query, text) for text in query.texts]


# The tasks whose inputs are read whole or cut, never windowed, on every route (`cut_inputs`).
CUT_TASKS = ("embed", "embed-sparse", "rerank")


def cut_inputs(task: str, parsed: Sequence[Any], truncate: bool, fix: Fix = SHORTEN) -> list[Any]:
    """Our own routes' parsed inputs of `task` under the module's rule: a text of embed or embed-sparse as an
    `EmbedText`, a rerank query as a `TruncatedInput` of its (query, text) pairs (named
    ``"inputs[i].texts[j] with the query"``); other tasks' inputs as they are (their families window)."""
    if task not in CUT_TASKS:
        return list(parsed)
    return [EmbedText(text=item, truncate=truncate, fix=fix) if isinstance(item, str) else
            TruncatedInput(item, query_pairs, "inputs[{index}].texts[{position}] with the query", truncate=truncate,
                           fix=fix) for item in parsed]


def noting_cuts(make_features: Callable[[list[Any]], list[Feature]], cut: list[int],
                on_cut: Callable[[int], None] | None = None) -> Callable[[list[Any]], list[Feature]]:
    """`make_features` (a feature step that is given consecutive slices of one input list, in order: the streamed
    one, `evaluation.run_streamed`) that also appends to `cut` the index of each input whose window it cut
    (`Feature.truncated`) and tells `on_cut` how many, as the windows are made (ahead of the model)."""
    offset = 0

    def make(items: list[Any]) -> list[Feature]:
        nonlocal offset
        features = make_features(items)
        found = sorted({offset + feature.example_index for feature in features if feature.truncated})
        offset += len(items)
        cut.extend(found)
        if found and on_cut is not None:
            on_cut(len(found))
        return features

    return make
