"""The loop's recipes as pieces, each alone: the cadence of logs, evaluations and checkpoints, the best
keeper and early stopping, the EMA of the weights, FGM, R-Drop, layer-wise lr decay's groups (CPU, fast).

The module also holds what the recipe tests through the loop share (`test_training_loop_recipes.py`, the
DDP recipe test): a tiny `BertForSequenceClassification` (2 layers) on a synthetic two-class task with the
test's own objective (cross-entropy plus R-Drop's symmetric KL), so the tests pin the loop's contracts, not
a family's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import pytest
import torch
import torch.nn.functional as F
from test_training_loop import SyntheticSource, single_thread  # noqa: F401  (autouse fixture)
from torch import nn

from bertforge.checkpoint_format import load_model
from bertforge.errors import CheckpointError, ConfigError
from bertforge.families.base import symmetric_kl
from bertforge.families.classification import BertForSequenceClassification
from bertforge.model.config import BertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.training import loop
from bertforge.training.config import TrainingConfig
from bertforge.training.optim import Lamb, build_optimizer, parameter_groups
from bertforge.training.recipes import (
    BestCheckpoint,
    BestKeeper,
    BestSoFar,
    Cadence,
    EarlyStopping,
    Fgm,
    RDrop,
    WeightAverage,
    averaged,
    check_recipes,
    describe_recipes,
    word_embedding_weight,
)

SEQ_LEN = 12
VOCAB = 99
LAYERS = 2


@dataclass
class ClassBatch:
    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def to(self, device):
        return ClassBatch(*(getattr(self, f.name).to(device) for f in fields(self)))

    def model_inputs(self):
        return {"input_ids": self.input_ids, "token_type_ids": self.token_type_ids,
                "attention_mask": self.attention_mask}

    @property
    def num_tokens(self):
        return int(self.attention_mask.sum())


def make_example(index: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100_003 + index)
    length = int(torch.randint(4, SEQ_LEN + 1, (1,), generator=g))
    ids = torch.zeros(SEQ_LEN, dtype=torch.long)
    ids[0] = 2
    ids[1:length] = torch.randint(5, VOCAB, (length - 1,), generator=g)
    mask = torch.zeros(SEQ_LEN, dtype=torch.long)
    mask[:length] = 1
    label = torch.tensor(int(ids[1] > VOCAB // 2))  # learnable from one token
    return {"input_ids": ids, "token_type_ids": torch.zeros(SEQ_LEN, dtype=torch.long), "attention_mask": mask,
            "labels": label}


class Source(SyntheticSource):
    """The loop tests' seeded, resumable, rank-sliced source, yielding these two-class examples."""

    make_example = staticmethod(make_example)
    batch_class = ClassBatch


class Objective:
    """Cross-entropy over examples, accuracy, and R-Drop's consistency term (symmetric KL per example)."""

    def counts(self, batch):
        return {"ce": torch.tensor(float(batch.labels.shape[0]))}

    def loss_terms(self, output, batch):
        return {"ce": (F.cross_entropy(output.logits.float(), batch.labels, reduction="sum"),
                       torch.tensor(float(batch.labels.shape[0])))}

    def metrics(self, output, batch):
        correct = (output.logits.detach().argmax(-1) == batch.labels).float().sum()
        return {"accuracy": (correct, torch.tensor(float(batch.labels.shape[0])))}

    def consistency(self, output_a, output_b, batch):
        return symmetric_kl(output_a.logits, output_b.logits)


class WithoutConsistency:
    """The same objective without a consistency term."""

    def __init__(self):
        self.inner = Objective()

    def counts(self, batch):
        return self.inner.counts(batch)

    def loss_terms(self, output, batch):
        return self.inner.loss_terms(output, batch)

    def metrics(self, output, batch):
        return self.inner.metrics(output, batch)


def tiny_classifier(dropout: float = 0.0, seed: int = 0, **overrides) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=SEQ_LEN, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout, id2label={0: "low", 1: "high"}, **overrides)
    return BertForSequenceClassification(config)


