"""The named tasks: GLUE, CoNLL-2003, SQuAD and the Chinese sets, each one `TaskDescription` value (data,
not code) whose sources are relative to the data root (`--data-root`, default $BERTFORGE_DATA, else
../shared/data; docs/data.md says where each set comes from and the layout expected).
"""

from __future__ import annotations

from bertforge.families.base import REGRESSION, SINGLE_LABEL, InputSettings
from bertforge.families.classification import FAMILY as CLASSIFICATION
from bertforge.families.classification import REGRESSION_DEFAULTS
from bertforge.families.question_answering import FAMILY as QUESTION_ANSWERING
from bertforge.families.tagging import FAMILY as TAGGING
from bertforge.families.task import DataSource, TaskDescription, reader_settings


def _glue(name: str, folder: str, text_a, label, text_b=None, header=None, dev: str = "dev.tsv",
          kind: str = SINGLE_LABEL, **kwargs) -> TaskDescription:
    return TaskDescription(name, CLASSIFICATION, kind, (DataSource(f"glue/{folder}/train.tsv"),),
                           (DataSource(f"glue/{folder}/{dev}"),),
                           reader=reader_settings(text_a_column=text_a, text_b_column=text_b, label_column=label,
                                          header=header), **kwargs)


def _pairs(name: str, train: str, dev: str, *, language: str = "zh", note: str = "") -> TaskDescription:
    """A Chinese sentence-pair file without a header: text, text, label."""
    return TaskDescription(name, CLASSIFICATION, SINGLE_LABEL, (DataSource(train),), (DataSource(dev),),
                           reader=reader_settings(text_a_column=0, text_b_column=1, label_column=2, header=False),
                           labels=("0", "1"), metrics=("accuracy",), language=language, note=note)


def _qa_split(name: str, path: str, extra_train: tuple[DataSource, ...] = (), **kwargs) -> TaskDescription:
    return TaskDescription(name, QUESTION_ANSWERING, None, (DataSource(path, "train"), *extra_train),
                           (DataSource(path, "eval"),), inputs=InputSettings(max_seq_length=384),
                           metrics=("f1", "exact_match"), **kwargs)


def _entity_tags(*types: str) -> tuple[str, ...]:
    """A NER task's complete BIO tag set, so a run on a few sentences still has every tag."""
    return ("O", *(f"{prefix}-{kind}" for prefix in "BI" for kind in types))


# MNLI's columns by header name: train.tsv has 12 (... sentence1 sentence2 label1 gold_label), dev_matched.tsv
# and dev_mismatched.tsv 16 (... label1 ... label5 gold_label); `gold_label` is the label in both.
_MNLI = {"text_a": "sentence1", "text_b": "sentence2", "label": "gold_label",
         "labels": ("contradiction", "entailment", "neutral"), "metrics": ("accuracy",)}

TASKS: dict[str, TaskDescription] = {task.name: task for task in (
    _glue("sst2", "SST-2", "sentence", "label", labels=("0", "1"), metrics=("accuracy",)),
    _glue("cola", "CoLA", 3, 1, header=False, labels=("0", "1"), metrics=("mcc", "accuracy")),
    _glue("stsb", "STS-B", "sentence1", -1, text_b="sentence2", header=True, kind=REGRESSION,
          metrics=REGRESSION_DEFAULTS),
    _glue("rte", "RTE", "sentence1", "label", text_b="sentence2", labels=("entailment", "not_entailment"),
          metrics=("accuracy",)),
    _glue("wnli", "WNLI", "sentence1", "label", text_b="sentence2", labels=("0", "1"), metrics=("accuracy",)),
    _glue("mrpc", "MRPC", "#1 String", "Quality", text_b="#2 String", labels=("0", "1"), metrics=("f1", "accuracy"),
          note="header `Quality #1 ID #2 ID #1 String #2 String`, UTF-8 BOM, CRLF"),
    _glue("qqp", "QQP", "question1", "is_duplicate", text_b="question2", labels=("0", "1"),
          metrics=("f1", "accuracy"),
          note="header `id qid1 qid2 question1 question2 is_duplicate`; the official train.tsv has a few rows "
               "with missing columns: pass --on-invalid skip (`bertforge glue` does, counted)"),
    _glue("mnli", "MNLI", dev="dev_matched.tsv", **_MNLI,
          note="evaluates on dev_matched.tsv (`mnli-mm`: dev_mismatched.tsv)"),
    _glue("mnli-mm", "MNLI", dev="dev_mismatched.tsv", **_MNLI,
          note="MNLI's training set, evaluated (and the best checkpoint picked) on dev_mismatched.tsv"),
    _glue("qnli", "QNLI", "question", "label", text_b="sentence", labels=("entailment", "not_entailment"),
          metrics=("accuracy",)),
    TaskDescription("conll2003", TAGGING, None, (DataSource("conll2003/train.txt"),),
                    (DataSource("conll2003/valid.txt"),), reader=reader_settings(),
                    labels=_entity_tags("LOC", "MISC", "ORG", "PER"), metrics=("f1", "precision", "recall")),
    TaskDescription("msra_ner", TAGGING, None, (DataSource("msra_ner/train.tsv", "train"),),
                    (DataSource("msra_ner/train.tsv", "eval"),), (DataSource("msra_ner/test.tsv"),),
                    reader=reader_settings(separator=""), language="zh", labels=_entity_tags("LOC", "ORG", "PER"),
                    metrics=("f1", "precision", "recall"),
                    note="no official dev split: every 20th training sentence is held out as dev"),
    _qa_split("squad", "squad_v1.1/dev-v1.1.json",
              note="only the v1.1 dev file is available: articles 3, 7, 11, ... (12 of 48) are eval, 36 train"),
    _qa_split("cmrc2018", "cmrc2018/cmrc2018_dev.json", (DataSource("cmrc2018/cmrc2018_trial.json"),),
              language="zh", note="no train file: trial + 3/4 of the dev articles train, the other 1/4 is eval"),
    _qa_split("drcd", "drcd/DRCD_dev.json", language="zh",
              note="no train file: 3/4 of the dev articles train, every 4th article is eval"),
    TaskDescription("chnsenticorp", CLASSIFICATION, SINGLE_LABEL, (DataSource("chnsenticorp/train.tsv"),),
                    (DataSource("chnsenticorp/dev.tsv"),), reader=reader_settings(text_a_column="text_a", label_column="label"),
                    labels=("0", "1"), metrics=("accuracy",), language="zh"),
    _pairs("afqmc", "afqmc/train.txt", "afqmc/dev.txt"),
    _pairs("lcqmc", "lcqmc/dev.txt", "lcqmc/test.txt",
           note="the LCQMC train file is not available: trains on dev.txt, evaluates on test.txt"),
)}
