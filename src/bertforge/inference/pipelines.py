"""Inference pipelines for any saved model directory: the directory read once (tokenizer, model, fine-tuning
record, sentence-transformers settings), one engine planned and built for it, and the pipeline of each route the
model serves made over that engine, sharing it.

Owns: `load_pipelines` / `load_pipeline` (a directory to its pipelines: the routes asked for, else every route
the model serves), `make_pipeline` (one route's pipeline over a loaded model), `supported_tasks` (the routes a
loaded model serves unless told otherwise) and `rerank_scores` (a `rerank` pipeline's relevance of each text to
a query). Which class runs a route: `family_pipelines.ROUTE_PIPELINES`, else `family_pipelines.Pipeline`; a
ColBERT model's `rerank` is `maxsim_reranking.MaxSimRerankPipeline` (its MaxSim, not a cross-encoder's head).

The pipelines themselves (their steps, windows, precision rule and bf16 contract) are `family_pipelines`; the
names of it that callers outside inference take from here (`Pipeline`, `EmbedPipeline`, `feature_tokens`, ...)
stay importable here, as do the wire inputs (`EmbedText`, `TruncatedInput`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import checkpoint_format
from bertforge.engine.build import DEFAULT_KIND, build_engine, plan_engine
from bertforge.errors import CheckpointError
from bertforge.families import registry
from bertforge.families.base import Family
from bertforge.inference.family_pipelines import (
    BF16_COSINE_TOLERANCE,
    DEFAULT_BATCH_SIZE,
    ROUTE_PIPELINES,
    TASKS,
    EmbedPipeline,
    Pipeline,
    check_task,
    feature_tokens,
    serves,
)
from bertforge.inference.maxsim_reranking import RERANK, MaxSimRerankPipeline, reranks_by_maxsim
from bertforge.inference.wire_inputs import EmbedText, TruncatedInput
from bertforge.model.bert import BertPretrainedModel
from bertforge.model.fast_paths import set_fast_paths
from bertforge.runtime import DEFAULT_PRECISION


def make_pipeline(task: str, model: BertPretrainedModel, tokenizer, **options: Any) -> Pipeline:
    """The pipeline for `task` (a route or transformers' name for it) over an already loaded model."""
    task = registry.route(task)
    check_task(task)
    if task in ROUTE_PIPELINES:
        return ROUTE_PIPELINES[task](model, tokenizer, **options)
    return Pipeline(task, model, tokenizer, **options)


def supported_tasks(model: BertPretrainedModel) -> list[str]:
    """The tasks a loaded model serves unless told otherwise, in `TASKS` order (always including embed): its
    class serves the family, which accepts its config and offers itself (rerank: a one-output classifier)."""
    def accepts(family: Family) -> bool:
        if family is registry.for_model(model):
            return True  # its own family: loading says what is missing, if anything
        try:
            family.check_model(model.config)
        except CheckpointError:
            return False
        return family.serves_by_default(model.config)

    return [task for task in TASKS if serves(type(model), registry.for_task(task)) and accepts(registry.for_task(task))]


def load_pipeline(model_dir: str | Path, task: str | None = None, **options: Any) -> Pipeline:
    """Load a model directory for one task.

    Args:
        model_dir: a saved model (config.json, weights, vocab.txt, tokenizer_config.json).
        task: one of `TASKS` or transformers' name for it ("ner", "feature-extraction", ...); None: the task
            of the model's own head (a bare encoder: embed).
        **options: `Pipeline` keyword arguments (device, precision, batch_size, max_length, doc_stride).

    Raises:
        CheckpointError: the directory lacks what the task needs (tokenizer, head, labels), naming it.
    """
    return next(iter(load_pipelines(model_dir, [task], **options).values()))


def load_pipelines(model_dir: str | Path, tasks: Sequence[str] | None = None, *, rerank_label: str | None = None,
                   **options: Any) -> dict[str, Pipeline]:
    """Every pipeline the model supports (or the `tasks` named; None among them: the model's own task),
    sharing one loaded model and its engine (planned before the model loads: a refused plan is refused first).
    `rerank_label`: also rerank, the relevance being the probability of this label (a two-label pair
    classifier, which reranks only when asked: `Reranking.scoring_by`)."""
    plan = plan_engine(options.pop("device", "auto"), options.pop("precision", DEFAULT_PRECISION),
                       options.pop("engine", DEFAULT_KIND), options.pop("threads", None))
    tasks = None if tasks is None else [registry.route(task) for task in tasks]
    for task in tasks or ():
        if task is not None:
            check_task(task)
    directory = checkpoint_format.read_directory(model_dir)
    if tasks is not None:
        tasks = [registry.own_task(directory) if task is None else task for task in tasks]
    named = registry.class_for_tasks(directory.architecture, tasks)
    late = reranks_by_maxsim(named)  # a ColBERT model reranks by MaxSim (`maxsim_reranking`)
    for task in tasks or ():
        family = registry.for_task(task)
        if not serves(named, family) and not (late and task == RERANK):
            raise CheckpointError(f"{model_dir}: config.json names architecture {directory.architecture or 'BertModel'}"
                                  f", but {task} needs a {family.model_class.__name__} checkpoint; use a model "
                                  f"fine-tuned for {task}, or task 'embed'")
    tokenizer = directory.require_tokenizer()
    model, report = registry.load_model(model_dir, named)
    engine = build_engine(set_fast_paths(model.to(plan.device).eval()), plan, model_dir)
    available = [task for task in supported_tasks(model) if engine.runs(registry.for_task(task))]
    if late:
        available = [task for task in TASKS if task in available or task == RERANK]
    chosen = list(tasks) if tasks else available
    reranking = registry.for_task("rerank")
    if rerank_label is not None and reranking.task not in chosen:
        chosen.append(reranking.task)
    for task in chosen:
        if not serves(type(model), registry.for_task(task)) and not (late and task == RERANK):
            raise CheckpointError(f"{model_dir}: a {type(model).__name__} cannot serve {task}; it supports "
                                  f"{available}")
    pipelines = {}
    for task in chosen:
        try:
            family = registry.for_task(task)
            if family is reranking and rerank_label is not None:
                family = reranking.scoring_by(rerank_label, model.config)
            if late and task == RERANK:
                pipelines[task] = MaxSimRerankPipeline(engine, tokenizer, record=directory.finetuning, report=report,
                                                       sentence=directory.sentence, **options)
                continue
            pipelines[task] = make_pipeline(task, engine, tokenizer, record=directory.finetuning, report=report,
                                            sentence=directory.sentence, family=family, **options)
        except CheckpointError as error:
            raise CheckpointError(f"{model_dir}: {error}") from None
    return pipelines


def rerank_scores(pipeline: Pipeline, query: str, texts: Sequence[str]) -> np.ndarray:
    """The `rerank` pipeline's relevance of each text to `query`, in the texts' order: float64 [N] (what
    `evaluation.embedding.evaluate_retrieval(rerank=...)` takes)."""
    ranked = pipeline({"query": query, "texts": list(texts)})["results"]
    scores = np.empty(len(texts))
    for item in ranked:
        scores[item["index"]] = item["score"]
    return scores


__all__ = [
    "BF16_COSINE_TOLERANCE", "DEFAULT_BATCH_SIZE", "EmbedPipeline", "EmbedText", "Pipeline", "TASKS",
    "TruncatedInput", "feature_tokens", "load_pipeline", "load_pipelines", "make_pipeline", "rerank_scores",
    "serves", "supported_tasks",
]
