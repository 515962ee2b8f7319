"""The embedding losses: in-batch ranking with false negatives masked, CoSENT's order, Matryoshka widths, the
cached (mini-batched) model run that gives the same gradients in less memory, and the settings' checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertforge.data.finetuning import Feature, collate_features
from bertforge.errors import ConfigError
from bertforge.families.contrastive import (
    ContrastiveLoss,
    ContrastiveObjective,
    cosent_loss,
    kl_loss,
    margin_mse_loss,
    ranking_loss,
    text_keys,
)
from bertforge.families.embedding import BertForSentenceEmbedding
from conftest import make_tiny_config

GRADIENT_TOLERANCE = 1e-5  # fp32: the pieces only change the order of summation


def test_ranking_loss_is_cross_entropy_over_candidates():
    torch.manual_seed(0)
    queries, candidates = torch.randn(3, 8), torch.randn(5, 8)
    targets = torch.tensor([0, 1, 2])
    keys = torch.arange(5)
    loss, correct = ranking_loss(queries, candidates, targets, keys, 20.0)
    scores = 20.0 * F.normalize(queries, dim=-1) @ F.normalize(candidates, dim=-1).T
    assert float(loss) == pytest.approx(float(F.cross_entropy(scores, targets, reduction="sum")), rel=1e-6)
    assert float(correct) == float((scores.argmax(-1) == targets).sum())


def test_ranking_loss_masks_a_repeated_positive_as_no_negative():
    torch.manual_seed(0)
    queries, candidates = torch.randn(2, 8), torch.randn(3, 8)
    keys = torch.tensor([7, 9, 7])  # candidate 2 is the same text as candidate 0 (query 0's positive)
    loss, _ = ranking_loss(queries, candidates, torch.tensor([0, 1]), keys, 20.0)
    scores = 20.0 * F.normalize(queries, dim=-1) @ F.normalize(candidates, dim=-1).T
    first = -F.log_softmax(scores[0, :2], dim=-1)[0]  # query 0 does not see candidate 2 at all
    second = -F.log_softmax(scores[1], dim=-1)[1]  # query 1 sees it as an ordinary negative
    assert float(loss) == pytest.approx(float(first + second), rel=1e-6)


def test_text_keys_equal_texts_equal_keys_across_paddings():
    rows = torch.tensor([[101, 7, 8, 102, 0, 0], [101, 7, 8, 102, 0, 0], [101, 8, 7, 102, 0, 0]])
    keys = text_keys(rows)
    assert keys[0] == keys[1] and keys[0] != keys[2]
    assert text_keys(rows[:, :4])[0] == keys[0]  # another rank may pad to another width


def test_cosent_loss_follows_the_score_order():
    vectors = torch.tensor([[[1.0, 0.0], [1.0, 0.1]], [[1.0, 0.0], [0.0, 1.0]]])  # cosines ~1 and 0
    right = cosent_loss(vectors, torch.tensor([5.0, 0.0]), 20.0)
    wrong = cosent_loss(vectors, torch.tensor([0.0, 5.0]), 20.0)
    assert float(right) < 0.01 < float(wrong)
    cos = F.cosine_similarity(vectors[:, 0], vectors[:, 1], dim=-1) * 20
    assert float(wrong) == pytest.approx(float(torch.log1p(torch.exp(cos[0] - cos[1]))), rel=1e-5)


@pytest.mark.parametrize("given, message", [
    ({"loss": "triplet"}, "use one of"), ({"scale": 0.0}, "positive"),
    ({"mini_batch_size": 8}, "cached_mnrl"), ({"matryoshka_dims": (0,)}, "positive widths"),
])
def test_contrastive_loss_refuses_bad_settings(given, message):
    with pytest.raises(ConfigError, match=message):
        ContrastiveLoss(**given)


def test_contrastive_loss_refuses_a_loss_that_does_not_fit_the_data():
    with pytest.raises(ConfigError, match="needs scored pairs"):
        ContrastiveLoss(loss="cosent").resolved(scored=False)
    with pytest.raises(ConfigError, match="needs pairs or triplets"):
        ContrastiveLoss(loss="mnrl").resolved(scored=True)
    assert ContrastiveLoss().resolved(scored=True) == "cosent"


def test_margin_mse_loss_equals_the_hand_computation_and_its_gradient():
    vectors = torch.tensor([[[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]],  # cos(a, p) = 0.6, cos(a, n) = 0: margin 0.6
                            [[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]]], requires_grad=True)  # 0 - 1 = -1
    loss, correct = margin_mse_loss(vectors, torch.tensor([0.5, 0.25]))
    assert float(loss.detach()) == pytest.approx((0.6 - 0.5) ** 2 + (-1.0 - 0.25) ** 2, rel=1e-6)
    assert float(correct) == 1.0  # only the first triplet puts its positive closer
    loss.backward()
    # d/dp of (cos(a, p) - cos(a, n) - m)^2 = 2 (margin error) (â - cos(a, p) p̂) / |p|, here |p| = 1.
    a, p = torch.tensor([1.0, 0.0]), torch.tensor([0.6, 0.8])
    expected = 2 * (0.6 - 0.5) * (a - 0.6 * p) / 1.0
    torch.testing.assert_close(vectors.grad[0, 1], expected, atol=1e-6, rtol=1e-5)
    assert float(vectors.grad[0, 2].abs().sum()) > 0  # the negative is pushed too


def test_margin_mse_objective_trains_scored_triplets():
    features = [Feature(i, [[2, 5 + i, 3], [2, 20 + i, 3], [2, 40 + i, 3]], [[0] * 3] * 3, label=0.1 * i)
                for i in range(4)]
    batch = collate_features(features, range(4), 0)
    objective = ContrastiveObjective(ContrastiveLoss())
    assert objective.loss_of(batch) == "margin_mse"
    model = BertForSentenceEmbedding(make_tiny_config()).eval()
    output = model(**batch.model_inputs())
    total, count = objective.loss_terms(output, batch)["contrastive"]
    expected, correct = margin_mse_loss(output.embeddings.float(), batch.labels)
    assert float(count) == 4 and float(total.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    accuracy, seen = objective.metrics(output, batch)["accuracy"]
    assert float(accuracy) == float(correct) and float(seen) == 4


def test_contrastive_loss_fits_margin_mse_to_scored_triplets_only():
    assert ContrastiveLoss().resolved(scored=True, texts=3) == "margin_mse"
    with pytest.raises(ConfigError, match="needs triplets with a margin column"):
        ContrastiveLoss(loss="margin_mse").resolved(scored=True, texts=2)
    with pytest.raises(ConfigError, match="use margin_mse"):
        ContrastiveLoss(loss="cosent").resolved(scored=True, texts=3)
    with pytest.raises(ConfigError, match="symmetric applies"):
        ContrastiveLoss(symmetric=True).resolved(scored=True, texts=3)


def test_kl_loss_equals_the_hand_computation():
    vectors = torch.tensor([[[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]])  # cosines 0.6, 0, 1
    teacher = torch.tensor([[2.0, -1.0, 0.5]])
    loss, correct = kl_loss(vectors, teacher, scale=20.0, teacher_temperature=2.0)
    p = torch.softmax(teacher[0] / 2.0, -1)
    q = torch.softmax(20.0 * torch.tensor([0.6, 0.0, 1.0]), -1)
    assert float(loss) == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-6)
    assert float(correct) == 0.0  # the student's best is the last candidate, the teacher's the positive
    same, _ = kl_loss(vectors, 20.0 * torch.tensor([[0.6, 0.0, 1.0]]), scale=20.0)
    assert abs(float(same)) < 1e-6  # a teacher that agrees with the student: no divergence


def test_kl_objective_trains_candidate_scores_and_auto_picks_it():
    features = [Feature(i, [[2, 5 + i, 3], [2, 20 + i, 3], [2, 40 + i, 3], [2, 60 + i, 3]], [[0] * 3] * 4,
                        label=[1.0 + i, 0.5, -1.0]) for i in range(4)]
    batch = collate_features(features, range(4), 0)
    assert tuple(batch.labels.shape) == (4, 3)
    objective = ContrastiveObjective(ContrastiveLoss(teacher_temperature=0.5))
    assert objective.loss_of(batch) == "kl"
    model = BertForSentenceEmbedding(make_tiny_config()).eval()
    output = model(**batch.model_inputs())
    total, count = objective.loss_terms(output, batch)["contrastive"]
    expected, correct = kl_loss(output.embeddings.float(), batch.labels, 20.0, 0.5)
    assert float(count) == 4 and float(total.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    accuracy, seen = objective.metrics(output, batch)["accuracy"]
    assert float(accuracy) == float(correct) and float(seen) == 4


def test_contrastive_loss_fits_kl_to_candidate_scores_only():
    assert ContrastiveLoss().resolved(scored=True, texts=4, candidate_scores=True) == "kl"
    with pytest.raises(ConfigError, match="needs an anchor, a positive and negatives with a teacher score"):
        ContrastiveLoss(loss="kl").resolved(scored=True, texts=3)
    with pytest.raises(ConfigError, match="triplets with a score per candidate; use kl"):
        ContrastiveLoss(loss="margin_mse").resolved(scored=True, texts=3, candidate_scores=True)
    with pytest.raises(ConfigError, match="teacher_temperature=0"):
        ContrastiveLoss(teacher_temperature=0)


# --- the cached run: same gradients, less memory ----------------------------------------------------------

def groups_batch(count: int, seed: int = 0, texts: int = 2):
    """A batch of `count` random groups of `texts` texts each (anchor, positive, hard negatives)."""
    generator = torch.Generator().manual_seed(seed)
    features = []
    for index in range(count):
        rows = [[2, *torch.randint(5, 99, (int(torch.randint(3, 20, (1,), generator=generator)),),
                                   generator=generator).tolist(), 3] for _ in range(texts)]
        features.append(Feature(index, rows, [[0] * len(r) for r in rows]))
    return collate_features(features, range(count), 0)


def gradients(rows_per_piece: int | None, batch) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = BertForSentenceEmbedding(make_tiny_config()).train()  # dropout is 0 in the tiny config
    model.rows_per_piece = rows_per_piece
    objective = ContrastiveObjective(ContrastiveLoss(loss="cached_mnrl" if rows_per_piece else "mnrl"))
    total, count = objective.loss_terms(model(**batch.model_inputs()), batch)["contrastive"]
    (total / count).backward()
    return float((total / count).detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_cached_run_gives_the_uncached_gradients():
    batch = groups_batch(16)
    loss, plain = gradients(None, batch)
    cached_loss, cached = gradients(8, batch)  # 32 texts in pieces of 8: a quarter of the batch
    assert cached_loss == pytest.approx(loss, abs=GRADIENT_TOLERANCE)
    assert plain.keys() == cached.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(cached[name], plain[name], atol=GRADIENT_TOLERANCE, rtol=1e-4, msg=name)


# Peak memory from /proc (VmHWM, the high-water mark of this process image): `ru_maxrss` survives exec on
# Linux, so a child of a big pytest process would report its parent's size.
PEAK_SCRIPT = textwrap.dedent("""
    import sys, torch
    def peak_kib():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    sys.path.insert(0, {tests!r})
    from conftest import make_tiny_config
    from bertforge.data.finetuning import Feature, collate_features
    from bertforge.families.contrastive import ContrastiveLoss, ContrastiveObjective
    from bertforge.families.embedding import BertForSentenceEmbedding
    torch.set_num_threads(1)
    piece = int(sys.argv[1]) or None
    config = make_tiny_config(hidden_size=256, num_attention_heads=4, intermediate_size=1024, num_hidden_layers=4,
                              max_position_embeddings=256)
    model = BertForSentenceEmbedding(config).train()
    model.unpad = False
    model.rows_per_piece = piece
    features = [Feature(i, [[2] + [5 + (i * 7 + j) % 90 for j in range(200)] + [3]] * 2, [[0] * 202] * 2)
                for i in range(64)]
    batch = collate_features(features, range(64), 0)
    before = peak_kib()
    objective = ContrastiveObjective(ContrastiveLoss(loss="cached_mnrl" if piece else "mnrl"))
    total, count = objective.loss_terms(model(**batch.model_inputs()), batch)["contrastive"]
    (total / count).backward()
    print(peak_kib() - before)
""")


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="peak memory is read from Linux's /proc")
def test_cached_run_peaks_lower_in_memory(tmp_path):
    script = PEAK_SCRIPT.format(tests=str(Path(__file__).resolve().parents[1]))

    def peak(piece: int) -> int:
        done = subprocess.run([sys.executable, "-c", script, str(piece)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    plain, cached = peak(0), peak(16)  # 128 texts of 202 tokens, in pieces of 16
    assert cached < 0.5 * plain, (plain, cached)
