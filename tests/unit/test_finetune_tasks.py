"""Fine-tuning runs: the task registry, `FinetuneConfig` validation, and the task adapters' loss sums and
counts agreeing with each task model's own loss."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
import torch

from bertforge.configuration import shared_data_root
from bertforge.data.finetuning import FinetuneBatch
from bertforge.errors import ConfigError
from bertforge.families.classification import BertForSequenceClassification, ClassificationObjective
from bertforge.families.multiple_choice import BertForMultipleChoice, MultipleChoice
from bertforge.families.question_answering import BertForQuestionAnswering, QuestionAnswering
from bertforge.families.tagging import BertForTokenClassification, Tagging
from bertforge.model.config import BertConfig
from bertforge.training.finetuning import (
    TASKS,
    FinetuneConfig,
    better,
    data_root,
    resolve_task,
    summarize,
)

REQUIRED_TASKS = {"sst2", "cola", "stsb", "rte", "wnli", "conll2003", "squad", "chnsenticorp", "afqmc", "lcqmc",
                  "msra_ner", "cmrc2018", "drcd"}


def tiny(**overrides) -> BertConfig:
    return BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=20, max_position_embeddings=32, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, **overrides)


def batch(shape, **fields) -> FinetuneBatch:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 50, shape, generator=generator)
    return FinetuneBatch(input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids),
                         torch.arange(shape[0]), **fields)


def total_loss(task, output, b) -> torch.Tensor:
    terms = task.loss_terms(output, b)
    counts = task.counts(b)
    assert set(terms) == set(counts)
    return sum(terms[name][0] / counts[name] for name in terms)


def test_registry_has_every_named_task_with_metrics():
    assert REQUIRED_TASKS <= set(TASKS)
    assert TASKS["cola"].metrics[0] == "mcc" and TASKS["stsb"].metrics == ("pearson", "spearman")
    assert TASKS["conll2003"].metrics[0] == "f1" and TASKS["squad"].metrics == ("f1", "exact_match")
    assert TASKS["cmrc2018"].language == "zh" and TASKS["squad"].max_seq_length == 384


@pytest.mark.skipif(not shared_data_root().is_dir(), reason="shared data directory not present")
def test_registry_files_exist_under_the_data_root():
    config = FinetuneConfig(model="m")
    for name in TASKS:
        spec = resolve_task(dataclasses.replace(config, task=name))
        for source in (*spec.train, *spec.dev, *spec.test):
            assert Path(source.path).is_file(), (name, source.path)


def test_resolve_task_overrides_and_generic_formats(tmp_path, monkeypatch):
    spec = resolve_task(FinetuneConfig(task="sst2", data_root=str(tmp_path)))
    assert spec.train[0].path == str(tmp_path / "glue/SST-2/train.tsv")
    monkeypatch.setenv("BERTFORGE_DATA", "/elsewhere")
    assert data_root(FinetuneConfig()) == Path("/elsewhere")
    spec = resolve_task(FinetuneConfig(task="rte", dev="my_dev.tsv"))
    assert spec.dev[0].path == "my_dev.tsv" and spec.labels == ("entailment", "not_entailment")
    pair = resolve_task(FinetuneConfig(format="pair", train="t.tsv"))
    assert (pair.family, pair.text_a, pair.text_b, pair.label) == ("classification", "text_a", "text_b", "label")
    assert resolve_task(FinetuneConfig(format="qa", train="t.json")).max_seq_length == 384
    with pytest.raises(ConfigError, match="--task NAME"):
        resolve_task(FinetuneConfig())
    with pytest.raises(ConfigError, match="needs --train FILE"):
        resolve_task(FinetuneConfig(format="ner"))


def test_config_rejects_bad_values_naming_the_field():
    with pytest.raises(ConfigError, match=r"finetune\.task='sst3'.*choose one of"):
        FinetuneConfig(task="sst3")
    with pytest.raises(ConfigError, match=r"finetune\.format="):
        FinetuneConfig(format="tagging")
    with pytest.raises(ConfigError, match="label_policy"):
        FinetuneConfig(label_policy="last")
    assert FinetuneConfig(separator="none").separator == ""


def test_config_defaults_are_the_papers_and_fields_are_cli_friendly():
    config = FinetuneConfig()
    assert (config.epochs, config.batch_size, config.lr, config.warmup_ratio) == (3.0, 32, 5e-5, 0.1)
    training = config.training_config("out", eval_every=10)
    assert training.schedule == "linear" and training.eval_every == 10 and training.lr == 5e-5
    # Every field is a plain value or a list of them: one command-line option each.
    plain = {str, int, float, bool, type(None)}
    for name, hint in typing.get_type_hints(FinetuneConfig).items():
        parts = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        for part in parts:
            inner = typing.get_args(part) if typing.get_origin(part) is list else (part,)
            assert all(t in plain for t in inner), name


def test_summarize_and_better():
    stats = summarize([0.8, 0.9, 1.0])
    assert stats["mean"] == pytest.approx(0.9) and stats["std"] == pytest.approx(0.1) and stats["n"] == 3
    assert summarize([0.5])["std"] == 0.0
    assert better("accuracy", 0.9, 0.8) and not better("accuracy", 0.7, 0.8) and better("mse", 0.1, 0.2)


# --- task adapters agree with the models' own losses ------------------------------------------------------

def test_classification_adapter_matches_model_loss():
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny(id2label={0: "a", 1: "b", 2: "c"})).eval()
    b = batch((4, 6), labels=torch.tensor([0, 2, 1, 2]))
    output = model(**b.model_inputs())
    reference = model(**b.model_inputs(), labels=b.labels).loss
    task = ClassificationObjective("single_label_classification")
    torch.testing.assert_close(total_loss(task, output, b), reference)
    correct, count = task.metrics(output, b)["accuracy"]
    assert count.item() == 4 and 0 <= correct.item() <= 4


def test_regression_adapter_matches_model_loss():
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny(problem_type="regression")).eval()
    b = batch((3, 5), labels=torch.tensor([0.5, 4.0, 2.0]))
    output = model(**b.model_inputs())
    reference = model(**b.model_inputs(), labels=b.labels).loss
    torch.testing.assert_close(total_loss(ClassificationObjective("regression"), output, b), reference)


def test_token_adapter_counts_labelled_tokens_only():
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny(id2label={0: "O", 1: "B-X"})).eval()
    labels = torch.tensor([[-100, 1, 0, -100], [-100, 0, -100, -100]])
    b = batch((2, 4), labels=labels)
    output = model(**b.model_inputs())
    task = Tagging()
    assert task.counts(b)["cross_entropy"].item() == 3
    torch.testing.assert_close(total_loss(task, output, b), model(**b.model_inputs(), labels=labels).loss)


def test_qa_adapter_matches_model_loss():
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny()).eval()
    b = batch((3, 7), start_positions=torch.tensor([0, 3, 5]), end_positions=torch.tensor([0, 4, 6]))
    output = model(**b.model_inputs())
    reference = model(**b.model_inputs(), start_positions=b.start_positions, end_positions=b.end_positions).loss
    torch.testing.assert_close(total_loss(QuestionAnswering(), output, b), reference)


def test_choice_adapter_matches_model_loss():
    torch.manual_seed(0)
    model = BertForMultipleChoice(tiny()).eval()
    b = batch((2, 3, 5), labels=torch.tensor([2, 0]))
    output = model(**b.model_inputs())
    task = MultipleChoice()
    torch.testing.assert_close(total_loss(task, output, b), model(**b.model_inputs(), labels=b.labels).loss)
    assert task.metrics(output, b)["accuracy"][1].item() == 2
