"""The family registry: name or alias -> family, architecture -> model class, and loading by architecture.

Every consumer that needs "which family is this?" asks here, once, and then talks to the family object:
the fine-tuning run (`--task`/`family`), `evaluate` and `predict` (the architecture in config.json), the
pipelines and the server (a route name such as "tag"), export (output axes) and the CLI's choices.
"""

from __future__ import annotations

import os
from typing import Any

from bertforge import checkpoint_format
from bertforge.checkpoint_format import LoadReport, ModelDirectory
from bertforge.errors import CheckpointError, ConfigError
from bertforge.families.base import Family
from bertforge.families.classification import FAMILY as CLASSIFICATION
from bertforge.families.colbert import FAMILY as COLBERT
from bertforge.families.colbert import ModernBertForColBERT
from bertforge.families.embedding import FAMILY as EMBEDDING
from bertforge.families.embedding import BertForSentenceEmbedding, ModernBertForSentenceEmbedding
from bertforge.families.multiple_choice import FAMILY as MULTIPLE_CHOICE
from bertforge.families.multiple_choice import ModernBertForMultipleChoice
from bertforge.families.pretraining import FAMILY as PRETRAINING
from bertforge.families.pretraining import BertForMaskedLM
from bertforge.families.question_answering import FAMILY as QUESTION_ANSWERING
from bertforge.families.question_answering import ModernBertForQuestionAnswering
from bertforge.families.reranking import FAMILY as RERANKING
from bertforge.families.sparse import FAMILY as SPARSE_EMBEDDING
from bertforge.families.sparse import ModernBertForSparseEmbedding
from bertforge.families.tagging import FAMILY as TAGGING
from bertforge.families.tagging import ModernBertForTokenClassification
from bertforge.model.bert import BertModel, BertPretrainedModel
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.model.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertModel,
    ModernBertPretrainedModel,
)

# Embedding is last: its model class (`BertModel`) is the most general, so `for_model` finds a task model's
# own family first. Reranking runs a classification model (after classification, which `for_model` finds).
FAMILIES: tuple[Family, ...] = (CLASSIFICATION, TAGGING, QUESTION_ANSWERING, MULTIPLE_CHOICE, PRETRAINING,
                                RERANKING, SPARSE_EMBEDDING, COLBERT, EMBEDDING)
FINETUNING_FAMILIES: tuple[Family, ...] = (CLASSIFICATION, TAGGING, QUESTION_ANSWERING, MULTIPLE_CHOICE,
                                           RERANKING, SPARSE_EMBEDDING, COLBERT, EMBEDDING)


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


_BY_NAME: dict[str, Family] = {}
for _family in FAMILIES:
    for _name in (_family.name, *_family.aliases):
        if _key(_name) in _BY_NAME:
            raise RuntimeError(f"family name {_name!r} is declared twice")  # a programming error, at import
        _BY_NAME[_key(_name)] = _family
_BY_TASK: dict[str, Family] = {f.task: f for f in FAMILIES if f.task}
# BertForMaskedLM (MLM-only pretraining) is a BertForPretraining without NSP head: the pretraining family's too.
MODEL_CLASSES: dict[str, type[BertPretrainedModel]] = {
    "BertModel": BertModel, **{f.model_class.__name__: f.model_class for f in FAMILIES},
    "BertForMaskedLM": BertForMaskedLM,
    # ModernBERT directories (config.json's model_type "modernbert"): the encoder and its task models.
    **{cls.__name__: cls for cls in (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
                                     ModernBertForTokenClassification, ModernBertForSparseEmbedding,
                                     ModernBertForColBERT, ModernBertForQuestionAnswering,
                                     ModernBertForMultipleChoice)}}
# The pipeline routes, in a fixed order: one per family, `embed` (which any model's encoder serves) last.
TASKS: tuple[str, ...] = tuple(f.task for f in FAMILIES if f.task)


def family(name: str) -> Family:
    """The family called `name` or one of its aliases ("ner", "tag", "token classification" ...)."""
    found = _BY_NAME.get(_key(name)) if isinstance(name, str) else None
    if found is None:
        raise ConfigError(f"unknown task family {name!r}; choose one of {names()} (aliases: "
                          f"{sorted(a for f in FAMILIES for a in f.aliases)})")
    return found


def names() -> list[str]:
    return [f.name for f in FAMILIES]


# transformers' pipeline task names, accepted for our routes (`route`).
TASK_ALIASES: dict[str, str] = {
    "feature-extraction": "embed", "sentence-similarity": "embed", "sentiment-analysis": "classify",
    "text-classification": "classify", "ner": "tag", "token-classification": "tag",
    "question-answering": "answer", "multiple-choice": "choose"}


def route(task: str) -> str:
    """Our route for a task name: a route itself, or transformers' name for it ("ner" -> "tag")."""
    return TASK_ALIASES.get(task, task) if isinstance(task, str) else task


def own_task(directory: ModelDirectory) -> str:
    """The route a saved model serves when no task is named: its family's (`for_directory`)."""
    return for_directory(directory).task


def for_task(task: str) -> Family:
    """The family behind a pipeline route ("classify", "tag", "answer", "choose", "fill-mask", "embed")."""
    if task not in _BY_TASK:
        raise ConfigError(f"unknown task {task!r}; choose one of {list(TASKS)} (or transformers' names: "
                          f"{sorted(TASK_ALIASES)})")
    return _BY_TASK[task]


