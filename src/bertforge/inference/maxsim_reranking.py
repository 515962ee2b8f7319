"""Reranking by late interaction: a ColBERT model's `rerank` route, so that every rerank dialect the server speaks
(TEI's `/rerank`, Cohere's `/v1/rerank` and `/v2/rerank`, Infinity's, our `/v1/rerank`) and `rerank_scores`
rank a query's documents by MaxSim (`families.colbert.maxsim`, the one home of it) as they rank them by a
cross-encoder's relevance: the same input (``{"query", "texts"}``, `Reranking.parse`), options (`top_n`,
`return_text`) and results (``{"results": [{"index", "score", "logit"}]}``, best first; ties in input order).

Owns: `MaxSimReranking` (the family object: what a ColBERT model's rerank accepts and how its token vectors
become the ranking) and `MaxSimRerankPipeline` (the pipeline: its windows and their roles).

The windows: one per text, not one per (query, text) pair as a cross-encoder reads: the query's window (its
`Feature.window` is `QUERY_WINDOW`) is embedded once with the query role (its marker, [MASK] expansion), each
text's with the document role, by the ColBERT family's forward (`families.colbert.ColBERT.forward`). A text
that does not fit the model's document length (a query its query length) is cut to it, or refused under
`truncate: false`, by the one rule of the wire inputs (`wire_inputs.fit_tokens`). The windows run through the
scheduler like any other route's: a large request is split over model calls between other requests'
(`Pipeline.forward` of any subset of the windows), and its decode waits for all of them.

Scores: a MaxSim is a sum of cosines over the query's tokens, not a probability; "score" and "logit" (TEI's
`raw_scores`) are both the MaxSim, as PyLate's `rank.rerank` returns it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bertforge.data.finetuning import Feature
from bertforge.data.reranking import RerankQuery
from bertforge.evaluation import run_features
from bertforge.families.colbert import FAMILY as COLBERT
from bertforge.families.colbert import BertForColBERT, maxsim_pairs
from bertforge.families.reranking import FAMILY as CROSS_ENCODER
from bertforge.families.reranking import Reranking
from bertforge.inference.family_pipelines import Pipeline
from bertforge.inference.wire_inputs import TruncatedInput, fit_tokens, with_cuts
from bertforge.model.config import BertConfig

# `Feature.window` of a rerank input's query window (its texts' windows are their positions, from 0).
QUERY_WINDOW = -1
RERANK = CROSS_ENCODER.task  # the route: a cross-encoder's, answered here by MaxSim


class MaxSimReranking(Reranking):
    """A query's texts ordered by their MaxSim with it under a ColBERT model (late interaction): the rerank
    route's input, options and results as a cross-encoder's, the score the MaxSim of the query's token vectors
    against each text's."""

    name = "maxsim-reranking"
    aliases = ()
    model_class = BertForColBERT
    runs_as_graph = False  # ColBERT rows are rebuilt from the model's settings (`ColBERT.forward`)
    formats: dict[str, Any] = {}

    def check_model(self, config: BertConfig) -> None:
        """Any ColBERT model reranks (no head to check: the projection is its own)."""

    def serves_by_default(self, config: BertConfig) -> bool:
        return True

    def decode(self, examples: Sequence[RerankQuery], features: Sequence[Feature], outputs: Sequence[Any],
               options: Mapping[str, Any], config: BertConfig, tokenizer: Any = None) -> list[dict[str, Any]]:
        """Each input's texts ranked by MaxSim from its windows' token vectors (`ColBERT.forward`'s
        `TokenVectors`: the query's window and one per text)."""
        queries: dict[int, Any] = {}
        documents: list[list[tuple[int, Any]]] = [[] for _ in examples]
        for feature, output in zip(features, outputs):
            if feature.window == QUERY_WINDOW:
                queries[feature.example_index] = output.vectors
            else:
                documents[feature.example_index].append((feature.window, output.vectors))
        results = []
        for index, example in enumerate(examples):
            texts = sorted(documents[index], key=lambda item: item[0])
            scores = maxsim_pairs(queries[index], [vectors for _, vectors in texts]).tolist()
            ranked = sorted(zip([position for position, _ in texts], scores), key=lambda item: (-item[1], item[0]))
            kept = ranked[: options["top_n"]] if options["top_n"] else ranked
            results.append({"results": [{"index": i, "score": float(s), "logit": float(s),
                                         **({"text": example.texts[i]} if options["return_text"] else {})}
                                        for i, s in kept]})
        return results


