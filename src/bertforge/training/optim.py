"""Optimizers: AdamW and LAMB with BERT's parameter groups (the learning-rate schedules are `training.schedules`).

Weight decay skips biases and LayerNorm weights (as BERT's `exclude_from_weight_decay` does); LAMB also
skips the layer-wise trust ratio for them (Google's `exclude_from_layer_adaptation` defaults to the same
list). Groups are formed by module type and parameter role, not by name patterns. Layer-wise learning-rate
decay (`training.layer_lr_decay`) splits both groups by depth in the encoder, each with its own lr.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.optim import Optimizer

from bertforge.errors import ConfigError
from bertforge.model.fast_paths import is_encoder, is_layer
from bertforge.training.config import TrainingConfig

log = logging.getLogger(__name__)


def parameter_groups(model: nn.Module, weight_decay: float, layer_lr_decay: float = 1.0,
                     lr: float | None = None) -> list[dict]:
    """BERT's groups: decayed weights, and biases + LayerNorm parameters without decay or trust ratio.

    With `layer_lr_decay` 1 these are the two groups (no "lr" of their own: the optimizer's applies). Below
    1 each depth gets its pair of groups, head first, each with its own "lr" (the schedule scales every
    group's base lr alike): depth 0 (the head and the pooler) at `lr`, encoder layer i of L (0-based) at
    depth L - i, the embeddings at depth L + 1, so group lr = lr * layer_lr_decay**depth. Tied parameters
    appear once, at the depth of their encoder module (the MLM decoder shares the word embeddings); frozen
    ones (requires_grad False) not at all.

    A module may ask for a multiple of its group's rate with an `lr_scale` attribute (the tagger's CRF: a
    few transition scores that start at zero and would barely move at an encoder's rate); its parameters
    then form groups of their own with "lr" = that multiple of the group's rate.

    Raises:
        ConfigError: layer_lr_decay < 1 on a model without a bertforge encoder.
    """
    depths = encoder_depths(model) if layer_lr_decay < 1.0 else {}
    if layer_lr_decay < 1.0 and not depths:
        raise ConfigError("training.layer_lr_decay needs a bertforge encoder in the model (embeddings and "
                          "encoder layers); set training.layer_lr_decay 1")
    # (depth, decayed, lr scale) -> parameters, in the order the model lists them.
    buckets: dict[tuple[int, bool, float], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            plain = isinstance(module, nn.LayerNorm | nn.GroupNorm) or name.endswith("bias") or param.dim() < 2
            scale = float(getattr(module, "lr_scale", 1.0))
            buckets.setdefault((depths.get(id(param), 0), not plain, scale), []).append(param)
    own_lr = layer_lr_decay < 1.0 or any(scale != 1.0 for _, _, scale in buckets)
    if own_lr and lr is None:
        raise ValueError("parameter_groups: layer_lr_decay < 1 or an lr_scale needs the base lr")
    groups = []
    for depth in sorted({d for d, _, _ in buckets}):
        for scale in sorted({s for d, _, s in buckets if d == depth}):
            for decayed in (True, False):
                params = buckets.get((depth, decayed, scale))
                if not params:
                    continue
                group = {"params": params, "weight_decay": weight_decay if decayed else 0.0,
                         "layer_adaptation": decayed}
                if own_lr:
                    group["lr"] = lr * layer_lr_decay**depth * scale
                groups.append(group)
    return groups


def encoder_depths(model: nn.Module) -> dict[int, int]:
    """{id(parameter): depth} of every bertforge encoder inside `model`: L - i for layer i of L, L + 1 for the
    embeddings; the pooler and everything outside the encoders are depth 0 (absent from the dict).

    Found by the conventions `model.fast_paths` uses (an encoder has `embeddings` and `encoder`, a layer has
    `attention` and `feed_forward`), so any model holding a bertforge encoder qualifies.
    """
    depths: dict[int, int] = {}
    for module in model.modules():
        if not (is_encoder(module) and hasattr(module, "embeddings")):
            continue
        layers = [m for m in module.encoder.modules() if is_layer(m)]
        for param in module.embeddings.parameters():
            depths[id(param)] = len(layers) + 1
        for index, layer in enumerate(layers):
            for param in layer.parameters():
                depths[id(param)] = len(layers) - index
    return depths


class Lamb(Optimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning", Algorithm 2).

    Per parameter tensor w with gradient g, at step t:
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  m^ = m / (1 - b1^t);  v^ = v / (1 - b2^t)
        u = m^ / (sqrt(v^) + eps) + weight_decay * w
        ratio = ||w|| / ||u||  (1 when either norm is 0, or when the group has layer_adaptation False)
        w = w - lr * ratio * u
    The trust ratio keeps each layer's step proportional to its weight norm, which is what lets BERT
    pretrain at batch 32k. Gradient clipping is left to the training loop (global norm).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, layer_adaptation: bool = True):
        if lr <= 0:
            raise ValueError(f"Lamb: lr must be positive, got {lr}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "layer_adaptation": layer_adaptation}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"].item()
                grad = p.grad.float()
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad.to(exp_avg.dtype), 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = exp_avg / (1 - beta1**step)
                v_hat = exp_avg_sq / (1 - beta2**step)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p.float(), alpha=group["weight_decay"])
                if group["layer_adaptation"]:
                    w_norm = p.float().norm()
                    u_norm = update.norm()
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(ratio)
                p.add_(update.to(p.dtype), alpha=-group["lr"])
        return loss


def fused_adamw(config: TrainingConfig, device: torch.device) -> bool:
    """Whether AdamW runs PyTorch's fused kernel: `training.fused_adamw`, whose auto is on for CUDA
    parameters only (a CPU keeps the for-each AdamW it always had)."""
    if config.fused_adamw == "auto":
        return device.type == "cuda"
    if config.fused_adamw and device.type not in ("cuda", "cpu"):
        log.warning("training.fused_adamw needs a CUDA or CPU device; using the default AdamW on %s", device)
        return False
    return bool(config.fused_adamw)


def build_optimizer(model: nn.Module, config: TrainingConfig, device: torch.device) -> Optimizer:
    """The optimizer `config.optimizer` names, over BERT's parameter groups (by depth with layer_lr_decay)."""
    groups = parameter_groups(model, config.weight_decay, config.layer_lr_decay, config.lr)
    betas = (config.betas[0], config.betas[1])
    if config.optimizer == "lamb":
        if config.fused_adamw is True:
            log.warning("training.fused_adamw applies to AdamW only; LAMB runs unfused")
        return Lamb(groups, lr=config.lr, betas=betas, eps=config.eps, weight_decay=config.weight_decay)
    fused = fused_adamw(config, device) or None
    for group in groups:
        group.pop("layer_adaptation")
    return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.eps,
                             weight_decay=config.weight_decay, fused=fused)
