"""The inputs of the wire-format embedding routes (OpenAI's `/v1/embeddings`, text-embeddings-inference's
`/embed`): `EmbedText`, a text or token ids of the model's own vocabulary with TEI's truncation rule, and
its one window (`embed_features`), built by the `embed` pipeline's feature step (`EmbedPipeline.features`) so
that these inputs run the same path as every other: scheduler, model call, the family's pooling and decode.

A plain string keeps the family's window (cut to fit, always); an `EmbedText` that does not fit is refused
naming the limit unless it asks to be cut, from the right (the family's cut: the same window, tested) or the
left. Results of `EmbedText` inputs also say how many tokens ran (`"tokens"`, OpenAI's usage).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bertforge.data.finetuning import Feature
from bertforge.errors import InputError


@dataclass(frozen=True)
class EmbedText:
    """One input of a wire-format embedding route: `text`, or `ids` (token ids of the model's vocabulary, no
    special tokens), and what to do when it does not fit the window: `truncate` False refuses it naming the
    limit (TEI's rule); True cuts it from `direction`'s end ("right" or "left")."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    truncate: bool = False
    direction: str = "right"


def text_window(item: EmbedText, index: int, tokenizer, max_length: int) -> Feature:
    """The one window `[CLS] ids [SEP]` of input `index`, checked against `max_length` (special tokens
    included) and cut as it asks; InputError naming the limit for an input too long without truncation."""
    room = max_length - tokenizer.post_processor.added(False)
    ids = list(item.ids) if item.ids is not None else tokenizer.encode(item.text, add_special_tokens=False).ids
    if len(ids) > room:
        if not item.truncate:
            raise InputError(f"input {index} has {len(ids)} tokens; this model takes at most {room} "
                             f"(max_input_length {max_length} with [CLS] and [SEP]): shorten it, or ask for "
                             "truncation where the route offers it (TEI: truncate true)")
        ids = ids[:room] if item.direction == "right" else ids[len(ids) - room:]
    return Feature(index, *tokenizer.post_processor.assemble(ids))


def embed_features(parsed: Sequence[Any], plain_features: Callable[[list[Any]], list[Feature]], tokenizer,
                   max_length: int) -> list[Feature]:
    """One window per input, in input order: plain inputs through `plain_features` (the pipeline's own
    feature step), `EmbedText` inputs through `text_window`."""
    plain = [(index, item) for index, item in enumerate(parsed) if not isinstance(item, EmbedText)]
    features = []
    for feature in plain_features([item for _, item in plain]) if plain else []:
        feature.example_index = plain[feature.example_index][0]
        features.append(feature)
    features += [text_window(item, index, tokenizer, max_length) for index, item in enumerate(parsed)
                 if isinstance(item, EmbedText)]
    features.sort(key=lambda feature: feature.example_index)
    return features


def count_tokens(results: list[dict[str, Any]], parsed: Sequence[Any], features: Sequence[Feature]
                 ) -> list[dict[str, Any]]:
    """`results` with the tokens each `EmbedText` input ran (one window per input, in input order)."""
    for result, item, feature in zip(results, parsed, features):
        if isinstance(item, EmbedText):
            result["tokens"] = len(feature.input_ids)
    return results
