"""The training objective of sparse (SPLADE) vectors: in-batch negatives by dot product plus the FLOPS
regulariser, with separate weights for the query and the document vectors (Formal et al. 2021; Paria et al.
2020), as sentence-transformers' `SpladeLoss` over `SparseMultipleNegativesRankingLoss`.

Ranking: each anchor's positive among every positive and hard negative of the batch (and, under DDP, of every
rank), scored by the dot product of the sparse vectors at scale 1 (sparse scores are not cosines), a text
equal to the right one never counted as a negative: `families.contrastive.mnrl_terms`, the one home of it.

FLOPS: sum over the vocabulary of (the mean weight of the term over the batch's vectors)^2. It penalises terms
that are active in many texts, which is what makes an inverted index slow, and lets rare terms keep their
weight. It is a batch-level term: the loop averages it over the micro-batches of a step.

Warm-up: both FLOPS weights start at 0 and grow as (step / warm-up steps)^2 to their value over the first
`regularizer_warmup` of the run's steps (1/3 by default; the warm-up steps are that fraction of the steps,
rounded down, at least 1), as the SPLADE papers and sentence-transformers' trainer do: a regulariser at full
weight from the first step drives every weight of a young model to 0 before the ranking term has shaped it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bertforge.errors import ConfigError
from bertforge.families.base import Objective
from bertforge.families.contrastive import ContrastiveLoss, mnrl_terms

# sentence-transformers' SPLADE training examples' weights (the FLOPS terms are small sums of squared means).
DEFAULT_QUERY_REGULARIZER = 5e-5
DEFAULT_DOCUMENT_REGULARIZER = 3e-5
DEFAULT_REGULARIZER_WARMUP = 1 / 3


@dataclass(frozen=True)
class SparseLoss:
    """How a sparse model trains: `symmetric` also ranks the anchors for each positive; the FLOPS weights and
    the fraction of the steps over which they warm up."""

    symmetric: bool = False
    query_regularizer: float = DEFAULT_QUERY_REGULARIZER
    document_regularizer: float = DEFAULT_DOCUMENT_REGULARIZER
    regularizer_warmup: float = DEFAULT_REGULARIZER_WARMUP

    def weight_factor(self, step: int, total_steps: int) -> float:
        """What the FLOPS weights are multiplied by at optimizer step `step` (0-based) of `total_steps`."""
        if not self.regularizer_warmup:
            return 1.0
        warmup = max(1, int(total_steps * self.regularizer_warmup))
        return 1.0 if step >= warmup else (step / warmup) ** 2


def sparse_loss(settings: ContrastiveLoss | None) -> SparseLoss:
    """The sparse loss of a run's `[head]` settings; ConfigError for a setting sparse training does not have."""
    if settings is None:
        return SparseLoss()
    if settings.loss not in ("auto", "mnrl") or settings.mini_batch_size is not None or settings.matryoshka_dims:
        raise ConfigError("sparse training uses in-batch negatives (head.loss = mnrl) with the FLOPS regulariser; "
                          "cached_mnrl, cosent, mini_batch_size and matryoshka_dims are dense-vector settings: "
                          "remove them")
    return SparseLoss(settings.symmetric,
                      DEFAULT_QUERY_REGULARIZER if settings.query_regularizer is None else settings.query_regularizer,
                      DEFAULT_DOCUMENT_REGULARIZER if settings.document_regularizer is None
                      else settings.document_regularizer,
                      DEFAULT_REGULARIZER_WARMUP if settings.regularizer_warmup is None
                      else settings.regularizer_warmup)


def flops(vectors: torch.Tensor) -> torch.Tensor:
    """FLOPS of sparse vectors [N, V]: sum over terms of (mean weight over the N vectors)^2."""
    return (vectors.mean(0) ** 2).sum()


class SparseObjective(Objective):
    """The loop's view of a sparse model (`BertForSparseEmbedding`'s `.embeddings` [B, C, V]): the ranking term
    per anchor, the FLOPS term per micro-batch (its weights as the loop's `at_step` warm-up says: full weight
    until a step is announced); metrics: accuracy (positive ranked first) and the average number of non-zero
    terms of the queries and of the documents."""

    def __init__(self, settings: SparseLoss):
        self.settings = settings
        self.ranking = ContrastiveLoss(loss="mnrl", scale=1.0, symmetric=settings.symmetric)
        self.scored: tuple[Any, torch.Tensor] | None = None
        self.factor = 1.0  # the warm-up's share of the FLOPS weights at the current step

    def at_step(self, step: int, total_steps: int) -> None:
        self.factor = self.settings.weight_factor(step, total_steps)

    def counts(self, batch) -> dict[str, torch.Tensor]:
        return {"contrastive": torch.tensor(float(batch.input_ids.shape[0])), "flops": torch.tensor(1.0)}

    def loss_terms(self, output, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        vectors = output.embeddings.float()  # [B, C, V]
        count = self.counts(batch)
        loss, correct = mnrl_terms(vectors, batch.input_ids, self.ranking, normalize=False)
        self.scored = (output, correct.detach())
        regularizer = self.factor * (self.settings.query_regularizer * flops(vectors[:, 0])
                                     + self.settings.document_regularizer
                                     * flops(vectors[:, 1:].reshape(-1, vectors.shape[-1])))
        return {"contrastive": (loss, count["contrastive"].to(vectors.device)),
                "flops": (regularizer, count["flops"].to(vectors.device))}

    def metrics(self, output, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        vectors = output.embeddings.detach()
        if self.scored is not None and self.scored[0] is output:
            correct = self.scored[1]
        else:
            with torch.no_grad():
                _, correct = mnrl_terms(vectors.float(), batch.input_ids, self.ranking, normalize=False)
        self.scored = None
        batch_size = correct.new_tensor(float(vectors.shape[0]))
        documents = correct.new_tensor(float(vectors.shape[0] * (vectors.shape[1] - 1)))
        active = (vectors > 0).sum(-1).float()  # [B, C]
        return {"accuracy": (correct, batch_size), "query_terms": (active[:, 0].sum(), batch_size),
                "document_terms": (active[:, 1:].sum(), documents)}