FAMILY = MaxSimReranking()


class MaxSimRerankPipeline(Pipeline):
    """The `rerank` route of a ColBERT model (`load_pipelines` makes it for one): `Pipeline`'s steps with the
    windows a late-interaction model reads (`features`: the query's and each text's) and the model run with
    each window's role (`forward`)."""

    def __init__(self, model: Any, tokenizer: Any, **options: Any):
        options.pop("family", None)
        super().__init__(RERANK, model, tokenizer, family=FAMILY, **options)

    def features(self, parsed: Sequence[Any]) -> list[Feature]:
        """Per input (a `RerankQuery`, or a `TruncatedInput` of one: the route's `truncate` and direction), its
        query's window (`QUERY_WINDOW`) and each text's (`Feature.window`: its position), each
        "[CLS] text [SEP]" fitted to its role's length (`fit_tokens`; the ColBERT marker takes one more)."""
        settings, post = self.model.colbert, self.tokenizer.post_processor
        room = {"query": settings.query_length - 1 - post.added(False),
                "document": settings.document_length - 1 - post.added(False)}
        features = []
        for index, item in enumerate(parsed):
            wire = isinstance(item, TruncatedInput)
            example = item.example if wire else item
            rule = {"truncate": item.truncate, "direction": item.direction, "fix": item.fix} if wire else \
                {"truncate": True, "direction": "right"}
            texts = [("query", QUERY_WINDOW, example.query, "query")]
            texts += [("document", position, text, item.name.format(index=index, position=position).removesuffix(
                " with the query") if wire else f"texts[{position}]") for position, text in enumerate(example.texts)]
            for role, window, text, name in texts:
                ids = self.tokenizer.encode(text, add_special_tokens=False).ids
                fitted, _ = fit_tokens(ids, None, room[role], name=name, max_length=room[role] + 1 +
                                       post.added(False), **rule)
                features.append(Feature(index, *post.assemble(fitted), window=window,
                                        truncated=len(fitted) < len(ids)))
        return features

    def forward(self, features: Sequence[Feature], options: dict[str, Any]) -> list[Any]:
        """Token vectors (`families.colbert.TokenVectors`) per window, in order: the query windows run with the
        query role, the texts' with the document role."""
        outputs: list[Any] = [None] * len(features)
        for role, chosen in (("query", [i for i, f in enumerate(features) if f.window == QUERY_WINDOW]),
                             ("document", [i for i, f in enumerate(features) if f.window != QUERY_WINDOW])):
            if not chosen:
                continue
            ran = run_features(self.engine, [features[i] for i in chosen],
                               lambda model, batch, role=role: COLBERT.forward(model, batch, {"role": role}),
                               batch_size=self.batch_size, pad_token_id=self.tokenizer.pad_token_id,
                               precision=self.precision, split_padding=True)
            for i, output in zip(chosen, ran):
                outputs[i] = output
        return outputs

    def stream(self, parsed: Sequence[Any], options: dict, on_batch: Any = None, features: Any = None
               ) -> tuple[list, list]:
        """`features` then `forward` (the windows of a rerank call are made at once: their roles split the run)."""
        made = (features or self.features)(parsed)
        outputs = self.forward(made, options)
        if on_batch is not None:
            on_batch(len(made))
        return made, outputs

    def decode(self, parsed: Sequence[Any], features: Sequence[Feature], outputs: Sequence[Any],
               options: dict[str, Any]) -> list[dict[str, Any]]:
        """The family's ranking of each input, with how many of its texts were cut (`wire_inputs.TRUNCATED`)."""
        examples = [item.example if isinstance(item, TruncatedInput) else item for item in parsed]
        return with_cuts(self.family.decode(examples, features, outputs, options, self.config, self.tokenizer),
                         parsed, features)


def reranks_by_maxsim(model_class: type) -> bool:
    """Whether models of this class rerank by MaxSim (a ColBERT model) rather than as a cross-encoder."""
    return issubclass(model_class, BertForColBERT)


__all__ = ["FAMILY", "QUERY_WINDOW", "MaxSimRerankPipeline", "MaxSimReranking", "reranks_by_maxsim"]
