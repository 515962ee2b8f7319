"""Fine-tuning runs: the named tasks, `FinetuneConfig` (its tables and validation), `describe` (config -> task
description), and each family's objective agreeing with its task model's own loss."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
import torch

from bertforge.configuration import load_config, shared_data_root
from bertforge.data.finetuning import FinetuneBatch
from bertforge.errors import ConfigError
from bertforge.families.classification import FAMILY as CLASSIFICATION
from bertforge.families.classification import BertForSequenceClassification, ClassificationObjective
from bertforge.families.multiple_choice import FAMILY as MULTIPLE_CHOICE
from bertforge.families.multiple_choice import BertForMultipleChoice, MultipleChoice
from bertforge.families.question_answering import FAMILY as QUESTION_ANSWERING
from bertforge.families.question_answering import BertForQuestionAnswering, QuestionAnswering
from bertforge.families.tagging import FAMILY as TAGGING
from bertforge.families.tagging import BertForTokenClassification, Tagging
from bertforge.families.task import TaskDescription
from bertforge.families.tasks import TASKS
from bertforge.model.config import BertConfig
from bertforge.training.config import TrainingConfig
from bertforge.training.finetune import check_metric
from bertforge.training.finetune_config import (
    TABLES,
    DataConfig,
    FeatureConfig,
    FinetuneConfig,
    FinetuneTrainingConfig,
    HeadConfig,
    describe,
    load_finetune_config,
)
from bertforge.training.finetune_config import data_root as task_data_root
from bertforge.training.finetune_results import summarize

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
    assert TASKS["cmrc2018"].language == "zh" and TASKS["squad"].inputs.max_seq_length == 384


# GLUE tasks whose official files ../shared/data does not hold; tests/unit/test_glue_tasks.py reads each of
# them from a fixture in its official layout, and the task table points at the standard GLUE paths.
NOT_IN_SHARED_DATA = {"mrpc", "qqp", "mnli", "mnli-mm", "qnli"}


@pytest.mark.skipif(not shared_data_root().is_dir(), reason="shared data directory not present")
def test_registry_files_exist_under_the_data_root():
    for name in TASKS:
        if name in NOT_IN_SHARED_DATA:
            continue
        spec = describe(FinetuneConfig(model="m", data=DataConfig(task=name)))
        for source in (*spec.train, *spec.dev, *spec.test):
            assert Path(source.path).is_file(), (name, source.path)


def data(**fields) -> FinetuneConfig:
    return FinetuneConfig(data=DataConfig(**fields))


def test_describe_named_tasks_overrides_and_generic_formats(tmp_path, monkeypatch):
    spec = describe(data(task="sst2", data_root=str(tmp_path)))
    assert spec.train[0].path == str(tmp_path / "glue/SST-2/train.tsv")
    monkeypatch.setenv("BERTFORGE_DATA", "/elsewhere")
    assert task_data_root(FinetuneConfig()) == Path("/elsewhere")
    spec = describe(data(task="rte", dev="my_dev.tsv"))
    assert spec.dev[0].path == "my_dev.tsv" and spec.labels == ("entailment", "not_entailment")
    pair = describe(data(format="pair", train="t.tsv"))
    reader = pair.reader
    assert pair.family is CLASSIFICATION and pair.kind == "single_label_classification"
    assert (reader.text_a_column, reader.text_b_column, reader.label_column) == ("text_a", "text_b", "label")
    assert describe(data(format="qa", train="t.json")).inputs.max_seq_length == 384
    assert describe(data(format="regression", train="t.tsv")).metrics == ("pearson", "spearman")
    # The config's reader settings win over the named task's; the task's fill in the rest.
    msra = describe(data(task="msra_ner", on_invalid="skip"))
    assert (msra.reader.separator, msra.reader.on_invalid, msra.reader.token_column) == ("", "skip", 0)
    assert describe(data(task="sst2", text_a_column="review")).reader.text_a_column == "review"
    with pytest.raises(ConfigError, match="--task NAME"):
        describe(FinetuneConfig())
    with pytest.raises(ConfigError, match="needs --train FILE"):
        describe(data(format="ner"))


def test_config_rejects_bad_values_naming_the_table_key_and_fix():
    with pytest.raises(ConfigError, match=r"finetune\.data\.task='sst3'.*choose one of"):
        DataConfig(task="sst3")
    with pytest.raises(ConfigError, match=r"finetune\.data\.format="):
        DataConfig(format="tagging")
    with pytest.raises(ConfigError, match=r"finetune\.features\.label_policy='last'.*use one of"):
        FeatureConfig(label_policy="last")
    with pytest.raises(ConfigError, match=r"finetune\.features\.max_seq_length=4.*at least 8"):
        FeatureConfig(max_seq_length=4)
    with pytest.raises(ConfigError, match=r"finetune\.head\.classifier_dropout=1\.5"):
        HeadConfig(classifier_dropout=1.5)
    with pytest.raises(ConfigError, match=r"finetune\.training\.lr=-1\.0.*positive learning rate"):
        FinetuneTrainingConfig(lr=-1.0)
    with pytest.raises(ConfigError, match=r"finetune\.seeds=\[\].*at least one seed"):
        FinetuneConfig(seeds=[])
    with pytest.raises(ConfigError, match=r"finetune\.data=.*DataConfig"):
        FinetuneConfig(data={"task": "sst2"})
    assert DataConfig(separator="none").separator == ""


def test_config_defaults_are_the_papers_and_tables_hold_plain_values():
    config = FinetuneConfig()
    training = config.training
    assert isinstance(training, TrainingConfig)
    assert (training.epochs, training.batch_size, training.lr, training.warmup_ratio, training.weight_decay) == (
        3.0, 32, 5e-5, 0.1, 0.01)
    assert (training.schedule, training.out_dir, training.eval_every) == ("linear", "runs/finetune", 0)
    assert (config.features.max_query_length, config.features.doc_stride, config.eval_batch_size) == (64, None, 64)
    # Every key of every table is a plain value or a list of them: one command-line option each.
    plain = {str, int, float, bool, type(None)}
    hints = {name: hint for cls in (FinetuneConfig, *TABLES.values())
             for name, hint in typing.get_type_hints(cls).items() if name not in TABLES}
    for name, hint in hints.items():
        parts = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        for part in parts:
            inner = typing.get_args(part) if typing.get_origin(part) is list else (part,)
            # A Literal of plain values (fused_adamw's "auto") is a plain value too.
            inner = [type(v) for t in inner for v in typing.get_args(t)] if typing.get_origin(part) is typing.Literal \
                else inner
            assert all(t in plain for t in inner), name
    # Every field declares its help text (the CLI's --help shows it).
    for cls in (FinetuneConfig, *TABLES.values()):
        if cls is not FinetuneTrainingConfig:
            assert all(f.metadata.get("help") for f in dataclasses.fields(cls) if f.name not in TABLES), cls


def test_config_partial_training_table_keeps_the_finetuning_defaults(tmp_path):
    # A run file's [training] table with one key: the other keys keep fine-tuning's defaults, not the loop's.
    config = load_config(FinetuneConfig, values={"training": {"lr": 2e-5}, "data": {"task": "sst2"}})
    assert (config.training.lr, config.training.epochs, config.training.out_dir) == (2e-5, 3.0, "runs/finetune")
    assert config.data.task == "sst2" and config.features == FeatureConfig()


def test_load_finetune_config_reads_run_files_and_overrides(tmp_path):
    nested = tmp_path / "nested.toml"
    nested.write_text('model = "m"\n[data]\ntask = "rte"\n[features]\nmax_seq_length = 64\n'
                      '[head]\nfeature_layers = [-1, -2]\n[training]\nlr = 2e-5\nepochs = 2\n')
    config = load_finetune_config(nested)
    assert config == load_config(FinetuneConfig, nested)
    assert (config.data.task, config.features.max_seq_length, config.head.feature_layers) == ("rte", 64, [-1, -2])
    assert (config.training.lr, config.training.epochs, config.training.batch_size) == (2e-5, 2.0, 32)
    changed = load_finetune_config(nested, ["--training.lr=1e-5", "training.seed=7", "data.text_a_column=sentence1"])
    assert (changed.training.lr, changed.training.seed, changed.data.text_a_column) == (1e-5, 7, "sentence1")
    with pytest.raises(ConfigError, match=r"unknown key 'training\.no_such_key'"):
        load_finetune_config(nested, ["training.no_such_key=1"])
    with pytest.raises(ConfigError, match=r"finetune\.training\.lr=-1\.0"):
        load_finetune_config(None, ["training.lr=-1.0"])


def test_load_finetune_config_names_the_table_of_a_key_given_at_the_top_level(tmp_path):
    # One name per setting: `lr` at the top level is refused, with where it belongs.
    flat = tmp_path / "flat.toml"
    flat.write_text('model = "m"\nlr = 2e-5\n')
    with pytest.raises(ConfigError, match=r"flat\.toml: unknown key 'lr' at the top level; it belongs in its table: "
                       r"training\.lr"):
        load_finetune_config(flat)
    with pytest.raises(ConfigError, match=r"unknown key 'no_such_key' at the top level; top-level keys"):
        load_finetune_config(None, ["no_such_key=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'modle' at the top level \(did you mean 'model'\?\)"):
        load_finetune_config(None, ["modle=x"])


def test_summarize():
    stats = summarize([0.8, 0.9, 1.0])
    assert stats["mean"] == pytest.approx(0.9) and stats["std"] == pytest.approx(0.1) and stats["n"] == 3
    assert summarize([0.5])["std"] == 0.0


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
    task = Tagging().training.objective_for(model.config)
    assert task.counts(b)["cross_entropy"].item() == 3
    torch.testing.assert_close(total_loss(task, output, b), model(**b.model_inputs(), labels=labels).loss)


def test_qa_adapter_matches_model_loss():
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny()).eval()
    b = batch((3, 7), start_positions=torch.tensor([0, 3, 5]), end_positions=torch.tensor([0, 4, 6]))
    output = model(**b.model_inputs())
    reference = model(**b.model_inputs(), start_positions=b.start_positions, end_positions=b.end_positions).loss
    torch.testing.assert_close(total_loss(QuestionAnswering().training.objective_for(model.config), output, b), reference)


def test_choice_adapter_matches_model_loss():
    torch.manual_seed(0)
    model = BertForMultipleChoice(tiny()).eval()
    b = batch((2, 3, 5), labels=torch.tensor([2, 0]))
    output = model(**b.model_inputs())
    task = MultipleChoice().training.objective_for(model.config)
    torch.testing.assert_close(total_loss(task, output, b), model(**b.model_inputs(), labels=b.labels).loss)
    assert task.metrics(output, b)["accuracy"][1].item() == 2


def test_metric_names_per_family():
    def task(family, kind=None, **kw):
        return TaskDescription("t", family, kind, **kw)

    assert CLASSIFICATION.metric_names(task(CLASSIFICATION, "single_label_classification")) == (
        "accuracy", "f1", "precision", "recall", "macro_f1", "macro_precision", "macro_recall", "mcc")
    assert CLASSIFICATION.metric_names(task(CLASSIFICATION, "regression")) == ("pearson", "spearman", "mse")
    assert TAGGING.metric_names(task(TAGGING)) == ("f1", "precision", "recall", "invalid_span_share")
    assert CLASSIFICATION.metric_names(task(CLASSIFICATION, "multi_label_classification"))[0] == "micro_f1"
    assert MULTIPLE_CHOICE.metric_names(task(MULTIPLE_CHOICE)) == ("accuracy",)
    qa = task(QUESTION_ANSWERING)
    answerable = [types.SimpleNamespace(is_impossible=False)]
    assert QUESTION_ANSWERING.metric_names(qa, answerable) == ("exact_match", "f1")
    v2 = qa.replace(options={**qa.options, "version_2_with_negative": True})
    assert QUESTION_ANSWERING.metric_names(v2, answerable) == ("exact_match", "f1", "HasAns_exact", "HasAns_f1")
    assert QUESTION_ANSWERING.metric_names(v2, [*answerable, types.SimpleNamespace(is_impossible=True)])[-2:] == (
        "NoAns_exact", "NoAns_f1")
    assert QUESTION_ANSWERING.metric_names(qa, None)[-1] == "NoAns_f1"  # any dev set of the task
    for name in ("sst2", "cola", "stsb", "conll2003", "squad"):  # every named task's metrics are reported
        assert set(TASKS[name].metrics) <= set(TASKS[name].family.metric_names(TASKS[name], None)), name


def test_check_metric_rejects_unknown_names_with_the_valid_ones():
    check_metric(TASKS["stsb"].replace(metric="mse"), None)
    with pytest.raises(ConfigError, match=r"finetune.metric='acuracy' is invalid \(did you mean 'accuracy'\?\): "
                       r"sst2 \(classification\) evaluations report \['accuracy', 'f1'"):
        check_metric(TASKS["sst2"].replace(metric="acuracy"), None)
    with pytest.raises(ConfigError, match=r"'bogus' is invalid: conll2003 \(tagging\) evaluations report "
                       r"\['f1', 'precision', 'recall', 'invalid_span_share'\]"):
        check_metric(TASKS["conll2003"].replace(metric="bogus"), None)


def test_config_finetuning_checkpoints_every_epoch_and_keeps_two():
    training = FinetuneConfig().training
    assert (training.save_every, training.keep_last) == (0, 2)  # 0: every epoch (run_finetuning)
