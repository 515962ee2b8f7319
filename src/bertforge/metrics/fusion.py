"""Reciprocal rank fusion (RRF) of ranked lists: hybrid search fuses a dense and a sparse retriever's lists.

Owns `reciprocal_rank_fusion`. A document's fused score is the sum, over the lists it appears in, of
1 / (k + its rank), ranks counted from 1 (Cormack, Clarke and Buettcher 2009; k = 60 is theirs and
sentence-transformers' ReciprocalRankFusionEvaluator's). Only ranks count, so scores of different scales (a
cosine, a SPLADE dot product) fuse without calibration. Equal fused scores keep the order in which the
documents first appear, the first list before the second (a stable sort, as that evaluator does).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from bertforge.errors import InputError

DEFAULT_RRF_K = 60


def check_rrf_k(k: float) -> None:
    if isinstance(k, bool) or not isinstance(k, int | float) or not k >= 0:
        raise InputError(f"rrf_k must be a number >= 0 (60 is the usual), got {k!r}")


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hashable]], k: float = DEFAULT_RRF_K,
                           top: int | None = None) -> list[tuple[Hashable, float]]:
    """The fused list of several rankings of one query, best first.

    Args:
        rankings: lists of documents (ids, row numbers), each best first, each without repeats.
        k: the RRF constant (>= 0): larger k flattens the weight of the first ranks.
        top: keep this many (None: every document that appears).

    Returns:
        [(document, fused score)], highest score first; ties in order of first appearance.
    """
    check_rrf_k(k)
    scores: dict[Hashable, float] = {}
    for ranking in rankings:
        if len(set(ranking)) != len(ranking):
            raise InputError("a ranking lists a document twice; each list must hold distinct documents")
        for rank, document in enumerate(ranking, start=1):
            scores[document] = scores.get(document, 0.0) + 1.0 / (k + rank)
    fused = sorted(scores.items(), key=lambda item: -item[1])  # stable: first appearance breaks ties
    return fused if top is None else fused[:top]


__all__ = ["DEFAULT_RRF_K", "check_rrf_k", "reciprocal_rank_fusion"]