def config_for(tmp_path, **overrides) -> TrainingConfig:
    values = {"steps": 4, "batch_size": 4, "lr": 1e-3, "warmup_steps": 0, "schedule": "constant", "log_every": 1,
              "precision": "fp32", "device": "cpu", "out_dir": str(tmp_path), "progress": False,
              "tensorboard": False}
    return TrainingConfig(**{**values, **overrides})


def train_values(history, key):
    return [e["values"][key] for e in history if e["split"] == "train"]


def record_steps(monkeypatch, model: nn.Module) -> dict[str, list]:
    """Hooks on the optimizer the loop builds: before every step each parameter's value and gradient, after
    it each value (copies)."""
    seen: dict[str, list] = {"before": [], "grads": [], "after": []}
    original = loop.build_optimizer

    def snapshot(kind: str) -> None:
        if kind == "grads":
            seen[kind].append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        else:
            seen[kind].append({n: p.detach().clone() for n, p in model.named_parameters()})

    def before(*_) -> None:  # a pre-hook's return value would replace the step's arguments
        snapshot("before")
        snapshot("grads")

    def hooked(*args, **kwargs):
        optimizer = original(*args, **kwargs)
        optimizer.register_step_pre_hook(before)
        optimizer.register_step_post_hook(lambda *_: snapshot("after"))
        return optimizer

    monkeypatch.setattr(loop, "build_optimizer", hooked)
    return seen


def ce_sum(model, batch) -> torch.Tensor:
    return F.cross_entropy(model(**batch.model_inputs()).logits.float(), batch.labels, reduction="sum")


def assert_same_weights(a: nn.Module | dict, b: nn.Module | dict) -> None:
    a = a.state_dict() if isinstance(a, nn.Module) else a
    b = b.state_dict() if isinstance(b, nn.Module) else b
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


class ScriptedEval:
    """Scores scripted per step; records the weights each evaluation saw."""

    def __init__(self, scores: dict[int, float]):
        self.scores, self.weights = scores, {}

    def __call__(self, model, step):
        self.weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return {"score": self.scores[step]}



