"""Hard negatives for embedding training, and a cross-encoder's margins over them for distillation.

Owns `mine_negatives` (each (anchor, positive) pair's nearest texts of a corpus, by an embedding model's
cosine, minus its positives and minus texts scored too close to its positive to be safely wrong) with its
settings (`MiningSettings`), `candidate_lists` (mined rows grouped per pair: positive, then negatives),
`teacher_scores` (a reranker's score of each text after the anchor, what KL distillation softmaxes) and `teacher_margins` (relevance(anchor, positive) - relevance(anchor, negative) of a
reranker, per triplet, what MarginMSE regresses onto). The commands are `bertforge mine-negatives` and
`bertforge score-margins`; the files they write are read by `finetune --format embedding-triplets` and
`--format embedding-margins`.

False negatives are the risk of mining: the corpus holds texts that answer the anchor as well as its labelled
positive does. Two guards, as NV-Retriever (Moreira et al., 2024) measured them: a candidate is kept only
when it scores below the positive by `margin` (absolute) and below `1 - relative_margin` of it (relative,
default 5%); and `range_min` skips the very top of the list where unlabelled positives crowd.

Scores are computed one block of anchors at a time (`vector_index.QUERY_BLOCK` against the whole corpus), so
memory grows with the corpus, not with anchors x corpus.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bertforge.errors import ConfigError
from bertforge.metrics.embedding import normalize_rows
from bertforge.retrieval.vector_index import QUERY_BLOCK, block_top_k

SAMPLINGS = ("top", "random")
OUTPUT_FORMATS = ("triplet", "labeled-pair", "labeled-list")
MARGIN_KINDS = ("score", "logit")


@dataclass(frozen=True)
class MiningSettings:
    """Which corpus texts become a pair's negatives.

    num_negatives: negatives per pair (one output row each).
    range_min, range_max: the candidates are the anchor's nearest corpus texts ranked [range_min, range_max)
        once its own positives are removed (0-based; 0 to 50 by default).
    margin: keep a candidate only if its cosine <= the positive's cosine - margin (None: no absolute guard).
    relative_margin: keep a candidate only if its cosine <= (1 - relative_margin) x the positive's cosine
        (None: no relative guard; 0.05 by default).
    sampling: "top" takes the best-ranked candidates left, "random" draws them from all that are left.
    seed: the generator of "random".
    """

    num_negatives: int = 1
    range_min: int = 0
    range_max: int = 50
    margin: float | None = None
    relative_margin: float | None = 0.05
    sampling: str = "top"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_negatives < 1:
            raise ConfigError(f"num_negatives={self.num_negatives}: use 1 or more")
        if not 0 <= self.range_min < self.range_max:
            raise ConfigError(f"range_min={self.range_min}, range_max={self.range_max}: use 0 <= range_min < "
                              "range_max (ranks among the anchor's nearest texts, e.g. 0 and 50)")
        if self.range_max - self.range_min < self.num_negatives:
            raise ConfigError(f"range {self.range_min}..{self.range_max} holds fewer than num_negatives="
                              f"{self.num_negatives} candidates; widen it")
        if self.margin is not None and not 0 <= self.margin < 2:
            raise ConfigError(f"margin={self.margin}: use a cosine difference in [0, 2), e.g. 0.1")
        if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
            raise ConfigError(f"relative_margin={self.relative_margin}: use a share in [0, 1), e.g. 0.05")
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"sampling={self.sampling!r}: use one of {SAMPLINGS}")


@dataclass(frozen=True)
class MinedNegative:
    """One output row: the pair's texts, its negative, the negative's rank among the anchor's nearest texts
    (positives removed, 0-based) and both cosines."""

    anchor: str
    positive: str
    negative: str
    rank: int
    negative_score: float
    positive_score: float


@dataclass
class MiningReport:
    """What mining did: pairs read, corpus size, rows written, and pairs left without enough negatives."""

    pairs: int = 0
    corpus: int = 0
    rows: int = 0
    short_pairs: int = 0
    dropped_pairs: int = 0
    removed_by_margin: int = 0
    removed_as_equal: int = 0

    def lines(self) -> list[str]:
        equal = (f"{self.removed_as_equal} candidates skipped as equal to their anchor, one of its positives or a "
                 "better-ranked candidate (whitespace aside)")
        return [f"{self.pairs} pairs, corpus of {self.corpus} texts: {self.rows} rows written",
                *([equal] if self.removed_as_equal else []),
                f"{self.removed_by_margin} candidates in range removed as too close to their positive "
                "(possible false negatives)",
                f"{self.short_pairs} pairs found fewer negatives than asked; {self.dropped_pairs} found none "
                "(left out)"]


def corpus_of(pairs: Sequence[tuple[str, str]], extra: Sequence[str] = ()) -> tuple[list[str], dict[str, int]]:
    """The distinct texts to mine from (the pairs' positives, then `extra`, first occurrence kept) and the
    index of each."""
    index: dict[str, int] = {}
    for text in [p for _, p in pairs] + list(extra):
        index.setdefault(text, len(index))
    return list(index), index


def mine_negatives(pairs: Sequence[tuple[str, str]], encode: Callable[[list[str]], np.ndarray],
                   settings: MiningSettings, corpus: Sequence[str] = (),
                   report: MiningReport | None = None) -> list[MinedNegative]:
    """Up to `settings.num_negatives` negatives per (anchor, positive) pair, in pair order.

    Args:
        pairs: (anchor, positive) texts; an anchor may have several positives (rows), all of them are
            removed from its candidates.
        encode: texts -> vectors [N, D] (an embedding pipeline's `encode`); compared by cosine.
        corpus: texts to mine besides the positives (the positives always belong to the corpus).

    Returns:
        One `MinedNegative` per negative found; a pair with none found has no row (`report.dropped_pairs`).
    """
    report = report if report is not None else MiningReport()
    texts, where = corpus_of(pairs, corpus)
    anchors: dict[str, int] = {}
    for anchor, _ in pairs:
        anchors.setdefault(anchor, len(anchors))
    own: list[set[int]] = [set() for _ in anchors]
    for anchor, positive in pairs:
        own[anchors[anchor]].add(where[positive])
    report.pairs, report.corpus = len(pairs), len(texts)
    documents = normalize_rows(np.asarray(encode(texts), dtype=np.float32))  # [M, D]
    queries = normalize_rows(np.asarray(encode(list(anchors)), dtype=np.float32))  # [A, D]
    # Enough of each anchor's list that range_max candidates remain once its positives are removed.
    depth = min(len(texts), settings.range_max + max(len(s) for s in own))
    candidates: list[list[tuple[int, float]]] = []
    for start in range(0, len(queries), QUERY_BLOCK):
        scores = queries[start:start + QUERY_BLOCK] @ documents.T  # [q, M] cosines
        best, rows = block_top_k(scores, 0, depth)
        for offset, (row_scores, row_ids) in enumerate(zip(best, rows)):
            positives = own[start + offset]
            kept = [(int(r), float(s)) for r, s in zip(row_ids, row_scores) if int(r) not in positives]
            candidates.append(kept[settings.range_min:settings.range_max])
    generator = np.random.default_rng(settings.seed)
    mined: list[MinedNegative] = []
    for anchor, positive in pairs:
        a = anchors[anchor]
        positive_score = float(queries[a] @ documents[where[positive]])
        chosen = choose_negatives([(texts[r], s) for r, s in candidates[a]], positive_score, settings, generator,
                                  report)
        mined += [MinedNegative(anchor, positive, text, rank, s, positive_score) for rank, text, s in chosen]
    report.rows = len(mined)
    return mined


def choose_negatives(candidates: Sequence[tuple[str, float]], positive_score: float, settings: MiningSettings,
                     generator: np.random.Generator, report: MiningReport) -> list[tuple[int, str, float]]:
    """One pair's negatives, (rank, text, cosine) each, from its candidates in range (ranked
    `settings.range_min` onwards, best first, its positives already removed): those below both margins of
    `positive_score`, the best `num_negatives` of them or as many drawn by `generator` (`sampling`); the
    margin's removals and a short or empty choice are counted in `report`."""
    ceiling = float("inf")
    if settings.margin is not None:
        ceiling = min(ceiling, positive_score - settings.margin)
    if settings.relative_margin is not None:
        ceiling = min(ceiling, positive_score * (1 - settings.relative_margin))
    ranked = [(rank, text, s) for rank, (text, s) in enumerate(candidates, start=settings.range_min)]
    allowed = [item for item in ranked if item[2] <= ceiling]
    report.removed_by_margin += len(ranked) - len(allowed)
    if settings.sampling == "random" and len(allowed) > settings.num_negatives:
        picks = sorted(generator.choice(len(allowed), settings.num_negatives, replace=False).tolist())
        chosen = [allowed[i] for i in picks]
    else:
        chosen = allowed[:settings.num_negatives]
    if len(chosen) < settings.num_negatives:
        report.short_pairs += 1
        report.dropped_pairs += not chosen
    return chosen


def output_rows(mined: Iterable[MinedNegative], output_format: str) -> tuple[tuple[str, ...], Iterator[tuple]]:
    """(columns, rows) of a mining output file: "triplet" (anchor, positive, negative: `finetune --format
    embedding-triplets`), "labeled-pair" (anchor, text, label: each pair's positive once labelled 1, then each
    of its negatives labelled 0, a cross-encoder's training file) or "labeled-list" (query, docs, labels: one row
    per pair, its positive then its negatives, labelled 1 then 0s: `finetune --format rerank-lists`, JSON Lines)."""
    if output_format not in OUTPUT_FORMATS:
        raise ConfigError(f"output format {output_format!r}: use one of {OUTPUT_FORMATS}")
    if output_format == "triplet":
        return ("anchor", "positive", "negative"), ((m.anchor, m.positive, m.negative) for m in mined)
    if output_format == "labeled-list":
        lists = candidate_lists((m.anchor, m.positive, m.negative) for m in mined)
        return ("query", "docs", "labels"), ((anchor, docs, [1] + [0] * (len(docs) - 1)) for anchor, docs in lists)

    def labelled() -> Iterator[tuple]:
        seen = set()
        for m in mined:  # each pair's positive once, then each of its negatives
            if (m.anchor, m.positive) not in seen:
                seen.add((m.anchor, m.positive))
                yield m.anchor, m.positive, "1"
            yield m.anchor, m.negative, "0"

    return ("anchor", "text", "label"), labelled()


def candidate_lists(triplets: Iterable[Sequence[str]]) -> list[tuple[str, list[str]]]:
    """(anchor, [positive, negative, ...]) per (anchor, positive) pair of (anchor, positive, negative) rows (one
    row per negative, as mining writes them), in first-seen order, the negatives in row order."""
    lists: dict[tuple[str, str], list[str]] = {}
    for anchor, positive, negative in triplets:
        lists.setdefault((anchor, positive), [positive]).append(negative)
    return [(anchor, docs) for (anchor, _), docs in lists.items()]


def teacher_margins(triplets: Sequence[Sequence[str]], rank: Callable[[list[dict]], list[dict]],
                    kind: str = "score") -> list[float]:
    """A cross-encoder's margin per (anchor, positive, negative): its relevance of the positive minus that of
    the negative (`teacher_scores`' two scores)."""
    return [positive - negative for positive, negative in teacher_scores(triplets, rank, kind)]


def teacher_scores(triplets: Sequence[Sequence[str]], rank: Callable[[list[dict]], list[dict]],
                   kind: str = "score") -> list[tuple[float, ...]]:
    """A cross-encoder's score of each text after the anchor, per (anchor, positive, negative, ...) group:
    what KL distillation softmaxes, and what MarginMSE subtracts.

    Args:
        rank: a `rerank` pipeline's `run` (inputs {"query", "texts"} -> {"results": [{"index", "score",
            "logit"}, ...]}).
        kind: "score" (relevance in [0, 1], so margins lie in [-1, 1], the scale of the cosine margins
            MarginMSE trains) or "logit" (the raw output, unbounded).
    """
    if kind not in MARGIN_KINDS:
        raise ConfigError(f"margin kind {kind!r}: use one of {MARGIN_KINDS}")
    results = rank([{"query": t[0], "texts": list(t[1:])} for t in triplets])
    scores = []
    for group, result in zip(triplets, results):
        by_index = {item["index"]: item[kind] for item in result["results"]}
        scores.append(tuple(float(by_index[i]) for i in range(len(group) - 1)))
    return scores
