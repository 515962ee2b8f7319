"""The loop's recipes through `train`: early stopping, layer-wise lr decay, FGM, R-Drop and EMA of the weights,
alone and together, across resumes (CPU, seconds).

The pieces alone are tested in `test_training_recipes.py`, which also holds the tiny classifier, its
source and its objective used here. Hand computations repeat what each recipe claims with autograd and
compare: gradients captured by a hook on the optimizer, losses from the logged history, weights bit for
bit where the claim is exact.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from test_training_loop import single_thread  # noqa: F401  (autouse fixture)
from test_training_recipes import (
    ClassBatch,
    Objective,
    ScriptedEval,
    Source,
    WithoutConsistency,
    assert_same_weights,
    ce_sum,
    config_for,
    expected_depth,
    record_steps,
    tiny_classifier,
    train_values,
)
from torch import nn

from bertforge.checkpoint_format import load_model
from bertforge.errors import ConfigError
from bertforge.families.base import symmetric_kl
from bertforge.families.classification import BertForSequenceClassification
from bertforge.runtime import set_seed
from bertforge.training import resume
from bertforge.training.checkpoint import find_latest, list_checkpoints, load_training_state, stopped_early
from bertforge.training.logging import read_metrics
from bertforge.training.loop import train
from bertforge.training.optim import build_optimizer
from bertforge.training.recipes import BestCheckpoint
from bertforge.training.schedules import WarmupDecay


def test_train_recipes_off_equal_the_plain_loop(tmp_path):
    zeros = dict(patience=0, min_delta=0.0, layer_lr_decay=1.0, fgm_epsilon=0.0, rdrop_alpha=0.0, ema_decay=0.0)
    plain_model, zero_model = tiny_classifier(dropout=0.1), tiny_classifier(dropout=0.1)
    plain = train(plain_model, Source(3, 4), Objective(), config_for(tmp_path / "a"))
    zero = train(zero_model, Source(3, 4), Objective(), config_for(tmp_path / "b", **zeros))
    for key in ("loss", "loss_ce", "accuracy", "grad_norm", "lr"):
        assert train_values(plain.history, key) == train_values(zero.history, key), key
    assert_same_weights(plain_model, zero_model)
    assert set(plain.train) == set(zero.train) and "loss_rdrop" not in zero.train and "adv_ce" not in zero.train


# --- early stopping --------------------------------------------------------------------------------------

def test_early_stopping_stops_after_patience_evaluations(tmp_path):
    scores = {1: 0.2, 2: 0.6, 3: 0.5, 4: 0.55, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    run = tmp_path / "run"
    result = train(tiny_classifier(), Source(3, 4), Objective(),
                   config_for(run, steps=8, eval_every=1, log_every=3, patience=2),
                   eval_fn=ScriptedEval(scores), best=BestCheckpoint("score", False, tmp_path / "best"))
    assert result.stopped_early and result.step == 4 and result.total_steps == 8
    assert [e["step"] for e in result.history if e["split"] == "eval"] == [1, 2, 3, 4]
    # Step 4's training values (its log window began after step 3) are logged though log_every is 3.
    assert [e["step"] for e in result.history if e["split"] == "train"] == [3, 4]
    assert (result.best_step, result.best_eval) == (2, {"score": 0.6})
    assert result.checkpoint == run / "checkpoint-000004" and find_latest(run) == result.checkpoint
    state = load_training_state(result.checkpoint)
    assert state["stopped_early"] is True and state["best"]["stale"] == 2 and stopped_early(result.checkpoint)
    assert "stopped early at step 4 of 8" in result.summary()


def test_early_stopping_min_delta_needs_a_real_gain(tmp_path):
    # +0.01 and +0.005 are improvements (the best model follows them) but not by more than 0.05.
    scores = {1: 0.5, 2: 0.51, 3: 0.515, 4: 0.9, 5: 0.9, 6: 0.9}
    evaluation = ScriptedEval(scores)
    result = train(tiny_classifier(), Source(3, 4), Objective(),
                   config_for(tmp_path / "run", steps=6, eval_every=1, patience=2, min_delta=0.05),
                   eval_fn=evaluation, best=BestCheckpoint("score", False, tmp_path / "best"))
    assert result.stopped_early and result.step == 3
    assert result.best_step == 3
    loaded, _ = load_model(tmp_path / "best", BertForSequenceClassification)
    assert_same_weights(loaded, evaluation.weights[3])
    # Lower is better: the gain is measured downwards.
    lower = train(tiny_classifier(), Source(3, 4), Objective(),
                  config_for(tmp_path / "low", steps=6, eval_every=1, patience=2, min_delta=0.05),
                  eval_fn=ScriptedEval({1: 1.0, 2: 0.97, 3: 0.5, 4: 0.49, 5: 0.48, 6: 0.1}),
                  best=BestCheckpoint("score", True, tmp_path / "best-low"))
    assert lower.stopped_early and lower.step == 5 and lower.best_step == 5


def test_early_stopping_count_survives_resume(tmp_path):
    scores = {1: 0.5, 2: 0.4, 3: 0.45, 4: 0.3, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9, 9: 0.9, 10: 0.9}
    config = dict(steps=10, eval_every=1, save_every=1, patience=3)
    full = train(tiny_classifier(), Source(3, 4), Objective(), config_for(tmp_path / "full", **config),
                 eval_fn=ScriptedEval(scores), best=BestCheckpoint("score", False, tmp_path / "best-full"))
    assert full.stopped_early and full.step == 4

    run, best = tmp_path / "run", BestCheckpoint("score", False, tmp_path / "best")
    with pytest.raises(KeyboardInterrupt):  # steps 1-3 done: two evaluations without a gain are counted
        train(tiny_classifier(), Source(3, 4, fail_after=3), Objective(), config_for(run, **config),
              eval_fn=ScriptedEval(scores), best=best)
    assert find_latest(run).name == "checkpoint-000003"
    assert load_training_state(find_latest(run))["best"]["stale"] == 2
    resumed = train(tiny_classifier(seed=5), Source(3, 4), Objective(), config_for(run, resume="auto", **config),
                    eval_fn=ScriptedEval(scores), best=best)
    assert resumed.stopped_early and resumed.step == 4 and resumed.start_step == 3
    assert [e["step"] for e in resumed.history if e["split"] == "eval"] == [4]
    assert train_values(read_metrics(run), "loss") == train_values(read_metrics(tmp_path / "full"), "loss")

    # Resuming a stopped run trains nothing and says so.
    again = train(tiny_classifier(), Source(3, 4), Objective(), config_for(run, resume="auto", **config),
                  eval_fn=ScriptedEval(scores), best=best)
    assert again.history == [] and again.stopped_early and again.step == 4 and again.best_step == 1
    assert again.summary().startswith("already stopped early at step 4 of 10 (nothing trained)")
    assert [s for s, _ in list_checkpoints(run)][-1] == 4


def test_early_stopping_needs_evaluations(tmp_path):
    source = Source(3, 4)
    with pytest.raises(ConfigError, match=r"training\.patience=2 needs evaluations.*dev set.*training\.patience 0"):
        train(tiny_classifier(), source, Objective(), config_for(tmp_path, patience=2))
    with pytest.raises(ConfigError, match=r"training\.patience=2 needs evaluations"):
        train(tiny_classifier(), source, Objective(), config_for(tmp_path, patience=2),
              eval_fn=lambda model, step: {"score": 0.0})  # evaluations, but no best metric to follow
    assert source.yielded == 0 and not list_checkpoints(tmp_path)


# --- layer-wise learning-rate decay ----------------------------------------------------------------------

def test_layer_lr_decay_resume_restores_the_group_lrs(tmp_path, monkeypatch):
    config = dict(steps=6, save_every=3, warmup_steps=2, schedule="linear", layer_lr_decay=0.7)
    full_model = tiny_classifier(dropout=0.1)
    train(full_model, Source(4, 4), Objective(), config_for(tmp_path / "full", **config))

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_classifier(dropout=0.1), Source(4, 4, fail_after=4), Objective(), config_for(run, **config))
    restored = []
    original = resume.restore_optimizer

    def capture(optimizer, scheduler, scaler, state, path):
        original(optimizer, scheduler, scaler, state, path)
        restored.append({id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]})

    monkeypatch.setattr(resume, "restore_optimizer", capture)
    model = tiny_classifier(dropout=0.1, seed=9)
    train(model, Source(4, 4), Objective(), config_for(run, resume="auto", **config))
    factor = WarmupDecay(2, 6, "linear")(3)  # the lr multiplier of step 4, the first resumed one
    for name, param in model.named_parameters():
        assert restored[0][id(param)] == pytest.approx(1e-3 * 0.7 ** expected_depth(name) * factor, rel=1e-12), name
    assert_same_weights(model, full_model)


# --- FGM -------------------------------------------------------------------------------------------------

def fgm_reference(model: nn.Module, micro_batches: list[ClassBatch], epsilon: float) -> dict[str, torch.Tensor]:
    """The window's gradients by hand: per micro-batch, the clean loss and the loss with the word embeddings
    moved by eps * g / ||g|| (g: that micro-batch's own gradient), both over the window's example count."""
    params = dict(model.named_parameters())
    word = model.bert.embeddings.word.weight
    count = sum(b.labels.shape[0] for b in micro_batches)
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for batch in micro_batches:
        clean = torch.autograd.grad(ce_sum(model, batch) / count, list(params.values()), allow_unused=True)
        g = clean[list(params).index("bert.embeddings.word.weight")]
        saved = word.detach().clone()
        with torch.no_grad():
            word.add_(epsilon * g / g.norm())
        adversarial = torch.autograd.grad(ce_sum(model, batch) / count, list(params.values()), allow_unused=True)
        with torch.no_grad():
            word.copy_(saved)
        for name, a, b in zip(params, clean, adversarial):
            for part in (a, b):
                if part is not None:
                    total[name] += part
    return total


def test_fgm_gradients_and_step_equal_hand_computation(tmp_path, monkeypatch):
    # Accumulation 2: the second micro-batch's direction must exclude the first one's accumulated gradient.
    config = config_for(tmp_path, steps=1, batch_size=2, grad_accumulation=2, max_grad_norm=0.0, fgm_epsilon=0.5)
    model = tiny_classifier()
    reference = copy.deepcopy(model)
    seen = record_steps(monkeypatch, model)
    result = train(model, Source(4, 2), Objective(), config)

    micro_batches = list(Source(4, 2))[:2]
    expected = fgm_reference(reference, micro_batches, 0.5)
    for name, grad in seen["grads"][0].items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    # The adversarial half is not negligible: without it the gradients differ (the check can fail).
    clean_only = sum(torch.autograd.grad(ce_sum(reference, b) / 4, reference.bert.embeddings.word.weight)[0]
                     for b in micro_batches)
    assert (seen["grads"][0]["bert.embeddings.word.weight"] - clean_only).abs().max() > 1e-4

    # The step: an optimizer of the same config on the hand-computed gradients gives the same weights.
    for name, param in reference.named_parameters():
        param.grad = expected[name].clone()
    build_optimizer(reference, config, torch.device("cpu")).step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert "adv_ce" in result.train and result.train["adv_ce"] > 0


def test_fgm_restores_the_embeddings_bit_exactly_before_each_step(tmp_path, monkeypatch):
    model = tiny_classifier(dropout=0.1)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = record_steps(monkeypatch, model)
    train(model, Source(3, 4), Objective(), config_for(tmp_path, steps=3, grad_accumulation=2, batch_size=2,
                                                       fgm_epsilon=1.0, rdrop_alpha=1.0))
    assert len(seen["before"]) == 3
    assert_same_weights(seen["before"][0], initial)
    for step in (1, 2):  # what the optimizer saw is what its previous step left, bit for bit
        assert_same_weights(seen["before"][step], seen["after"][step - 1])


def test_fgm_needs_trainable_word_embeddings(tmp_path):
    with pytest.raises(ConfigError, match=r"training\.fgm_epsilon perturbs the word embeddings, which are frozen"):
        train(tiny_classifier(freeze_encoder=True), Source(3, 4), Objective(), config_for(tmp_path, fgm_epsilon=1.0))


# --- R-Drop ----------------------------------------------------------------------------------------------

def test_rdrop_without_dropout_equals_the_plain_step(tmp_path):
    plain_model, rdrop_model = tiny_classifier(), tiny_classifier()
    plain = train(plain_model, Source(3, 4), Objective(), config_for(tmp_path / "a"))
    rdrop = train(rdrop_model, Source(3, 4), Objective(), config_for(tmp_path / "b", rdrop_alpha=2.0))
    assert train_values(rdrop.history, "loss_rdrop") == [0.0] * 4  # the two passes agree exactly
    assert train_values(rdrop.history, "loss_ce") == pytest.approx(train_values(plain.history, "loss_ce"), abs=1e-6)
    for a, b in zip(plain_model.parameters(), rdrop_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_rdrop_with_dropout_logs_a_positive_consistency_term(tmp_path):
    result = train(tiny_classifier(dropout=0.2), Source(3, 4), Objective(), config_for(tmp_path, rdrop_alpha=1.0))
    values = train_values(result.history, "loss_rdrop")
    assert len(values) == 4 and all(v > 0 for v in values)
    assert result.train["loss"] == pytest.approx(result.train["loss_ce"] + result.train["loss_rdrop"])


def test_rdrop_loss_and_gradient_equal_hand_computation(tmp_path):
    alpha = 0.7
    config = config_for(tmp_path, steps=1, rdrop_alpha=alpha, max_grad_norm=0.0)
    model = tiny_classifier(dropout=0.2)
    reference = copy.deepcopy(model)
    result = train(model, Source(3, 4), Objective(), config)

    batch = next(iter(Source(3, 4)))
    set_seed(config.seed)  # what train does before its first forward
    reference.train()
    out_a = reference(**batch.model_inputs())
    out_b = reference(**batch.model_inputs())
    ce = (F.cross_entropy(out_a.logits, batch.labels, reduction="sum")
          + F.cross_entropy(out_b.logits, batch.labels, reduction="sum")) / 2 / 4
    rdrop = alpha * symmetric_kl(out_a.logits, out_b.logits) / 4
    (ce + rdrop).backward()
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()
                                                      if p.grad is not None]))
    values = result.history[0]["values"]
    ce, rdrop = float(ce.detach()), float(rdrop.detach())
    assert values["loss_ce"] == pytest.approx(ce, rel=1e-6)
    assert values["loss_rdrop"] == pytest.approx(rdrop, rel=1e-5) and values["loss_rdrop"] > 0
    assert values["loss"] == pytest.approx(ce + rdrop, rel=1e-6)
    assert values["grad_norm"] == pytest.approx(float(grad_norm), rel=1e-5)


def test_rdrop_needs_a_consistency_term(tmp_path):
    source = Source(3, 4)
    with pytest.raises(ConfigError, match=r"training\.rdrop_alpha=1: the WithoutConsistency objective defines no "
                                          r"consistency term \(R-Drop applies to .*rdrop_alpha 0"):
        train(tiny_classifier(), source, WithoutConsistency(), config_for(tmp_path, rdrop_alpha=1.0))
    assert source.yielded == 0


# --- gradient accumulation with the recipes --------------------------------------------------------------

def test_grad_accumulation_with_rdrop_matches_one_large_batch(tmp_path):
    # Without dropout R-Drop's passes agree, so batch 4 x 2 must equal batch 8, with the rdrop term counted
    # over the window. (With FGM the two differ by design: the perturbation follows each micro-batch's own
    # gradient; test_fgm_gradients_and_step_equal_hand_computation checks that per micro-batch.)
    whole_model, split_model = tiny_classifier(), tiny_classifier()
    whole = train(whole_model, Source(3, 8), Objective(), config_for(tmp_path / "a", batch_size=8, rdrop_alpha=1.0))
    split = train(split_model, Source(6, 4), Objective(),
                  config_for(tmp_path / "b", batch_size=4, grad_accumulation=2, rdrop_alpha=1.0))
    for key in ("loss", "loss_ce", "accuracy", "grad_norm"):
        assert train_values(whole.history, key) == pytest.approx(train_values(split.history, key), abs=1e-5), key
    for a, b in zip(whole_model.parameters(), split_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --- EMA of the weights ----------------------------------------------------------------------------------

def test_ema_shadow_equals_hand_computed_average(tmp_path, monkeypatch):
    decay = 0.8
    model = tiny_classifier(dropout=0.1)
    shadow = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    seen = record_steps(monkeypatch, model)
    result = train(model, Source(3, 4), Objective(), config_for(tmp_path, steps=3, ema_decay=decay))
    assert len(seen["after"]) == 3
    for weights in seen["after"]:
        shadow = {n: decay * s + (1 - decay) * weights[n] for n, s in shadow.items()}
    for name, param in model.named_parameters():  # train returns with the average in the model
        torch.testing.assert_close(param.detach(), shadow[name], rtol=1e-6, atol=1e-7, msg=name)
    # The checkpoint's model is the average; its training state has the raw weights and the shadow.
    loaded, _ = load_model(result.checkpoint, BertForSequenceClassification)
    assert_same_weights(loaded, model)
    state = load_training_state(result.checkpoint)["ema"]
    assert state["decay"] == decay
    assert_same_weights(state["raw"], seen["after"][-1])
    assert_same_weights(state["shadow"], dict(model.named_parameters()))


def test_ema_evaluation_and_best_model_use_the_average(tmp_path, monkeypatch):
    decay = 0.5
    model = tiny_classifier(dropout=0.1)
    shadow = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    seen = record_steps(monkeypatch, model)
    evaluation = ScriptedEval({1: 0.1, 2: 0.9, 3: 0.3})
    train(model, Source(3, 4), Objective(), config_for(tmp_path / "run", steps=3, eval_every=1, ema_decay=decay),
          eval_fn=evaluation, best=BestCheckpoint("score", False, tmp_path / "best"))
    for step, weights in enumerate(seen["after"], start=1):
        shadow = {n: decay * s + (1 - decay) * weights[n] for n, s in shadow.items()}
        for name, value in shadow.items():
            torch.testing.assert_close(evaluation.weights[step][name], value, rtol=1e-6, atol=1e-7)
        if step == 2:
            loaded, _ = load_model(tmp_path / "best", BertForSequenceClassification)
            assert_same_weights(loaded, evaluation.weights[2])
    for step in (1, 2):  # after each evaluation, training went on from the raw weights, bit for bit
        assert_same_weights(seen["before"][step], seen["after"][step - 1])


def test_ema_resume_equals_uninterrupted_run_bitwise(tmp_path):
    config = dict(steps=6, save_every=2, ema_decay=0.9)
    full_model = tiny_classifier(dropout=0.1)
    full = train(full_model, Source(4, 4), Objective(), config_for(tmp_path / "full", **config))
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # interrupted fetching step 6's batch: checkpoint 4 is the last
        train(tiny_classifier(dropout=0.1), Source(4, 4, fail_after=5), Objective(), config_for(run, **config))
    assert find_latest(run).name == "checkpoint-000004"
    resumed_model = tiny_classifier(dropout=0.1, seed=7)
    resumed = train(resumed_model, Source(4, 4), Objective(), config_for(run, resume="auto", **config))
    assert train_values(read_metrics(run), "loss") == train_values(full.history, "loss")
    assert_same_weights(resumed_model, full_model)
    full_state, resumed_state = load_training_state(full.checkpoint), load_training_state(resumed.checkpoint)
    assert_same_weights(full_state["ema"]["raw"], resumed_state["ema"]["raw"])
    assert_same_weights(full_state["ema"]["shadow"], resumed_state["ema"]["shadow"])


# --- the recipes together --------------------------------------------------------------------------------

def test_recipes_combine_and_resume_exactly(tmp_path):
    """FGM + R-Drop + EMA + layer-wise decay + early stopping, under LAMB with accumulation and dropout."""
    config = dict(steps=6, save_every=2, eval_every=2, grad_accumulation=2, batch_size=2, optimizer="lamb",
                  fgm_epsilon=0.5, rdrop_alpha=1.0, ema_decay=0.9, layer_lr_decay=0.8, patience=5)

    def scores():
        return ScriptedEval({2: 0.3, 4: 0.5, 6: 0.4})

    full_model = tiny_classifier(dropout=0.1)
    full = train(full_model, Source(5, 2), Objective(), config_for(tmp_path / "full", **config), eval_fn=scores(),
                 best=BestCheckpoint("score", False, tmp_path / "best-full"))
    assert full.step == 6 and not full.stopped_early and full.best_step == 4
    assert {"loss_ce", "loss_rdrop", "adv_ce", "accuracy"} <= set(full.train)
    assert all(math.isfinite(v) for v in train_values(full.history, "loss"))

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # step 4 done (checkpoint), step 5 interrupted mid-window
        train(tiny_classifier(dropout=0.1), Source(5, 2, fail_after=9), Objective(), config_for(run, **config),
              eval_fn=scores(), best=BestCheckpoint("score", False, tmp_path / "best"))
    resumed_model = tiny_classifier(dropout=0.1, seed=3)
    resumed = train(resumed_model, Source(5, 2), Objective(), config_for(run, resume="auto", **config),
                    eval_fn=scores(), best=BestCheckpoint("score", False, tmp_path / "best"))
    assert resumed.start_step == 4 and resumed.best_step == 4
    for key in ("loss", "loss_ce", "loss_rdrop", "adv_ce", "grad_norm", "lr"):
        assert train_values(read_metrics(run), key) == train_values(full.history, key), key
    assert_same_weights(resumed_model, full_model)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_recipes_run_under_autocast(tmp_path, precision):
    result = train(tiny_classifier(dropout=0.1), Source(3, 4), Objective(),
                   config_for(tmp_path, steps=3, precision=precision, fgm_epsilon=1.0, rdrop_alpha=1.0,
                              ema_decay=0.9, layer_lr_decay=0.9))
    assert result.step == 3 and result.skipped_steps == 0
    assert all(math.isfinite(v) for v in train_values(result.history, "loss"))


def test_describe_run_names_the_recipes(tmp_path, caplog):
    with caplog.at_level("INFO", logger="bertforge.training"):
        train(tiny_classifier(), Source(3, 4), Objective(),
              config_for(tmp_path, steps=1, fgm_epsilon=1.0, rdrop_alpha=2.0, ema_decay=0.99, layer_lr_decay=0.5))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipes: "))
    assert "layer-wise lr decay 0.5 (head at lr, embeddings at lr x 0.125)" in line
    assert "FGM adversarial training, epsilon 1" in line and "R-Drop, alpha 2" in line
    assert "EMA of the weights, decay 0.99" in line


# --- checkpoints across versions and settings ------------------------------------------------------------

def test_resume_of_a_checkpoint_without_recipe_state(tmp_path):
    """A checkpoint written before the recipes existed (no `stopped_early`, no `best.stale`, no `ema`)."""
    config = dict(steps=4, save_every=2, eval_every=1)
    scores = {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}
    full = train(tiny_classifier(dropout=0.1), Source(3, 4), Objective(), config_for(tmp_path / "full", **config),
                 eval_fn=ScriptedEval(scores), best=BestCheckpoint("score", False, tmp_path / "best-full"))
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_classifier(dropout=0.1), Source(3, 4, fail_after=3), Objective(), config_for(run, **config),
              eval_fn=ScriptedEval(scores), best=BestCheckpoint("score", False, tmp_path / "best"))
    file = find_latest(run) / "training_state.pt"
    state = torch.load(file, weights_only=True)
    del state["stopped_early"]
    del state["best"]["stale"]
    torch.save(state, file)
    (file.parent / "checksums.json").unlink()  # an older checkpoint: saved without checksums
    resumed = train(tiny_classifier(dropout=0.1), Source(3, 4), Objective(), config_for(run, resume="auto", **config),
                    eval_fn=ScriptedEval(scores), best=BestCheckpoint("score", False, tmp_path / "best"))
    assert resumed.start_step == 2 and resumed.step == 4 and resumed.best_step == 4
    assert train_values(read_metrics(run), "loss") == train_values(full.history, "loss")


def test_ema_checkpoint_resumed_without_ema_continues_from_the_raw_weights(tmp_path, caplog):
    # EMA never changes the training trajectory: an EMA-off resume of an EMA-on run must end where an
    # EMA-off run does, bit for bit (not from the averaged weights the model directory holds).
    config = dict(steps=4, save_every=2)
    plain_model = tiny_classifier(dropout=0.1)
    train(plain_model, Source(3, 4), Objective(), config_for(tmp_path / "plain", **config))
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_classifier(dropout=0.1), Source(3, 4, fail_after=3), Objective(),
              config_for(run, ema_decay=0.5, **config))
    model = tiny_classifier(dropout=0.1)
    with caplog.at_level("WARNING", logger="bertforge.training"):
        train(model, Source(3, 4), Objective(), config_for(run, resume="auto", **config))
    assert "written with training.ema_decay=0.5; continuing without EMA from the raw weights" in caplog.text
    assert_same_weights(model, plain_model)