# --- config ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "value", "fix"), [
    ("patience", -1, "integer >= 0"), ("patience", 1.5, "integer >= 0"),
    ("min_delta", -0.1, "number >= 0"), ("min_delta", math.nan, "number >= 0"),
    ("layer_lr_decay", 0.0, "factor in (0, 1]"), ("layer_lr_decay", 1.1, "factor in (0, 1]"),
    ("fgm_epsilon", -1.0, "number >= 0"), ("fgm_epsilon", math.inf, "number >= 0"),
    ("rdrop_alpha", -0.5, "number >= 0"),
    ("ema_decay", 1.0, "decay in [0, 1)"), ("ema_decay", -0.1, "decay in [0, 1)"),
])
def test_training_config_recipes_refuse_bad_values(name, value, fix):
    with pytest.raises(ConfigError, match=rf"training\.{name}={value!r} is invalid: .*{fix}".replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[")):
        TrainingConfig(**{name: value})


def test_training_config_recipes_default_off():
    config = TrainingConfig(patience=3, min_delta=1, layer_lr_decay=1, ema_decay=0)
    assert (config.patience, config.min_delta, config.layer_lr_decay) == (3, 1.0, 1.0)
    assert isinstance(config.min_delta, float) and isinstance(config.layer_lr_decay, float)
    plain = TrainingConfig()
    assert (plain.patience, plain.fgm_epsilon, plain.rdrop_alpha, plain.ema_decay, plain.layer_lr_decay) == \
        (0, 0.0, 0.0, 0.0, 1.0)


# --- layer-wise learning-rate decay ----------------------------------------------------------------------

def expected_depth(name: str) -> int:
    if name.startswith("bert.embeddings."):
        return LAYERS + 1
    if name.startswith("bert.encoder.layers."):
        return LAYERS - int(name.split(".")[3])
    return 0  # the pooler and the classifier


def group_of(groups: list[dict]) -> dict[int, dict]:
    return {id(p): g for g in groups for p in g["params"]}


@pytest.mark.parametrize("fused", [False, True])
def test_layer_lr_decay_gives_each_parameter_its_depths_lr(fused):
    model = set_fast_paths(tiny_classifier(), unpad=True, fused_qkv=fused)
    lr, decay = 2e-4, 0.8
    groups = parameter_groups(model, 0.01, layer_lr_decay=decay, lr=lr)
    plain = group_of(parameter_groups(model, 0.01))
    by_param = group_of(groups)
    names = dict(model.named_parameters())
    assert len(by_param) == len(names) == sum(len(g["params"]) for g in groups)
    for name, param in names.items():
        group = by_param[id(param)]
        assert group["lr"] == pytest.approx(lr * decay ** expected_depth(name), rel=1e-12), name
        # The decay / no-decay split is BERT's, whatever the depth.
        assert group["weight_decay"] == plain[id(param)]["weight_decay"], name
        assert group["layer_adaptation"] == plain[id(param)]["layer_adaptation"], name
    # One group per (depth, decay) pair, the head first (its lr is the logged one).
    pairs = [(round(math.log(g["lr"] / lr, decay)), g["weight_decay"] > 0) for g in groups]
    assert len(set(pairs)) == len(pairs) and pairs[0] == (0, True)
    assert {d for d, _ in pairs} == set(range(LAYERS + 2))
    if fused:
        assert any(n.endswith("qkv_weight") for n in names)


def test_layer_lr_decay_one_keeps_the_two_groups():
    model = tiny_classifier()
    plain = parameter_groups(model, 0.01)
    same = parameter_groups(model, 0.01, layer_lr_decay=1.0, lr=5e-5)
    assert len(plain) == len(same) == 2
    for a, b in zip(plain, same, strict=True):
        assert set(a) == set(b) == {"params", "weight_decay", "layer_adaptation"}
        assert [id(p) for p in a["params"]] == [id(p) for p in b["params"]]
        assert a["weight_decay"] == b["weight_decay"]


def test_layer_lr_decay_works_with_adamw_and_lamb():
    for name, kind in (("adamw", torch.optim.AdamW), ("lamb", Lamb)):
        model = tiny_classifier()
        config = TrainingConfig(optimizer=name, lr=1e-3, layer_lr_decay=0.5)
        optimizer = build_optimizer(model, config, torch.device("cpu"))
        assert isinstance(optimizer, kind)
        lrs = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
        for pname, param in model.named_parameters():
            assert lrs[id(param)] == pytest.approx(1e-3 * 0.5 ** expected_depth(pname)), (name, pname)
        if name == "lamb":
            assert {g["layer_adaptation"] for g in optimizer.param_groups} == {True, False}


def test_layer_lr_decay_needs_an_encoder():
    with pytest.raises(ConfigError, match=r"training\.layer_lr_decay needs a bertforge encoder.*layer_lr_decay 1"):
        parameter_groups(nn.Sequential(nn.Linear(3, 3)), 0.01, layer_lr_decay=0.9, lr=1e-3)



# --- cadence ---------------------------------------------------------------------------------------------

def test_cadence_logs_every_n_steps_and_the_last():
    cadence = Cadence(total_steps=7, log_every=3)
    assert [s for s in range(1, 8) if cadence.logs(s)] == [3, 6, 7]


def test_cadence_evaluates_every_n_steps_and_the_last_only_with_an_evaluation():
    assert [s for s in range(1, 8) if Cadence(7, 1, eval_every=3, evaluates_at_all=True).evaluates(s)] == [3, 6, 7]
    assert [s for s in range(1, 8) if Cadence(7, 1, eval_every=0, evaluates_at_all=True).evaluates(s)] == [7]
    assert not any(Cadence(7, 1, eval_every=1, evaluates_at_all=False).evaluates(s) for s in range(1, 8))


def test_cadence_saves_every_n_the_last_the_extra_steps_and_where_it_stops():
    every = Cadence(7, 1, save_every=2)
    assert [s for s in range(1, 8) if every.saves(s)] == [2, 4, 6, 7]
    assert every.saves(3, stopping=True)  # an early stop is saved, so a resume knows it stopped
    also = Cadence(7, 1, save_every=0, save_also=lambda step: step in (1, 5))
    assert [s for s in range(1, 8) if also.saves(s)] == [1, 5, 7]


def test_cadence_of_reads_the_config():
    config = TrainingConfig(log_every=4, eval_every=5, save_every=6)
    cadence = Cadence.of(config, 30, evaluates_at_all=True)
    assert (cadence.total_steps, cadence.log_every, cadence.eval_every, cadence.save_every) == (30, 4, 5, 6)
    assert cadence.evaluates_at_all and cadence.save_also is None


# --- the best model and early stopping -------------------------------------------------------------------

def test_best_checkpoint_improves_ignores_nan():
    best = BestCheckpoint("score", False, "unused")
    assert best.improves(0.5, None) and best.improves(0.6, 0.5) and not best.improves(0.4, 0.5)
    assert best.improves(0.1, float("nan")) and not best.improves(float("nan"), 0.1)
    assert BestCheckpoint("mse", True, "unused").improves(0.1, 0.2)


def test_best_checkpoint_improves_by_more_than_min_delta():
    higher, lower = BestCheckpoint("score", False, "unused"), BestCheckpoint("loss", True, "unused")
    assert higher.improves(0.56, 0.5, 0.05) and not higher.improves(0.55, 0.5, 0.05)
    assert lower.improves(0.44, 0.5, 0.05) and not lower.improves(0.45, 0.5, 0.05)
    assert higher.value_of({"score": 1}) == 1.0 and isinstance(higher.value_of({"score": 1}), float)


def test_early_stopping_observe_stops_after_patience_stale_evaluations():
    stopping, record = EarlyStopping(patience=2), BestSoFar()
    decisions = [stopping.observe(record, significant) for significant in (True, False, True, False, False)]
    assert decisions == [False, False, False, False, True]
    assert record.stale == 2


def test_early_stopping_patience_zero_never_stops():
    stopping, record = EarlyStopping(patience=0), BestSoFar()
    assert not any(stopping.observe(record, False) for _ in range(10))
    assert record.stale == 10  # still counted: the checkpoint carries it


def test_early_stopping_significant_uses_min_delta():
    best = BestCheckpoint("score", False, "unused")
    stopping = EarlyStopping(patience=3, min_delta=0.1)
    assert stopping.significant(best, 0.7, None)  # the first evaluation always counts
    assert not stopping.significant(best, 0.59, 0.5) and stopping.significant(best, 0.61, 0.5)


def weights_of(directory) -> dict[str, torch.Tensor]:
    loaded, _ = load_model(directory, BertForSequenceClassification)
    return loaded.state_dict()


def nudged(model: nn.Module, amount: float) -> nn.Module:
    with torch.no_grad():
        for param in model.parameters():
            param.add_(amount)
    return model


@pytest.mark.parametrize(("lower_is_better", "scores", "best_step"), [
    (False, {1: 0.5, 2: 0.7, 3: 0.6}, 2),
    (True, {1: 0.5, 2: 0.3, 3: 0.4}, 2),
])
def test_best_keeper_replaces_the_saved_model_only_when_better(tmp_path, lower_is_better, scores, best_step):
    seen = []
    best = BestCheckpoint("score", lower_is_better, tmp_path / "best", {"note.json": "{}\n"},
                          on_best=lambda step, values: seen.append((step, values)))
    keeper = BestKeeper(best, BestSoFar(), EarlyStopping())
    model, saved = tiny_classifier(), {}
    for step, score in scores.items():
        nudged(model, 0.01)
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
        assert keeper.observe(model, step, {"score": score, "other": 1.0}) is False
    assert_same_weights(weights_of(tmp_path / "best"), saved[best_step])  # step 3 did not replace step 2
    assert (tmp_path / "best" / "note.json").read_text() == "{}\n"
    assert [step for step, _ in seen] == [1, 2] and seen[1][1] == {"score": scores[2], "other": 1.0}
    assert (keeper.record.step, keeper.record.value, keeper.record.values) == \
        (best_step, scores[best_step], {"score": scores[best_step], "other": 1.0})
    assert keeper.record.stale == 1


def test_best_keeper_says_stop_after_patience_and_keeps_a_resumed_best(tmp_path):
    # A resumed run's best (0.9, step 4) is not replaced by worse evaluations; the stale count goes on.
    record = BestSoFar(step=4, value=0.9, values={"score": 0.9}, stale=1)
    keeper = BestKeeper(BestCheckpoint("score", False, tmp_path / "best"), record, EarlyStopping(patience=3))
    model = tiny_classifier()
    assert [keeper.observe(model, step, {"score": 0.5}) for step in (5, 6)] == [False, True]
    assert not (tmp_path / "best").exists() and (record.step, record.stale) == (4, 3)


def test_best_keeper_names_a_missing_metric(tmp_path):
    keeper = BestKeeper(BestCheckpoint("f1", False, tmp_path / "best"), BestSoFar(), EarlyStopping())
    with pytest.raises(ConfigError, match=r"'f1', which is not among the evaluation's values \['loss'\]"):
        keeper.observe(tiny_classifier(), 1, {"loss": 0.1})


# --- EMA of the weights ----------------------------------------------------------------------------------

def linear_with_frozen_bias() -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    layer.bias.requires_grad_(False)
    return layer


def test_weight_average_update_follows_the_decay():
    layer = linear_with_frozen_bias()
    ema = WeightAverage(layer, decay=0.75)
    assert ema.names == ["weight"]  # frozen parameters are not averaged
    start = layer.weight.detach().clone()
    with torch.no_grad():
        layer.weight.add_(1.0)
    ema.update()
    torch.testing.assert_close(ema.shadow[0], 0.75 * start + 0.25 * (start + 1.0), rtol=0, atol=1e-7)
    assert ema.shadow[0].dtype == torch.float32


def test_weight_average_applied_swaps_in_the_shadow_and_back_bitwise():
    layer = linear_with_frozen_bias()
    ema = WeightAverage(layer, decay=0.5)
    with torch.no_grad():
        layer.weight.mul_(3.0)
    ema.update()
    raw = layer.weight.detach().clone()
    with ema.applied() as copies:
        assert torch.equal(layer.weight, ema.shadow[0]) and torch.equal(copies[0], raw)
    assert torch.equal(layer.weight, raw)
    with averaged(None) as nothing:  # without EMA: the weights as they are
        assert nothing is None and torch.equal(layer.weight, raw)
    ema.finish()
    assert torch.equal(layer.weight, ema.shadow[0])


def test_weight_average_state_round_trips_and_refuses_another_model(tmp_path):
    layer = linear_with_frozen_bias()
    ema = WeightAverage(layer, decay=0.9)
    with torch.no_grad():
        layer.weight.add_(2.0)
    ema.update()
    state = ema.state_dict([layer.weight.detach().clone()])
    assert state["decay"] == 0.9 and set(state["shadow"]) == set(state["raw"]) == {"weight"}
    other = WeightAverage(linear_with_frozen_bias(), decay=0.9)
    other.load_shadow(state["shadow"], tmp_path)
    assert torch.equal(other.shadow[0], ema.shadow[0])
    with pytest.raises(CheckpointError, match=r"its EMA state lacks \['weight'\]"):
        other.load_shadow({"elsewhere": ema.shadow[0]}, tmp_path)


# --- FGM -------------------------------------------------------------------------------------------------

def embedding_with_grad(grad: torch.Tensor | None) -> nn.Parameter:
    weight = nn.Parameter(torch.full((2, 3), 0.1))
    weight.grad = grad
    return weight


def test_fgm_direction_is_epsilon_along_this_micro_batchs_gradient():
    earlier = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    own = torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 4.0]])
    weight = embedding_with_grad(earlier.clone())
    fgm = Fgm(weight, epsilon=0.5)
    fgm.remember()
    weight.grad += own  # this micro-batch's backward accumulates on top
    torch.testing.assert_close(fgm.direction(), 0.5 * own / 5.0, rtol=0, atol=1e-7)
    fresh = Fgm(embedding_with_grad(None), epsilon=0.5)
    fresh.remember()
    assert fresh.before is None and torch.count_nonzero(fresh.direction()) == 0


