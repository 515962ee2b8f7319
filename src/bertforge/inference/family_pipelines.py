"""The pipeline classes: raw inputs in, plain JSON-ready results out, over a loaded model (`pipelines` loads a
saved model directory into them).

Owns: `Pipeline` (one family route's path: `classify`, `tag`, `answer`, `choose`, `fill-mask`, ...; see
`families.registry`), `EmbedPipeline` (the `embed` route: the embedding family, which any model's encoder
serves, adding `encode`, numpy vectors), `ROUTE_PIPELINES` (the routes a subclass runs), the rules a pipeline
is built by (`check_task`, `serves`, `saved_task`, `input_settings`), what a window costs the server's token
budgets (`feature_tokens`) and the bf16 contract (`BF16_PROBABILITY_TOLERANCE`, `BF16_COSINE_TOLERANCE`).
A ColBERT model's `rerank` subclasses `Pipeline` in `maxsim_reranking`.

A pipeline is the family's one path from input to answer, the same that `bertforge evaluate` takes:

1. `family.parse` validates every input (a string or a JSON object) into an example,
2. `family.features` builds the windows, with the input settings the model was fine-tuned with (its
   `finetuning.json`: max_seq_length, doc_stride, ...), so predict windows exactly as evaluate does,
3. the pipeline's engine (`engine.build.build_engine`, built once: PyTorch's or ONNX Runtime's, at the chosen
   precision and thread count) runs the windows in length-sorted batches of at most `batch_size` rows and
   `max_batch_tokens` tokens, while a thread builds the next batches' windows (`evaluation.run_streamed`;
   results come back in input order),
4. `family.decode` maps the outputs back to the input's own characters and labels.
The steps are also methods (`features`, `forward`, `decode`; `run_parsed` chains them), so the server can
run one request's windows as several model calls between other requests' and decode once all have run:
a window's output does not depend on which other windows share its batch (up to float rounding).

Long inputs are windowed by every family (see `tokenization.windows` and each family's docstring for how
windows are combined); `embed` truncates to one window.

Every route has a family, and a model serves a family when it is the family's model class or holds one as its
encoder (`serves`): a task model's encoder serves `embed`. The model directory's fine-tuning record sets the
inputs of the model's own family only (a classifier's record does not re-window `embed`).

Precision: one rule for every path (`engine.build.plan_engine`). The default is fp32
(`runtime.DEFAULT_PRECISION`), the same as `bertforge evaluate` and training-time evaluation, so that by default
`predict`, the pipelines and the server return exactly the answers evaluate scored (same labels, spans and
scores within 1e-5 on any machine; bf16 would move scores by up to 1e-2 and can flip near-ties). bf16 is opt-in:
`precision="bf16"` forces it, and `precision="auto"` follows `runtime.choose_precision`, the rule of evaluate
and training too: bf16 on a CUDA device with bf16 support, fp32 everywhere else. `precision="int8"` (CPU only)
quantizes the encoder's linear layers once, when the engine is built (docs/cpu_inference.md states its accuracy
budget). What bf16 may change is stated here and tested: probabilities by at most `BF16_PROBABILITY_TOLERANCE`,
embeddings down to cosine 1 - `BF16_COSINE_TOLERANCE` against fp32 (`score_deviation` measures it).
`describe()` (the server's /health) reports the engine: its kind, precision, threads and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.checkpoint_format import LoadReport
from bertforge.data.finetuning import Feature, FinetuneBatch
from bertforge.engine.build import DEFAULT_KIND, build_engine, plan_engine
from bertforge.engine.engine import Engine
from bertforge.errors import CheckpointError, ConfigError, DataError, InputError
from bertforge.evaluation import run_features, run_streamed
from bertforge.families import registry
from bertforge.families.base import Family, InputSettings, served_window
from bertforge.families.task import TaskDescription, read_description
from bertforge.inference.wire_inputs import (
    count_tokens,
    family_examples,
    wire_features,
    with_cuts,
    with_logits,
)
from bertforge.interop.sentence_transformers import SentenceSettings
from bertforge.model.bert import BertModel, BertPretrainedModel
from bertforge.model.fast_paths import set_fast_paths
from bertforge.runtime import DEFAULT_PRECISION

# The stated bf16 contract: against fp32, no probability moves by more than this (absolute), and no
# embedding's cosine similarity to its fp32 value drops below 1 - this.
BF16_PROBABILITY_TOLERANCE = 1e-2
BF16_COSINE_TOLERANCE = 1e-3

DEFAULT_BATCH_SIZE = 32
TASKS = registry.TASKS


def check_task(task: str) -> None:
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; choose one of {list(TASKS)} (or transformers' names: "
                         f"{sorted(registry.TASK_ALIASES)})")


def feature_tokens(feature: Feature) -> int:
    """Tokens of one window: what the server's token budgets count (a multiple-choice window: every
    choice's row)."""
    ids = feature.input_ids
    if ids and isinstance(ids[0], list):
        return sum(len(row) for row in ids)
    return len(ids)


