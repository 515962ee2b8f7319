"""The sparse training objective: in-batch negatives by dot product at scale 1 plus the FLOPS regulariser,
weighted separately for the query and the document vectors (the `--query-regularizer` and
`--document-regularizer` settings), worked out by hand on a small batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from bertforge.errors import ConfigError
from bertforge.families.contrastive import ContrastiveLoss
from bertforge.families.sparse_objective import (
    DEFAULT_DOCUMENT_REGULARIZER,
    DEFAULT_QUERY_REGULARIZER,
    SparseObjective,
    sparse_loss,
)


def test_sparse_objective_ranks_by_dot_product_and_weighs_flops_per_side():
    torch.manual_seed(0)
    vectors = torch.relu(torch.randn(3, 3, 11))  # [B, C, V]: anchor, positive, hard negative
    input_ids = torch.arange(3 * 3 * 4).view(3, 3, 4)  # every text distinct
    settings = sparse_loss(ContrastiveLoss(query_regularizer=0.5, document_regularizer=0.25))
    terms = SparseObjective(settings).loss_terms(SimpleNamespace(embeddings=vectors), SimpleNamespace(
        input_ids=input_ids))
    documents = vectors[:, 1:].reshape(-1, 11)
    flops = 0.5 * (vectors[:, 0].mean(0) ** 2).sum() + 0.25 * (documents.mean(0) ** 2).sum()
    assert terms["flops"][0].item() == pytest.approx(flops.item(), rel=1e-6)
    candidates = torch.cat([vectors[:, 1], vectors[:, 2]])  # positives, then negatives
    ranking = F.cross_entropy(vectors[:, 0] @ candidates.T, torch.arange(3), reduction="sum")
    assert terms["contrastive"][0].item() == pytest.approx(ranking.item(), rel=1e-6)
    assert terms["contrastive"][1].item() == 3


def test_sparse_objective_regularizer_warms_up_quadratically():
    settings = sparse_loss(ContrastiveLoss(query_regularizer=0.5, document_regularizer=0.25))
    assert settings.regularizer_warmup == pytest.approx(1 / 3)
    # 30 steps: warm-up of int(30 / 3) = 10 steps, factor (step / 10)^2, then 1.
    assert [settings.weight_factor(s, 30) for s in (0, 5, 9, 10, 29)] == pytest.approx([0, 0.25, 0.81, 1, 1])
    assert [settings.weight_factor(s, 2) for s in (0, 1)] == [0.0, 1.0]  # at least one warm-up step
    constant = sparse_loss(ContrastiveLoss(regularizer_warmup=0))
    assert constant.weight_factor(0, 30) == 1.0
    torch.manual_seed(0)
    vectors = torch.relu(torch.randn(3, 2, 11))
    batch = SimpleNamespace(input_ids=torch.arange(24).view(3, 2, 4))
    objective = SparseObjective(settings)
    full = objective.loss_terms(SimpleNamespace(embeddings=vectors), batch)["flops"][0].item()
    objective.at_step(5, 30)
    warming = objective.loss_terms(SimpleNamespace(embeddings=vectors), batch)
    assert warming["flops"][0].item() == pytest.approx(0.25 * full, rel=1e-6)
    with pytest.raises(ConfigError, match="regularizer_warmup=1.5"):
        ContrastiveLoss(regularizer_warmup=1.5)


def test_sparse_loss_defaults_and_refusals():
    assert sparse_loss(None).query_regularizer == DEFAULT_QUERY_REGULARIZER
    assert sparse_loss(ContrastiveLoss()).document_regularizer == DEFAULT_DOCUMENT_REGULARIZER
    assert sparse_loss(ContrastiveLoss(query_regularizer=0.0)).query_regularizer == 0.0
    with pytest.raises(ConfigError, match="matryoshka_dims are dense-vector settings"):
        sparse_loss(ContrastiveLoss(loss="cached_mnrl", mini_batch_size=4))
    with pytest.raises(ConfigError, match="query_regularizer=-1"):
        ContrastiveLoss(query_regularizer=-1)


def test_max_logits_backward_equals_autograd_through_the_dense_logits(tiny_config):
    from bertforge.families.sparse import BertForSparseEmbedding

    torch.manual_seed(0)
    model = BertForSparseEmbedding(tiny_config.replace(initializer_range=0.2))
    input_ids = torch.randint(5, 99, (4, 9))
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7, [1] * 9])
    types = torch.zeros_like(input_ids)
    results = {}
    for fast in (True, False):
        model.zero_grad()
        model.fast_max = fast
        vectors = model.sparse_rows(input_ids, types, mask)  # [4, V]
        # A loss that weighs every term differently, so each winner's gradient is its own.
        (vectors * torch.linspace(0.5, 2.0, vectors.shape[1])).pow(2).sum().backward()
        results[fast] = (vectors.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                            if p.grad is not None})
    assert torch.equal(results[True][0], results[False][0])  # the same forward numbers
    assert results[True][1].keys() == results[False][1].keys()
    for name, grad in results[False][1].items():
        # float rounding of sums taken in another order; a gradient that is 0 in theory (a key bias) is noise
        difference = (results[True][1][name] - grad).abs().max() / max(grad.abs().max(), 1.0)
        assert difference < 1e-5, (name, float(difference))


def test_max_logits_makes_no_logits_past_each_piece_longest_text(monkeypatch):
    from bertforge.families import sparse

    torch.manual_seed(0)
    features, weight, bias = torch.randn(4, 9, 5), torch.randn(11, 5), torch.randn(11)
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7, [1] * 9]).bool()
    made = []

    def linear(x, w, b):
        made.append(x.shape[0] * x.shape[1])  # token positions given logits
        return F.linear(x, w, b)

    monkeypatch.setattr(sparse, "F", SimpleNamespace(linear=linear))
    results = []
    for budget in (36 * 11, 9 * 11):  # all texts at once; one long text (or several short) at a time
        made.clear()
        inputs = [t.clone().requires_grad_() for t in (features, weight, bias)]
        values = sparse.MaxLogits.apply(*inputs, mask, budget)
        values.pow(2).sum().backward()
        results.append((values.detach(), [t.grad for t in inputs], list(made)))
    plain = (features @ weight.T + bias).masked_fill(~mask[..., None], float("-inf")).amax(1)
    for values, _, _ in results:
        assert torch.allclose(values, plain)
    # All at once: one piece of 4 texts x 9 positions. 9 x V logits at a time: the texts longest first, each
    # piece cut at its longest text's last real token, so no logits for the padding (26 of 36 positions).
    assert [r[2] for r in results] == [[36], [9, 9, 6, 2]]
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-6)