def test_fgm_perturb_then_restore_leaves_the_weights_bit_exact():
    weight = embedding_with_grad(None)
    fgm = Fgm(weight, epsilon=1.0)
    fgm.remember()
    weight.grad = torch.ones_like(weight)
    saved = weight.detach().clone()
    delta = fgm.direction()
    with fgm.perturbed():
        assert torch.equal(weight.detach(), saved + delta)
    assert torch.equal(weight.detach(), saved)
    assert not torch.equal((saved + delta) - delta, saved)  # subtracting the step back would drift
    with pytest.raises(RuntimeError, match="inside"), fgm.perturbed():
        raise RuntimeError("inside")
    assert torch.equal(weight.detach(), saved)  # restored on errors too


def test_fgm_finds_embeddings_by_get_input_embeddings():
    class WithAccessor(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(5, 3)

        def get_input_embeddings(self):
            return self.table

    model = WithAccessor()
    assert word_embedding_weight(model) is model.table.weight
    classifier = tiny_classifier()
    assert word_embedding_weight(classifier) is classifier.bert.embeddings.word.weight
    with pytest.raises(ConfigError, match=r"the model has none.*fgm_epsilon 0"):
        word_embedding_weight(nn.Linear(2, 2))


# --- R-Drop ----------------------------------------------------------------------------------------------

def test_rdrop_combine_means_the_passes_and_appends_the_consistency_term():
    rdrop = RDrop(alpha=2.0)
    sums, counts = rdrop.combine(torch.tensor([2.0, 4.0]), torch.tensor([4.0, 8.0]), torch.tensor([3.0, 5.0]),
                                 torch.tensor(1.5))
    assert sums.tolist() == [3.0, 6.0, 1.5] and counts.tolist() == [3.0, 5.0, 3.0]
    assert rdrop.counted(torch.tensor([7.0, 2.0])).tolist() == [7.0, 2.0, 7.0]


def test_rdrop_consistency_is_alpha_times_the_tasks_term_in_float32():
    logits_a, logits_b = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0, 1.0], [0.5, 0.5]])

    class SumOnly:
        def consistency(self, a, b, batch):
            return symmetric_kl(a, b).bfloat16()

    class SumAndCount:
        def consistency(self, a, b, batch):
            return symmetric_kl(a, b), torch.tensor(2.0)

    rdrop = RDrop(alpha=0.5)
    pair = rdrop.consistency(SumAndCount(), logits_a, logits_b, None)
    assert pair.dtype == torch.float32
    torch.testing.assert_close(pair, 0.5 * symmetric_kl(logits_a, logits_b))
    assert rdrop.consistency(SumOnly(), logits_a, logits_b, None).dtype == torch.float32
    assert float(rdrop.consistency(SumAndCount(), logits_a, logits_a, None)) == 0.0  # equal passes agree