# ModernBERT's classes -> the family that serves them (their heads are ModernBERT's, their features,
# decoders and metrics the family's).
MODERNBERT_FAMILIES: dict[type[BertPretrainedModel], Family] = {
    ModernBertForSequenceClassification: CLASSIFICATION, ModernBertForTokenClassification: TAGGING,
    ModernBertForQuestionAnswering: QUESTION_ANSWERING, ModernBertForMultipleChoice: MULTIPLE_CHOICE,
    ModernBertForMaskedLM: PRETRAINING, ModernBertForSparseEmbedding: SPARSE_EMBEDDING,
    ModernBertForColBERT: COLBERT, ModernBertModel: EMBEDDING}
# The classes fine-tuning trains (a family's `training.trained_class`, BERT's) -> ModernBERT's, where they
# differ from the class the family serves with.
MODERNBERT_TRAINED: dict[type[BertPretrainedModel], type[BertPretrainedModel]] = {
    BertForSentenceEmbedding: ModernBertForSentenceEmbedding}


def runs(cls: type[BertPretrainedModel], family: Family) -> bool:
    """Whether models of class `cls` run `family` with their own head: they are its model class (BERT's), or the
    ModernBERT class of that class (a ModernBERT sequence classifier runs classification and, as BERT's does,
    reranking)."""
    if issubclass(cls, family.model_class):
        return True
    return any(issubclass(cls, modern) and found.model_class is family.model_class
               for modern, found in MODERNBERT_FAMILIES.items())


def counterpart(cls: type[BertPretrainedModel], config: Any) -> type[BertPretrainedModel]:
    """The class a family asks for (BERT's), for a directory of `config`: a ModernBERT directory gets the
    ModernBERT class its family runs (its heads), any other the class itself."""
    if not isinstance(config, ModernBertConfig) or issubclass(cls, ModernBertPretrainedModel):
        return cls
    if cls in MODERNBERT_TRAINED:
        return MODERNBERT_TRAINED[cls]
    wanted = for_model(cls)
    for modern, found in MODERNBERT_FAMILIES.items():
        if found is wanted:
            return modern
    raise ConfigError(f"the {wanted.name} family has no ModernBERT model yet; ModernBERT directories serve "
                      f"{sorted(f.name for f in MODERNBERT_FAMILIES.values())}")


def for_model(model: Any) -> Family:
    """The family of a model instance or class: a task model's own, embedding for a bare `BertModel`."""
    cls = model if isinstance(model, type) else type(model)
    for modern, found in MODERNBERT_FAMILIES.items():
        if issubclass(cls, modern):
            return found
    for candidate in FAMILIES:
        if issubclass(cls, candidate.model_class):
            return candidate
    raise ConfigError(f"no task family holds a {cls.__name__}; bertforge has {sorted(MODEL_CLASSES)}")


def for_directory(directory: ModelDirectory) -> Family:
    """The family of a saved model: its architecture's, unless its fine-tuning record names another family
    with the same model class (a reranker fine-tuned on lists is a one-output `BertForSequenceClassification`, or
    `ModernBertForSequenceClassification`, whose record says reranking: it is scored as a reranker)."""
    cls = model_class(directory.architecture)
    found = for_model(cls)
    named = (directory.finetuning or {}).get("family")
    other = _BY_NAME.get(_key(named)) if isinstance(named, str) else None
    if other is not None and other is not found and runs(cls, other):
        return other
    return found


def model_class(architecture: str | None) -> type[BertPretrainedModel]:
    """The class a config.json's architecture names (our spelling; None = BertModel)."""
    if architecture is None:
        return BertModel
    try:
        return MODEL_CLASSES[architecture]
    except KeyError:
        raise CheckpointError(f"unknown architecture {architecture!r}; bertforge has {sorted(MODEL_CLASSES)}") from None


def class_for_tasks(architecture: str | None, tasks: Any) -> type[BertPretrainedModel]:
    """The class to load a directory as for the routes `tasks` (None: the model's own): the class its
    architecture names, except that a masked-LM checkpoint (BERT's or ModernBERT's) asked only for sparse vectors
    loads as the sparse family's model of its encoder (its MLM head is SPLADE's; text-embeddings-inference serves
    /embed_sparse from one too)."""
    named = model_class(architecture)
    if tasks and set(tasks) == {SPARSE_EMBEDDING.task}:
        if issubclass(named, PRETRAINING.model_class):
            return SPARSE_EMBEDDING.model_class
        if issubclass(named, ModernBertForMaskedLM):  # its head and tied decoder, with SPLADE pooling
            return ModernBertForSparseEmbedding
    return named


def load_model(path: str | os.PathLike | ModelDirectory, cls: type[BertPretrainedModel] | None = None, *,
               fast_path: bool = True, **kwargs: Any) -> tuple[BertPretrainedModel, LoadReport]:
    """Load a model directory (a path, or a directory already read) into `cls` (default: the class its
    config.json names), fast paths on.

    Returns (model, report); see `checkpoint_format.load_model` for the keyword arguments. `fast_path=False`
    gives the plain reference path (padded, unfused), as `from_pretrained(..., fast_path=False)` does (a
    freshly built `BertModel` starts unpadded, so "leave it alone" would not be the plain path).
    """
    if cls is None:
        architecture = path.architecture if isinstance(path, ModelDirectory) else \
            checkpoint_format.read_config(path, step=kwargs.get("step"))[1]
        cls = model_class(architecture)
    else:
        config = path.config if isinstance(path, ModelDirectory) else \
            checkpoint_format.read_config(path, step=kwargs.get("step"))[0]
        cls = counterpart(cls, config)
    model, report = checkpoint_format.load_model(path, cls, **kwargs)
    set_fast_paths(model, unpad=fast_path, fused_qkv=fast_path)
    return model, report


def formats() -> dict[str, tuple[Family, str | None]]:
    """Every `--format` a fine-tuning run may read: name -> (its family, the problem kind it gives)."""
    return {name: (f, kind) for f in FINETUNING_FAMILIES for name, kind in f.formats.items()}
