"""The training objectives of sentence embeddings: in-batch negatives (multiple-negatives ranking), CoSENT for
scored pairs, MarginMSE for triplets scored by a teacher, KL distillation for an anchor's candidates each scored
by a teacher, Matryoshka dimensions over any of them; and the
settings that choose them (`ContrastiveLoss`).

Owns the losses and the one place where in-batch negatives cross processes (`gather`): under DDP every rank
scores its own anchors against the candidates of every rank, gathered *with* their gradients, so N processes
of batch B train like one process of batch N·B. Gradient accumulation does not add negatives (each
micro-batch is scored against itself); the cached loss does (`ContrastiveLoss.mini_batch_size`: the model
runs the batch in mini-batches whose activations are recomputed in the backward pass, see
`families.embedding.BertForSentenceEmbedding`).

False negatives: a candidate whose text is the same as the right one (the same positive twice in a batch, a
hard negative that repeats another anchor's positive) is not counted as a negative; texts are compared by
their token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bertforge.errors import ConfigError
from bertforge.families.base import Objective

LOSSES = ("auto", "mnrl", "cached_mnrl", "cosent", "margin_mse", "kl")
# The losses that train on a teacher's or a gold score (the others on texts alone).
SCORED_LOSSES = ("cosent", "margin_mse", "kl")
# The softmax temperature of both losses (sentence-transformers' default scale 20, i.e. 1/0.05).
DEFAULT_SCALE = 20.0


@dataclass(frozen=True)
class ContrastiveLoss:
    """How an embedding model trains.

    loss: "mnrl" (multiple-negatives ranking: each anchor's positive among every candidate of the batch),
        "cached_mnrl" (the same loss with the batch run in `mini_batch_size` pieces: a large batch in small
        memory), "cosent" (scored pairs: the cosine order follows the score order), "margin_mse" (triplets
        with a teacher's margin: cos(anchor, positive) - cos(anchor, negative) regressed onto it), "auto"
        (cosent for scored pairs, margin_mse for scored triplets, else mnrl).
    scale: multiplies cosine similarities before the softmax (20).
    symmetric: mnrl also scores each positive against every anchor, and averages both directions.
    mini_batch_size: cached_mnrl: rows per piece (default 32).
    matryoshka_dims: train the first d dimensions of each vector for each d given, losses summed (the
        vectors can then be truncated to any of them; list the full width to train it too).
    query_regularizer, document_regularizer: sparse (SPLADE) training only: the weights of the FLOPS
        regulariser of the query and of the document vectors (None: `families.sparse_objective`'s defaults).
    regularizer_warmup: sparse training only: the fraction of the run's steps over which those weights grow
        from 0 to their value, quadratically (None: `families.sparse_objective`'s default, 1/3; 0: constant).
    """

    loss: str = "auto"
    scale: float = DEFAULT_SCALE
    symmetric: bool = False
    mini_batch_size: int | None = None
    matryoshka_dims: tuple[int, ...] = ()
    teacher_temperature: float = 1.0
    query_regularizer: float | None = None
    document_regularizer: float | None = None
    regularizer_warmup: float | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"loss={self.loss!r}: use one of {LOSSES}")
        if not self.scale > 0:
            raise ConfigError(f"scale={self.scale!r}: use a positive number (20 is usual)")
        if not 0 < self.teacher_temperature < float("inf"):
            raise ConfigError(f"teacher_temperature={self.teacher_temperature!r}: use a positive number (1 keeps a "
                              "cross-encoder's logits as they are)")
        if self.mini_batch_size is not None and (self.mini_batch_size < 1 or self.loss != "cached_mnrl"):
            raise ConfigError(f"mini_batch_size={self.mini_batch_size!r} applies to loss=cached_mnrl, as a positive "
                              "number of rows")
        for name in ("query_regularizer", "document_regularizer"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and 0 <= value < float("inf")):
                raise ConfigError(f"{name}={value!r}: use a weight >= 0 (e.g. 5e-5 for queries, 3e-5 for documents)")
        warmup = self.regularizer_warmup
        if warmup is not None and not (isinstance(warmup, int | float) and 0 <= warmup <= 1):
            raise ConfigError(f"regularizer_warmup={warmup!r}: use a fraction of the steps in [0, 1] (0: the "
                              "regularizer weights are constant)")
        if any(d < 1 for d in self.matryoshka_dims):
            raise ConfigError(f"matryoshka_dims={list(self.matryoshka_dims)}: use positive widths, e.g. 256,128,64")

    def resolved(self, scored: bool, texts: int = 2, candidate_scores: bool = False) -> str:
        """The loss for data with scores (`scored`) or without, of `texts` texts per example, with one score per
        candidate (`candidate_scores`: kl's data) or one per example; ConfigError when they do not fit."""
        fitting = ("kl" if candidate_scores else "margin_mse" if texts == 3 else "cosent") if scored else "mnrl"
        loss = self.loss if self.loss != "auto" else fitting
        needs = {"cosent": "scored pairs", "margin_mse": "triplets with a margin column (anchor, positive, "
                 "negative, margin: `bertforge score-margins` writes them)",
                 "kl": "an anchor, a positive and negatives with a teacher score per candidate (`bertforge "
                 "score-margins --output-format scores` writes them)"}.get(loss, "pairs or triplets")
        if scored != (loss in SCORED_LOSSES) or (scored and loss != fitting):
            kind = "groups" if texts > 3 else "triplets" if texts == 3 else "pairs"
            shape = (f"{kind} with a score per candidate" if candidate_scores else
                     f"{'scored ' if scored else ''}{kind}")
            raise ConfigError(f"loss={loss} needs {needs}, but the data has {shape}; use "
                              f"{fitting if scored else 'mnrl or cached_mnrl'}")
        if self.symmetric and loss in SCORED_LOSSES:
            raise ConfigError(f"symmetric applies to mnrl and cached_mnrl, not {loss}")
        return loss

    @property
    def rows_per_piece(self) -> int | None:
        """Rows the model runs at once (cached_mnrl), else None (all of them)."""
        return (self.mini_batch_size or 32) if self.loss == "cached_mnrl" else None


def world() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`tensor` [N_r, ...] of every rank concatenated in rank order [sum N_r, ...], with gradients flowing back
    to each rank's own rows, and where this rank's rows start. Ranks may hold different N (an epoch's last,
    short batch): rows are padded for the collective and the padding cut away."""
    rank, size = world()
    if size == 1:
        return tensor, 0
    from torch.distributed.nn.functional import all_gather

    counts = [torch.zeros(1, dtype=torch.long, device=tensor.device) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([tensor.shape[0]], device=tensor.device))
    rows = [int(c) for c in counts]
    padded = F.pad(tensor, (0,) * (2 * (tensor.dim() - 1)) + (0, max(rows) - tensor.shape[0]))
    pieces = all_gather(padded)
    return torch.cat([piece[:n] for piece, n in zip(pieces, rows)], dim=0), sum(rows[:rank])


# Fixed random weights of token positions (one table, so keys agree across ranks padded to other widths).
_KEY_WEIGHTS = torch.randint(1, 2**31 - 1, (8192,), generator=torch.Generator().manual_seed(1234), dtype=torch.int64)


def text_keys(input_ids: torch.Tensor) -> torch.Tensor:
    """One int64 key per row of token ids [N, T] (padding 0 ignored): equal texts get equal keys, different
    ones different keys with overwhelming probability (a fixed random projection mod 2**61 - 1)."""
    weights = _KEY_WEIGHTS[: input_ids.shape[-1]].to(input_ids.device)
    return (input_ids.long() * weights).sum(-1).remainder(2**61 - 1)


def ranking_loss(queries: torch.Tensor, candidates: torch.Tensor, targets: torch.Tensor,
                 candidate_keys: torch.Tensor, scale: float, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, correct count) of each query's target among all candidates.

    queries [B, D], candidates [M, D], targets [B] (indices into candidates); the keys identify texts so that a
    candidate equal to the target (other than the target itself) is masked out, not a negative. The scores are
    scaled cosines, or with `normalize=False` scaled dot products (sparse vectors).
    """
    if normalize:
        queries, candidates = F.normalize(queries, dim=-1), F.normalize(candidates, dim=-1)
    scores = scale * queries @ candidates.T  # [B, M]
    same = candidate_keys[None, :] == candidate_keys[targets][:, None]  # [B, M]: the target's text
    same[torch.arange(len(targets)), targets] = False
    scores = scores.masked_fill(same, float("-inf"))
    loss = F.cross_entropy(scores, targets, reduction="sum")
    return loss, (scores.argmax(-1) == targets).float().sum()


def mnrl_terms(vectors: torch.Tensor, input_ids: torch.Tensor, settings: ContrastiveLoss, normalize: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sum over this rank's anchors, correct count) of multiple-negatives ranking.

    vectors [B, C, D]: anchor, positive, then C-2 hard negatives per example; input_ids [B, C, T]. The
    candidates are every rank's positives then every rank's negatives.
    """
    batch, count = vectors.shape[:2]
    keys = text_keys(input_ids.reshape(batch * count, -1)).view(batch, count)
    anchors, anchor_keys = vectors[:, 0], keys[:, 0]
    # Each rank's block is its positives, then its negatives; this rank's positives start its block.
    candidates, start = gather(vectors[:, 1:].transpose(0, 1).reshape(-1, vectors.shape[-1]))  # [sum B·(C-1), D]
    candidate_keys, _ = gather(keys[:, 1:].T.reshape(-1))
    targets = torch.arange(batch, device=vectors.device) + start
    loss, correct = ranking_loss(anchors, candidates, targets, candidate_keys, settings.scale, normalize)
    if settings.symmetric:
        (all_anchors, start), (all_anchor_keys, _) = gather(anchors), gather(anchor_keys)
        own = torch.arange(batch, device=vectors.device) + start
        back, _ = ranking_loss(vectors[:, 1], all_anchors, own, all_anchor_keys, settings.scale, normalize)
        loss = (loss + back) / 2
    return loss, correct


def cosent_loss(vectors: torch.Tensor, scores: torch.Tensor, scale: float) -> torch.Tensor:
    """CoSENT (Su, 2022): log(1 + sum over pairs i, j with score_i > score_j of exp(s·(cos_j - cos_i))).

    vectors [B, 2, D] (the two sentences of each pair), scores [B]."""
    cosine = F.cosine_similarity(vectors[:, 0], vectors[:, 1], dim=-1) * scale  # [B]
    differences = cosine[None, :] - cosine[:, None]  # [i, j] = s·cos_j - s·cos_i
    ordered = scores[:, None] > scores[None, :]  # pairs where i should be more similar than j
    differences = differences.masked_fill(~ordered, float("-inf")).flatten()
    return torch.logsumexp(torch.cat([differences.new_zeros(1), differences]), dim=0)


def margin_mse_loss(vectors: torch.Tensor, margins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed squared error, correct count) of MarginMSE (Hofstätter et al., 2020): the student's margin
    cos(anchor, positive) - cos(anchor, negative) against the teacher's margin, per triplet.

    vectors [B, 3, D] (anchor, positive, negative), margins [B]. Cosines, as the trainer's other losses score:
    a margin lies in [-2, 2], so the teacher's margins should be on that scale (`score-margins` writes the
    difference of two relevances in [0, 1]). Correct: the positive is the closer of the two.
    """
    anchors = F.normalize(vectors[:, 0], dim=-1)
    positive = (anchors * F.normalize(vectors[:, 1], dim=-1)).sum(-1)  # [B]
    negative = (anchors * F.normalize(vectors[:, 2], dim=-1)).sum(-1)  # [B]
    student = positive - negative
    return ((student - margins.to(student.dtype)) ** 2).sum(), (student > 0).float().sum()


def kl_loss(vectors: torch.Tensor, teacher: torch.Tensor, scale: float, teacher_temperature: float = 1.0
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed KL divergence, correct count) of distillation from a teacher's scores over each anchor's
    candidates (Lin et al., 2020): KL(softmax(teacher / teacher_temperature) || softmax(scale · cos(anchor, c))).

    vectors [B, C, D] (anchor, positive, C-2 negatives), teacher [B, C-1] (its score of each candidate, the
    positive first). Summed over anchors, so the loop's mean is sentence-transformers' `DistillKLDivLoss`
    ("batchmean") with its student temperature 1/scale, without its factor student_temperature²: the loss
    stays in nats and its gradient on the scaled cosines has the size of mnrl's, for which the recipes'
    learning rates are set. Correct: the student's best candidate is the teacher's.
    """
    anchors = F.normalize(vectors[:, 0], dim=-1)[:, None]  # [B, 1, D]
    student = scale * (anchors * F.normalize(vectors[:, 1:], dim=-1)).sum(-1)  # [B, C-1]
    teacher = teacher.to(student.dtype)
    target = torch.softmax(teacher / teacher_temperature, dim=-1)
    loss = F.kl_div(torch.log_softmax(student, dim=-1), target, reduction="sum")
    return loss, (student.argmax(-1) == teacher.argmax(-1)).float().sum()


class ContrastiveObjective(Objective):
    """The training loop's view of an embedding model (`BertForSentenceEmbedding`'s output `.embeddings`
    [B, C, D]): one loss term, per anchor (mnrl, margin_mse, kl) or per micro-batch (cosent, a loss over the batch's
    pairs), each Matryoshka width adding its own loss to it; `accuracy` is the anchors whose positive scored
    highest (margin_mse: above the triplet's negative; kl: the candidate the teacher scored highest)."""

    def __init__(self, settings: ContrastiveLoss):
        self.settings = settings
        # The full-width ranking's correct count of the last output `loss_terms` scored, so that `metrics` on
        # the same output does not rank (and, under DDP, gather) a second time.
        self.scored: tuple[Any, torch.Tensor] | None = None

    def loss_of(self, batch) -> str:
        """The loss of this batch: the settings' own, or for "auto" the one its scores call for (cosent for a
        score per pair, margin_mse per triplet, kl for a row of scores [B, C-1] per anchor)."""
        labels = batch.labels
        return self.settings.resolved(scored=labels is not None, texts=batch.input_ids.shape[1],
                                      candidate_scores=labels is not None and labels.dim() == 2)

    def counts(self, batch) -> dict[str, torch.Tensor]:
        return {"contrastive": torch.tensor(1.0 if self.loss_of(batch) == "cosent" else float(batch.input_ids.shape[0]))}

    def widths(self, vectors: torch.Tensor) -> list[torch.Tensor]:
        """The vectors cut to each Matryoshka width (as sentence-transformers does, only the widths listed:
        list the full width too to train it), or the full vectors alone."""
        full = vectors.shape[-1]
        too_wide = [d for d in self.settings.matryoshka_dims if d > full]
        if too_wide:
            raise ConfigError(f"matryoshka_dims {too_wide} exceed the model's {full} dimensions")
        return [vectors[..., :d] for d in self.settings.matryoshka_dims] or [vectors]

    def loss_terms(self, output, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        vectors = output.embeddings.float()
        count = self.counts(batch)["contrastive"].to(vectors.device)
        if self.loss_of(batch) == "cosent":
            total = sum(cosent_loss(v, batch.labels.float(), self.settings.scale) for v in self.widths(vectors))
        elif self.loss_of(batch) in ("margin_mse", "kl"):
            total = 0.0
            for v in self.widths(vectors):
                loss, correct = self.distilled(v, batch)
                total = total + loss
                if v.shape[-1] == vectors.shape[-1]:
                    self.scored = (output, correct.detach())
        else:
            total = 0.0
            for v in self.widths(vectors):
                loss, correct = mnrl_terms(v, batch.input_ids, self.settings)
                total = total + loss
                if v.shape[-1] == vectors.shape[-1]:
                    self.scored = (output, correct.detach())
        return {"contrastive": (total, count)}

    def distilled(self, vectors: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss sum, correct count) of a teacher's scores: margin_mse (one margin per triplet) or kl."""
        if self.loss_of(batch) == "kl":
            return kl_loss(vectors, batch.labels, self.settings.scale, self.settings.teacher_temperature)
        return margin_mse_loss(vectors, batch.labels)

    def metrics(self, output, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if self.loss_of(batch) == "cosent":
            return {}
        if self.scored is not None and self.scored[0] is output:
            correct = self.scored[1]
        else:
            with torch.no_grad():
                vectors = output.embeddings.detach().float()
                _, correct = (self.distilled(vectors, batch) if self.loss_of(batch) in ("margin_mse", "kl")
                              else mnrl_terms(vectors, batch.input_ids, self.settings))
        self.scored = None
        return {"accuracy": (correct, correct.new_tensor(float(batch.input_ids.shape[0])))}