# --- what a run can apply ----------------------------------------------------------------------------------

def test_check_recipes_names_what_a_recipe_needs():
    with pytest.raises(ConfigError, match=r"training\.patience=2 needs evaluations"):
        check_recipes(TrainingConfig(patience=2), Objective(), None, None)
    with pytest.raises(ConfigError, match=r"the WithoutConsistency objective defines no consistency term"):
        check_recipes(TrainingConfig(rdrop_alpha=1.0), WithoutConsistency(), None, None)
    check_recipes(TrainingConfig(patience=2, eval_every=1, rdrop_alpha=1.0), Objective(),
                  lambda model, step: {}, BestCheckpoint("score", False, "unused"))  # all it needs: no error


def test_describe_recipes_lists_the_recipes_that_are_on():
    assert describe_recipes(TrainingConfig(), tiny_classifier()) == []
    phrases = describe_recipes(TrainingConfig(patience=3, min_delta=0.01, fgm_epsilon=1.0, ema_decay=0.99,
                                              layer_lr_decay=0.5), tiny_classifier())
    assert phrases == ["early stopping after 3 evaluations without an improvement > 0.01",
                       "layer-wise lr decay 0.5 (head at lr, embeddings at lr x 0.125)",
                       "FGM adversarial training, epsilon 1",
                       "EMA of the weights, decay 0.99 (evaluated and saved: the average)"]