def serves(cls: type[BertPretrainedModel], family: Family) -> bool:
    """Whether models of class `cls` can run `family`: they are its model class (or its ModernBERT counterpart:
    `registry.runs`), or hold one as their encoder
    (every task model holds a `BertModel` under its `encoder_prefix`, so any model serves embed), or are among
    the classes it also runs on (`Family.also_runs_on`: every masked LM gives sparse vectors)."""
    holds_encoder = bool(cls.encoder_prefix) and issubclass(BertModel, family.model_class)
    return registry.runs(cls, family) or issubclass(cls, family.also_runs_on) or holds_encoder


def saved_task(model: BertPretrainedModel, family: Family, record: Mapping[str, Any] | None
               ) -> TaskDescription | None:
    """The task description the model was fine-tuned with (`finetuning.json`, read as evaluate reads it) when
    it describes this family; None otherwise (a classifier's record says nothing about embed)."""
    if record is None:
        return None
    named = record.get("family")  # (records written before the description had a version name none)
    if named == family.name or (named is None and registry.for_model(model) is family):
        return read_description(record, family)
    return None


def input_settings(model: BertPretrainedModel, tokenizer, family: Family, task: TaskDescription | None,
                   max_length: int | None, doc_stride: int | None) -> InputSettings:
    """How this pipeline builds inputs: the saved task's input settings, else the family's default window,
    capped by the model's and tokenizer's limits; explicit arguments win."""
    limit = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    if task is not None:
        settings = task.inputs
    else:
        settings = InputSettings(max_seq_length=min(served_window(family, model.config.max_position_embeddings),
                                                     limit))
    changes = {}
    if max_length:
        changes["max_seq_length"] = max_length
    if doc_stride is not None:
        changes["doc_stride"] = doc_stride
    values = {**settings.to_dict(), **changes}
    values["max_seq_length"] = min(values["max_seq_length"], limit)
    if values["max_seq_length"] < 8:
        raise InputError(f"max_length={values['max_seq_length']} is too short for a window; use at least 8 tokens")
    try:
        return InputSettings(**values)
    except ConfigError as error:  # the settings' own checks, worded for this API
        raise InputError(str(error).replace("max_seq_length", "max_length")) from None


