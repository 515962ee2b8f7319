"""Parameter groups, LAMB against a hand computation, and the warmup/decay schedule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bertforge.families.pretraining import BertForPretraining
from bertforge.model.config import BertConfig
from bertforge.training.config import TrainingConfig
from bertforge.training.optim import Lamb, build_optimizer, parameter_groups
from bertforge.training.schedules import WarmupDecay, build_scheduler


def tiny_pretraining_model() -> BertForPretraining:
    torch.manual_seed(0)
    return BertForPretraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=20, max_position_embeddings=16))


def test_parameter_groups_exclude_biases_and_layernorm_from_decay():
    model = tiny_pretraining_model()
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    plain = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert "bert.embeddings.word.weight" in decayed
    assert "bert.encoder.layers.0.attention.query.weight" in decayed
    assert "mlm.bias" in plain
    assert all(n.endswith("bias") or "norm" in n.lower() for n in plain), plain
    assert not any(n.endswith("bias") for n in decayed)
    layer_norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert all(id(m.weight) in {id(p) for p in no_decay["params"]} for m in layer_norms)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_parameter_groups_skip_frozen_and_dedupe_tied():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, shared, nn.Linear(3, 2))
    model[2].requires_grad_(False)
    groups = parameter_groups(model, 0.1)
    assert sum(len(g["params"]) for g in groups) == 2


def test_lamb_single_step_matches_hand_computation():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 4))
    b = nn.Parameter(torch.randn(4))
    g_w, g_b = torch.randn(3, 4), torch.randn(4)
    start_w, start_b = w.detach().clone(), b.detach().clone()
    lr, (b1, b2), eps, wd = 0.1, (0.9, 0.999), 1e-6, 0.01
    opt = Lamb([{"params": [w], "weight_decay": wd, "layer_adaptation": True},
                {"params": [b], "weight_decay": 0.0, "layer_adaptation": False}], lr=lr, betas=(b1, b2), eps=eps)
    w.grad, b.grad = g_w.clone(), g_b.clone()
    opt.step()

    def adam_direction(g):
        m_hat = (1 - b1) * g / (1 - b1)
        v_hat = (1 - b2) * g * g / (1 - b2)
        return m_hat / (v_hat.sqrt() + eps)

    update_w = adam_direction(g_w) + wd * start_w
    ratio = start_w.norm() / update_w.norm()
    torch.testing.assert_close(w.detach(), start_w - lr * ratio * update_w)
    torch.testing.assert_close(b.detach(), start_b - lr * adam_direction(g_b))


def test_lamb_trust_ratio_is_one_for_zero_weights():
    w = nn.Parameter(torch.zeros(2, 2))
    opt = Lamb([w], lr=0.5, weight_decay=0.0)
    w.grad = torch.ones(2, 2)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((2, 2), -0.5), atol=1e-5, rtol=0)


def test_lamb_reduces_a_quadratic_loss():
    torch.manual_seed(0)
    target = torch.randn(8, 8)
    w = nn.Parameter(torch.randn(8, 8))
    opt = Lamb([w], lr=0.05)
    start = float(((w.detach() - target) ** 2).sum())
    for _ in range(100):
        opt.zero_grad()
        loss = ((w - target) ** 2).sum()
        loss.backward()
        opt.step()
    assert float(((w.detach() - target) ** 2).sum()) < 0.05 * start


def test_build_optimizer_adamw_uses_config_and_groups():
    model = tiny_pretraining_model()
    config = TrainingConfig(lr=2e-4, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.02)
    opt = build_optimizer(model, config, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.02, 0.0]
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6 and opt.defaults["lr"] == 2e-4


def test_build_optimizer_fused_adamw_equals_default():
    """The fused kernel is a fast path: after a few steps the weights equal the default AdamW's."""
    models, optimizers = [], []
    for fused in (False, True):
        torch.manual_seed(0)
        models.append(tiny_pretraining_model().eval())  # no dropout: both see the same forward pass
        optimizers.append(build_optimizer(models[-1], TrainingConfig(fused_adamw=fused, lr=1e-2), torch.device("cpu")))
    assert optimizers[1].defaults.get("fused") and not optimizers[0].defaults.get("fused")
    for step in range(3):
        inputs = torch.randint(5, 50, (2, 8), generator=torch.Generator().manual_seed(step))
        for model, optimizer in zip(models, optimizers):
            optimizer.zero_grad()
            model(inputs).mlm_logits.float().pow(2).mean().backward()
            optimizer.step()
    for (name, plain), fused in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.allclose(plain, fused, atol=1e-6), name


def test_build_optimizer_lamb():
    opt = build_optimizer(tiny_pretraining_model(), TrainingConfig(optimizer="lamb"), torch.device("cpu"))
    assert isinstance(opt, Lamb)
    assert [g["layer_adaptation"] for g in opt.param_groups] == [True, False]


def test_warmup_decay_values():
    schedule = WarmupDecay(warmup_steps=4, total_steps=10)
    assert [schedule(s) for s in range(10)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    assert schedule(10) == 0.0
    constant = WarmupDecay(warmup_steps=2, total_steps=10, schedule="constant")
    assert [constant(s) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    assert WarmupDecay(0, 4)(0) == 1.0


def test_build_scheduler_sets_lr_per_step():
    w = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=1.0)
    scheduler = build_scheduler(opt, warmup_steps=2, total_steps=4)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert seen == pytest.approx([0.5, 1.0, 1.0, 0.5])
