"""sentence-transformers parity of the distillation and listwise losses: the same similarities and teacher
scores (or logits and labels) give the same loss as its `DistillKLDivLoss` and its cross-encoder `ListNetLoss`.

sentence-transformers is a test dependency only; the package never imports it.
"""

from __future__ import annotations

import pytest
import torch

from bertforge.families.contrastive import kl_loss

st = pytest.importorskip("sentence_transformers")

LOSS_TOLERANCE = 1e-6  # fp32, the same softmaxes up to summation order


def vectors_and_scores(seed: int, batch: int = 5, candidates: int = 4, width: int = 16):
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn(batch, 1 + candidates, width, generator=generator)
    return vectors, 3.0 * torch.randn(batch, candidates, generator=generator)


@pytest.mark.parametrize(("scale", "teacher_temperature"), [(1.0, 1.0), (20.0, 1.0), (20.0, 2.0)])
def test_kl_loss_matches_their_distill_kl_div_loss(scale, teacher_temperature):
    from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss
    from sentence_transformers.util import pairwise_cos_sim

    vectors, teacher = vectors_and_scores(int(scale * 10 + teacher_temperature))
    ours, _ = kl_loss(vectors, teacher, scale, teacher_temperature)
    student_temperature = 1.0 / scale
    loss = DistillKLDivLoss(None, similarity_fct=pairwise_cos_sim, student_temperature=student_temperature,
                            teacher_temperature=teacher_temperature)
    theirs = loss.compute_loss_from_embeddings(list(vectors.unbind(1)), teacher)
    # Theirs is a batch mean times student_temperature² (Hinton's factor); ours a sum in nats.
    expected = float(theirs) / student_temperature**2 * vectors.shape[0]
    assert float(ours) == pytest.approx(expected, rel=LOSS_TOLERANCE, abs=LOSS_TOLERANCE)


class FixedLogits(torch.nn.Module):
    """A stand-in cross-encoder for their `ListNetLoss`: the score of the i-th (query, document) pair it is
    given is `logits[i]`, so their loss runs on exactly the logits ours gets."""

    num_labels = 1
    device = torch.device("cpu")

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def preprocess(self, pairs, **_):
        start = getattr(self, "seen", 0)
        self.seen = start + len(pairs)
        return {"index": torch.arange(start, start + len(pairs))}

    def forward(self, tokens):
        return {"scores": self.logits[tokens["index"]]}


def test_listnet_loss_matches_their_listnet_loss_on_lists_of_different_lengths():
    from sentence_transformers.cross_encoder.losses import ListNetLoss

    from bertforge.families.reranking import listnet_loss

    lengths = [3, 5, 2, 4]
    generator = torch.Generator().manual_seed(7)
    flat_logits = 2.0 * torch.randn(sum(lengths), generator=generator)
    labels = [torch.randint(0, 4, (n,), generator=generator).float() for n in lengths]
    docs = [[f"doc {i}" for i in range(n)] for n in lengths]
    theirs = ListNetLoss(FixedLogits(flat_logits))([[f"q{i}" for i in range(len(lengths))], docs], labels)
    width = max(lengths)
    logits = torch.zeros(len(lengths), width)
    padded = torch.full((len(lengths), width), float("nan"))
    for row, (piece, label) in enumerate(zip(flat_logits.split(lengths), labels)):
        logits[row, :len(piece)], padded[row, :len(piece)] = piece, label
    ours, _ = listnet_loss(logits, padded)
    # Theirs is the mean over lists; ours the sum.
    assert float(ours) / len(lengths) == pytest.approx(float(theirs), rel=LOSS_TOLERANCE, abs=LOSS_TOLERANCE)