class Pipeline:
    """One family's path from inputs to results (see the module docstring).

    Args:
        task: the route ("classify", "tag", "answer", "choose", "fill-mask"); `EmbedPipeline` for "embed".
        model: a bertforge model that serves the task's family (`serves`); it is moved to `device` (fast
            paths on) and built into the pipeline's engine; or an engine already built (pipelines of one model
            share it; device, precision, engine and threads are then its own).
        tokenizer: the model directory's tokenizer.
        device: "auto" (CUDA when available), "cpu", "cuda:0" ...
        precision: "fp32" (the default, as evaluate), "bf16", "int8" (CPU: the encoder's linear layers
            quantized, `engine.int8`), or "auto" (`runtime.choose_precision`: bf16 on a CUDA device with
            bf16 support, else fp32).
        engine: "auto" (the default: `engine.build.choose_kind`), "torch" or "onnxruntime"; threads: the CPU's
            intra-op threads (default: every core this process may use: `engine.threads`).
        batch_size: windows per model call, at most.
        max_batch_tokens: padded tokens per model call, at most (length-sorted windows fill a batch with rows
            or with tokens); default batch_size x max_length.
        max_length: tokens per window, special tokens included (default: the fine-tuning record's, else
            the family's default capped by the model's limit).
        doc_stride: step between window starts over a long input (default: the record's, else half a window).
        record: the model directory's fine-tuning record (`finetuning.json`), when it has one.
        report: the loader's report; a head that started fresh is refused (it would answer at random).
        sentence: the directory's sentence-transformers settings (`ModelDirectory.sentence`): embed's pooling,
            normalization and window by default, as sentence-transformers and text-embeddings-inference use it.
        family: the family object to run (default: the task's own), e.g. a reranker scoring by a chosen label
            (`Reranking.scoring_by`).
    """

    def __init__(self, task: str, model: BertPretrainedModel | Engine, tokenizer, *,
                 device: str | torch.device = "auto", precision: str = DEFAULT_PRECISION, engine: str = DEFAULT_KIND,
                 threads: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 doc_stride: int | None = None, record: Mapping[str, Any] | None = None, max_batch_tokens: int | None = None,
                 report: LoadReport | None = None, sentence: SentenceSettings | None = None,
                 family: Family | None = None):
        check_task(task)
        own = ROUTE_PIPELINES.get(task, Pipeline)
        if not isinstance(self, own):
            raise InputError(f"task {task!r} runs through {own.__name__}: use {own.__name__}(model, tokenizer) or "
                             f"make_pipeline({task!r}, model, tokenizer)")
        self.task = task
        self.family = family or registry.for_task(task)
        built = model if isinstance(model, Engine) else None
        model = built.model if built is not None else model
        self.check_model(model, report)
        if tokenizer.vocab_size > model.config.vocab_size:
            raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
                                  f"holds {model.config.vocab_size}; the vocab.txt does not belong to this model")
        tokens = 1 if max_batch_tokens is None else max_batch_tokens
        for name, value in (("batch_size", batch_size), ("max_batch_tokens", tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        plan = built.plan if built is not None else plan_engine(device, precision, engine, threads)
        self.device = plan.device
        self.model = model if built is not None else set_fast_paths(model.to(self.device).eval())
        self.config = model.config
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # The saved task's decoding options are the defaults (QA's n-best size, answer length, SQuAD v2.0
        # decoding, ...), so predict and the server decode as evaluate scored; a call's options override them.
        saved = saved_task(model, self.family, record)
        self.options = dict(saved.options) if saved is not None else dict(self.family.options)
        self.sentence = sentence
        adopted = self.family.directory_options(sentence)
        self.options.update(adopted)
        if adopted:  # the family embeds as the directory says: its window too
            max_length = max_length or sentence.max_seq_length
        self.settings = input_settings(model, tokenizer, self.family, saved, max_length, doc_stride)
        self.max_length = self.settings.max_seq_length
        self.max_batch_tokens = max_batch_tokens or batch_size * self.max_length
        source = Path(report.source).parent if report is not None else None  # where an engine keeps its files
        self.engine = build_engine(built or self.model, plan, source)  # int8: the encoder's linears quantized
        self.engine.prepare(self.family)
        self.precision, self.precision_report = plan.precision, plan.reason

    @property
    def defaults(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def bf16_tolerance(self) -> float:
        return BF16_PROBABILITY_TOLERANCE

    @property
    def example_inputs(self) -> list[Any]:
        return list(self.family.example_inputs)

    @property
    def family_name(self) -> str:
        return self.family.name

    @property
    def description(self) -> str:
        """What the route does, for the server's OpenAPI page: the family's own description."""
        return (type(self.family).__doc__ or "").strip()

    @property
    def example(self) -> dict[str, Any]:
        """A request body for the server's OpenAPI page: the probe inputs with the default options."""
        return {"inputs": self.example_inputs[:2], "parameters": self.defaults}

    def check_model(self, model: BertPretrainedModel, report: LoadReport | None) -> None:
        family = self.family
        if not serves(type(model), family):
            raise CheckpointError(f"{self.task} needs a {family.model_class.__name__} (the {family.name} family); "
                                  f"this is a {type(model).__name__}")
        family.check_model(model.config)
        fresh = report.fresh_in(family.model_class.head_prefixes) if report is not None else []
        if fresh:
            raise CheckpointError(f"the checkpoint has no trained head ({', '.join(fresh[:4])} missing); "
                                  f"{self.task} would return random predictions — fine-tune the model first")

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """This pipeline's defaults merged with `options`; unknown names or bad values raise InputError."""
        return self.family.check_options({**self.options, **options}, self.config)

    def parse(self, item: Any) -> Any:
        """Validate one raw input (a string or a JSON object); raise InputError naming the problem."""
        return self.family.parse(item)

    def prompt_text(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The prefix a call puts before each text: `prompt` itself, the directory's prompt called
        `prompt_name`, else its default prompt (sentence-transformers' `config_sentence_transformers.json`)."""
        if prompt is not None and prompt_name is not None:
            raise InputError("give prompt or prompt_name, not both")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InputError(f"prompt must be a string, got {type(prompt).__name__}")
            return prompt
        prompts = dict(self.sentence.prompts) if self.sentence is not None else {}
        if prompt_name is None:
            default = self.sentence.default_prompt_name if self.sentence is not None else None
            return prompts[default] if default else ""
        if prompt_name not in prompts:
            raise InputError(f"prompt_name {prompt_name!r} is not among this model's prompts {sorted(prompts)}")
        return prompts[prompt_name]

    # --- running ---------------------------------------------------------------------------------------
    def __call__(self, inputs: Any, **options: Any) -> Any:
        """Results for one input or a list of inputs (a list of results, same order).

        A list is always a batch; give a single text pair as a dict or a tuple, e.g. ``("text", "pair")``.
        """
        if isinstance(inputs, list):
            return self.run(list(inputs), **options)
        return self.run([inputs], **options)[0]

    def run(self, items: Sequence[Any], **options: Any) -> list[dict[str, Any]]:
        """Results for `items`, in their order. Raises InputError naming the first bad input."""
        merged = self.check_options(options)
        parsed = []
        for index, item in enumerate(items):
            try:
                parsed.append(self.parse(item))
            except InputError as error:
                raise InputError(f"input {index}: {error}") from None
        return self.run_parsed(parsed, merged)

    def features(self, parsed: Sequence[Any]) -> list[Feature]:
        """Step 2: the windows of inputs already validated by `parse` (`Feature.example_index` points back);
        the wire routes' inputs (`EmbedText`, `TruncatedInput`) by TEI's rule (`wire_inputs`)."""
        return wire_features(parsed, self.family_features, self.tokenizer, self.max_length)

    def family_features(self, examples: list[Any]) -> list[Feature]:
        """The family's own windows of plain inputs (its windowing of long inputs)."""
        try:
            return self.family.features(examples, self.tokenizer, self.settings, config=self.config)
        except (ConfigError, DataError) as error:  # e.g. a window that cannot fit: the caller's input
            raise InputError(str(error)) from None

    def forward(self, features: Sequence[Feature], options: dict[str, Any]) -> list[Any]:
        """Step 3: one model output per feature, in order. Any subset of an input's features may run in any
        call: `decode` gets them back together."""
        return run_features(self.engine, features, self.family_forward(options), batch_size=self.batch_size,
                            pad_token_id=self.tokenizer.pad_token_id, precision=self.precision, split_padding=True)

    def family_forward(self, options: dict[str, Any]) -> Callable[[torch.nn.Module, FinetuneBatch], list[Any]]:
        """The family's forward for one call, with the call's options (embed's pooling and layer shape the run;
        other families' options act in `decode`)."""
        return partial(self.family.forward, options=options)

    def decode(self, parsed: Sequence[Any], features: Sequence[Feature], outputs: Sequence[Any],
               options: dict[str, Any]) -> list[dict[str, Any]]:
        """Step 4: one result per input from all of its features' outputs (a `TruncatedInput`'s also with its
        raw output rows, `"logits"`; a wire input's with its texts cut to the window, `wire_inputs.TRUNCATED`)."""
        results = self.family.decode(family_examples(parsed), features, outputs, options, self.config,
                                     self.tokenizer)
        return with_cuts(with_logits(results, parsed, features, outputs), parsed, features)

    def run_parsed(self, parsed: Sequence[Any], options: dict[str, Any]) -> list[dict[str, Any]]:
        """Run inputs already validated by `parse` with options already checked by `check_options`."""
        if not parsed:
            return []
        features, outputs = self.stream(parsed, options)
        return self.decode(parsed, features, outputs, options)

    def stream(self, parsed: Sequence[Any], options: dict, on_batch: Callable[[int], None] | None = None,
               features: Callable[[list[Any]], list[Feature]] | None = None) -> tuple[list, list]:
        """Steps 2 and 3: (features, an output per feature), made in a thread as the model runs (`streaming`);
        `features`: step 2 as the caller wraps it (default `self.features`; `wire_inputs.noting_cuts`)."""
        return run_streamed(self.engine, parsed, features or self.features, self.family_forward(options),
                            batch_size=self.batch_size,
                            max_batch_tokens=self.max_batch_tokens, pad_token_id=self.tokenizer.pad_token_id,
                            precision=self.precision, on_batch=on_batch)

    def score_deviation(self, reference: list[dict], candidate: list[dict]) -> float:
        """How far bf16 results are from fp32 ones: the largest change of any score in them (also those of
        tagged entities and fill-mask predictions; a different number of scores counts as infinitely far)."""
        def numbers(value: Any) -> list[float]:
            if isinstance(value, bool) or value is None:
                return []
            if isinstance(value, int | float):
                return [float(value)]
            if isinstance(value, Mapping):
                return [n for k, v in value.items()
                        if k in ("score", "scores", "probability", "value", "predictions", "entities", "masks")
                        for n in numbers(v)]
            if isinstance(value, list):
                return [n for v in value for n in numbers(v)]
            return []

        worst = 0.0
        for a, b in zip(reference, candidate):
            first, second = numbers(a), numbers(b)
            if len(first) != len(second):
                return float("inf")
            scale = 1.0 + max((abs(x) for x in first), default=0.0) if "value" in a else 1.0
            worst = max([worst, *(abs(x - y) / scale for x, y in zip(first, second))])
        return worst

    def describe(self) -> dict[str, Any]:
        """What this pipeline runs with (for /health and logs): its engine's description among them."""
        return {"task": self.task, "device": str(self.device), "precision": self.precision,
                "precision_reason": self.precision_report, "engine": self.engine.describe(),
                "max_length": self.max_length, "doc_stride": self.settings.doc_stride, "batch_size": self.batch_size,
                "options": dict(self.defaults)}


# --- embed -----------------------------------------------------------------------------------------------

class EmbedPipeline(Pipeline):
    """The `embed` route: sentence vectors from any model's encoder (the embedding family does the work).

    What it adds to `Pipeline`: the call's options reach the family's forward (pooling and layer shape the
    model run, not only the decoding), bf16 is held to the cosine contract (`BF16_COSINE_TOLERANCE`),
    `encode` returns one float32 array, and `EmbedText` inputs (token ids; a refusal instead of a silent cut)
    for the wire routes, whose results also say how many tokens ran (`"tokens"`, OpenAI's usage).

    `matryoshka_dims`: the leading widths the model was trained to be cut to (the `matryoshka_dims` of its
    `finetuning.json`); empty: its vectors are not to be cut.
    """

    def __init__(self, model: BertPretrainedModel, tokenizer, **kwargs: Any):
        super().__init__("embed", model, tokenizer, **kwargs)
        record = kwargs.get("record")
        widths = record.get("matryoshka_dims") if isinstance(record, Mapping) else None
        self.matryoshka_dims = tuple(int(d) for d in widths or ()
                                     if isinstance(d, int) and not isinstance(d, bool) and d > 0)

    def decode(self, parsed: Sequence[Any], features: Sequence[Feature], outputs: Sequence[Any],
               options: dict[str, Any]) -> list[dict[str, Any]]:
        return count_tokens(super().decode(parsed, features, outputs, options), parsed, features)

    @property
    def bf16_tolerance(self) -> float:
        return BF16_COSINE_TOLERANCE

    def score_deviation(self, reference: list[dict], candidate: list[dict]) -> float:
        """The largest 1 - cosine between an fp32 vector and its bf16 counterpart."""
        return max(1.0 - float(F.cosine_similarity(torch.tensor(a["embedding"]), torch.tensor(b["embedding"]), dim=0))
                   for a, b in zip(reference, candidate))

    def encode(self, texts: Sequence[str], *, prompt_name: str | None = None, prompt: str | None = None,
               **options: Any) -> np.ndarray:
        """Vectors of `texts` as one float32 array [N, D] (no JSON lists in between); `prompt_name` /
        `prompt` put a prefix before every text (see `prompt_text`)."""
        prefix = self.prompt_text(prompt_name, prompt)
        return self.encode_parsed([prefix + self.parse(t) for t in texts], self.check_options(options))[0]

    def encode_parsed(self, parsed: Sequence[str], options: dict[str, Any]) -> tuple[np.ndarray, int]:
        """(vectors [N, D] float32, tokens run) of texts already validated by `parse` (prompts included),
        with options already checked: `encode`'s steps, for callers that count tokens (`embed_corpus`)."""
        if not parsed:
            width = self.config.hidden_size * len(options["pooling"].split("+"))
            return np.zeros((0, width), dtype=np.float32), 0
        features, outputs = self.stream(parsed, options)
        tokens = sum(feature_tokens(feature) for feature in features)
        return torch.stack(outputs).numpy(), tokens


# Routes whose pipeline is a subclass (built as `cls(model, tokenizer, **options)`); others use `Pipeline`.
ROUTE_PIPELINES: dict[str, type[Pipeline]] = {"embed": EmbedPipeline}



__all__ = [
    "BF16_COSINE_TOLERANCE", "BF16_PROBABILITY_TOLERANCE", "DEFAULT_BATCH_SIZE", "ROUTE_PIPELINES", "TASKS",
    "EmbedPipeline", "Pipeline", "check_task", "feature_tokens", "input_settings", "saved_task", "serves",
]
