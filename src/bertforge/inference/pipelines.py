"""Inference pipelines: raw text in, plain JSON-ready results out, for any saved model directory.

Five tasks, one per head: `fill-mask` (BertForPretraining), `classify` (BertForSequenceClassification:
labels, multi-label or regression), `tag` (BertForTokenClassification: entities with character offsets),
`answer` (BertForQuestionAnswering: extractive answers from contexts of any length) and `embed` (any model's
encoder: cls / mean / max pooling over real tokens). Each pipeline

1. validates every input (`parse`) and turns it into one or more windows of token ids (`featurize`),
2. runs all windows in batches sorted by length, so padding stays small (results come back in input order),
   with the model in eval mode under `torch.inference_mode`, at the chosen precision,
3. maps the outputs back to the input's own characters and labels (`finish`).

Long inputs are never silently broken: `tag` and `answer` slide overlapping windows over the text and take
each token from the window where it has the most context (Devlin's rule, google-research/bert#66);
`classify` truncates by default (as fine-tuning does) or averages windows with `long_text="windows"`;
`fill-mask` and `embed` truncate or refuse with a clear message.

Precision `auto` uses bf16 only where the hardware computes it natively (CUDA with bf16, or a CPU with
native bf16 instructions) *and* a probe batch at load time shows the results stay within the stated
tolerance of fp32: probabilities within `BF16_PROBABILITY_TOLERANCE`, embeddings within
`BF16_COSINE_TOLERANCE` of cosine 1. Otherwise fp32. `precision="fp32"|"bf16"` overrides the probe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from bertforge import runtime
from bertforge.artifacts import load_model, load_tokenizer, read_config
from bertforge.errors import CheckpointError, DataError, InputError
from bertforge.metrics.sequence_labeling import get_entities
from bertforge.model.bert import BertModel, BertPretrainedModel, set_fast_paths
from bertforge.tasks.classification import BertForSequenceClassification
from bertforge.tasks.pretraining import BertForPretraining
from bertforge.tasks.question_answering import BertForQuestionAnswering
from bertforge.tasks.token_classification import BertForTokenClassification

# The stated bf16 contract: `precision="auto"` keeps bf16 only if, on the probe inputs, no probability moves
# by more than this (absolute), and no embedding's cosine similarity to its fp32 value drops below 1 - this.
BF16_PROBABILITY_TOLERANCE = 1e-2
BF16_COSINE_TOLERANCE = 1e-3

DEFAULT_BATCH_SIZE = 32
# Google's run_squad defaults: question budget, window overlap and the answer length cap.
MAX_QUESTION_TOKENS = 64
DEFAULT_STRIDE = 128
MAX_ANSWER_TOKENS = 30
QA_MAX_LENGTH = 384
N_BEST = 20


@dataclass
class Feature:
    """One window of one input, ready for the model.

    Attributes:
        item: index of the input it came from.
        ids, type_ids: [L] token and segment ids (special tokens included, no padding).
        data: what `finish` needs to map the window's outputs back (offsets, positions ...).
    """

    item: int
    ids: list[int]
    type_ids: list[int]
    data: dict[str, Any] = field(default_factory=dict)


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matrix products natively (otherwise bf16 is slow emulation)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        # AVX512-BF16 or AMX: oneDNN's own "bf16 supported" is also true on plain AVX512, where bf16 is emulated.
        try:
            return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def check_text(value: Any, name: str) -> str:
    """`value` if it is a non-blank string, else an InputError naming the field."""
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{name} is empty; give some text")
    return value


def text_of(item: Any) -> str:
    """A single text given as a string or as {"text": ...}."""
    if isinstance(item, Mapping):
        if "text" not in item:
            raise InputError(f"missing field 'text' (got fields {sorted(item)}); send a string or {{\"text\": ...}}")
        return check_text(item["text"], "text")
    if isinstance(item, str):
        return check_text(item, "text")
    raise InputError(f"expected a string or an object {{\"text\": ...}}, got {type(item).__name__}")


def window_starts(lengths: list[int], stride: int) -> list[int]:
    """Index of each window's first token in the whole sequence (windows overlap by `stride` tokens)."""
    starts = [0]
    for length in lengths[:-1]:
        starts.append(starts[-1] + length - stride)
    return starts


def max_context_window(position: int, starts: list[int], lengths: list[int]) -> int:
    """The window in which token `position` has the most context on both sides (Google's rule).

    Score = min(tokens to the left, tokens to the right) + 0.01 * window length; the first best wins.
    """
    best, best_score = 0, -1.0
    for window, (start, length) in enumerate(zip(starts, lengths)):
        if start <= position < start + length:
            score = min(position - start, start + length - 1 - position) + 0.01 * length
            if score > best_score:
                best, best_score = window, score
    return best


class Pipeline:
    """Shared machinery: validation, windows, length-sorted batches, precision, device.

    Args:
        model: a bertforge model (its class must suit the task); it is moved to `device`.
        tokenizer: the model directory's tokenizer.
        device: "auto" (CUDA when available), "cpu", "cuda:0" ...
        precision: "auto" (bf16 where native and within tolerance on a probe batch), "fp32" or "bf16".
        batch_size: windows per model call.
        max_length: tokens per window, special tokens included (default: the tokenizer's and model's limit).
        stride: overlap between consecutive windows of a long input (default 128, or less if windows are short).
    """

    task: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}  # per-call options and their default values
    probe_inputs: ClassVar[list[Any]] = []  # inputs of the bf16 probe (see `choose_precision`)
    probe_tolerance: ClassVar[float] = BF16_PROBABILITY_TOLERANCE

    def __init__(self, model: BertPretrainedModel, tokenizer, *, device: str | torch.device = "auto",
                 precision: str = "auto", batch_size: int = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 stride: int | None = None):
        self.check_model(model)
        if tokenizer.vocab_size > model.config.vocab_size:
            raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
                                  f"holds {model.config.vocab_size}; the vocab.txt does not belong to this model")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.device = runtime.resolve_device(device)
        # Batches of texts vary in length: skip the padding in every matmul (equal to the plain path).
        self.model = set_fast_paths(model.to(self.device).eval())
        self.config = model.config
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        limit = min(tokenizer.model_max_length, self.config.max_position_embeddings)
        self.max_length = min(max_length, limit) if max_length else limit
        if self.max_length < 8:
            raise InputError(f"max_length={self.max_length} is too short for a window; use at least 8 tokens")
        self.stride = DEFAULT_STRIDE if stride is None else stride
        if self.stride < 0:
            raise InputError(f"stride must be >= 0, got {self.stride}")
        self.precision, self.precision_report = self.choose_precision(precision)

    # --- hooks a task implements -----------------------------------------------------------------------
    def check_model(self, model: BertPretrainedModel) -> None:
        """Raise CheckpointError when `model` lacks what this task needs."""

    def parse(self, item: Any) -> Any:
        """Validate one raw input (a string or a JSON object); raise InputError naming the problem."""
        raise NotImplementedError

    def featurize(self, parsed: Any, item: int, options: dict[str, Any]) -> list[Feature]:
        """The windows of one parsed input."""
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor], features: list[Feature],
                options: dict[str, Any]) -> list[Any]:
        """Model outputs per window (float32 CPU tensors, trimmed to the window's length)."""
        raise NotImplementedError

    def finish(self, parsed: Any, features: list[Feature], outputs: list[Any],
               options: dict[str, Any]) -> dict[str, Any]:
        """One input's result as a JSON-ready dict."""
        raise NotImplementedError

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults merged with `options`; unknown names or bad values raise InputError."""
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise InputError(f"unknown option(s) {unknown} for {self.task}; known: {sorted(self.defaults) or 'none'}")
        merged = {**self.defaults, **options}
        self.validate_options(merged)
        return merged

    def validate_options(self, options: dict[str, Any]) -> None:
        """Check option values (InputError with the option's name)."""

    def probe_deviation(self, reference: list[Any], candidate: list[Any]) -> float:
        """How far bf16 outputs are from fp32 ones, in units comparable to `probe_tolerance`.

        Default: the largest absolute change of any softmax probability (outputs are logits, or tuples of).
        """
        worst = 0.0
        for ref, cand in zip(reference, candidate):
            pairs = zip(ref, cand) if isinstance(ref, tuple) else [(ref, cand)]
            for a, b in pairs:
                if a.numel():
                    worst = max(worst, float((a.softmax(-1) - b.softmax(-1)).abs().max()))
        return worst

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

    def run_parsed(self, parsed: Sequence[Any], options: dict[str, Any],
                   precision: str | None = None) -> list[dict[str, Any]]:
        """Run inputs already validated by `parse` with options already checked by `check_options`."""
        features: list[Feature] = []
        for index, value in enumerate(parsed):
            try:
                features.extend(self.featurize(value, index, options))
            except InputError as error:
                raise InputError(f"input {index}: {error}") from None
        outputs = self.run_features(features, options, precision or self.precision)
        per_item: list[list[int]] = [[] for _ in parsed]
        for position, feature in enumerate(features):
            per_item[feature.item].append(position)
        return [self.finish(value, [features[p] for p in per_item[index]], [outputs[p] for p in per_item[index]],
                            options)
                for index, value in enumerate(parsed)]

    def run_features(self, features: list[Feature], options: dict[str, Any], precision: str) -> list[Any]:
        """Model outputs for every window, batched by similar length, returned in the windows' order."""
        order = sorted(range(len(features)), key=lambda i: len(features[i].ids))
        outputs: list[Any] = [None] * len(features)
        for begin in range(0, len(order), self.batch_size):
            chosen = order[begin:begin + self.batch_size]
            batch_features = [features[i] for i in chosen]
            with torch.inference_mode(), runtime.autocast(self.device, precision):
                results = self.forward(self.collate(batch_features), batch_features, options)
            for position, result in zip(chosen, results):
                outputs[position] = result
        return outputs

    def collate(self, features: list[Feature]) -> dict[str, torch.Tensor]:
        """Pad a batch to its longest window: input_ids, token_type_ids, attention_mask [B, T]."""
        longest = max(len(f.ids) for f in features)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(features), longest), pad, dtype=torch.long)
        types = torch.zeros((len(features), longest), dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature.ids)
            ids[row, :n] = torch.tensor(feature.ids)
            types[row, :n] = torch.tensor(feature.type_ids)
            mask[row, :n] = 1
        return {"input_ids": ids.to(self.device), "token_type_ids": types.to(self.device),
                "attention_mask": mask.to(self.device)}

    def choose_precision(self, requested: str) -> tuple[str, str]:
        """(precision, why) — see the module docstring for the `auto` rule."""
        if requested != "auto":
            return runtime.resolve_precision(requested, self.device), "requested"
        if not native_bf16(self.device):
            return "fp32", f"auto: no native bf16 on {self.device.type}"
        options = self.check_options({})
        parsed = [self.parse(item) for item in self.probe_inputs]
        features = [f for index, value in enumerate(parsed) for f in self.featurize(value, index, options)]
        reference = self.run_features(features, options, "fp32")
        candidate = self.run_features(features, options, "bf16")
        deviation = self.probe_deviation(reference, candidate)
        verdict = "bf16" if deviation <= self.probe_tolerance else "fp32"
        return verdict, f"auto: bf16 probe deviation {deviation:.2e} (tolerance {self.probe_tolerance:.0e})"

    def describe(self) -> dict[str, Any]:
        """What this pipeline runs with (for /health and logs)."""
        return {"task": self.task, "device": str(self.device), "precision": self.precision,
                "precision_reason": self.precision_report, "max_length": self.max_length,
                "batch_size": self.batch_size, "options": dict(self.defaults)}

    # --- shared pieces ---------------------------------------------------------------------------------
    def encoder(self) -> BertModel:
        return self.model if isinstance(self.model, BertModel) else self.model.bert

    def stride_for(self, room: int) -> int:
        """The configured stride, shrunk so that windows of `room` tokens still advance."""
        return min(self.stride, max(0, room // 2))

    def require_head(self, model: BertPretrainedModel, prefixes: tuple[str, ...], what: str) -> None:
        fresh = [k for k in getattr(model, "load_report", {}).get("fresh", []) if k.startswith(prefixes)]
        if fresh:
            raise CheckpointError(f"the checkpoint has no trained {what} ({', '.join(fresh[:4])} missing); "
                                  f"{self.task} would return random predictions — fine-tune the model first")


# --- fill-mask -------------------------------------------------------------------------------------------

class FillMaskPipeline(Pipeline):
    """Top-k tokens for every literal ``[MASK]`` in the text.

    The tokenizer treats "[MASK]" in raw text as plain text (so user text can never inject control tokens);
    this pipeline therefore finds the markers in the string itself, tokenizes the pieces between them and puts
    the mask id in their place. Special tokens are never proposed.
    """

    task = "fill-mask"
    defaults = {"top_k": 5}
    probe_inputs = ["The capital of France is [MASK].", "I went to the [MASK] to buy some bread.",
                    "She [MASK] the letter and smiled."]

    def check_model(self, model):
        if not isinstance(model, BertForPretraining):
            raise CheckpointError(f"fill-mask needs a model with a masked-LM head (BertForPretraining); this is "
                                  f"a {type(model).__name__}")
        self.require_head(model, ("mlm.",), "masked-LM head")

    def validate_options(self, options):
        top_k = options["top_k"]
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 100:
            raise InputError(f"top_k must be an integer from 1 to 100, got {top_k!r}")

    def parse(self, item):
        text = text_of(item)
        marker = self.tokenizer.config.mask_token
        if marker not in text:
            raise InputError(f"no {marker} in the text; put {marker} where a token should be predicted")
        return text

    def featurize(self, parsed, item, options):
        marker = self.tokenizer.config.mask_token
        ids = [self.tokenizer.cls_token_id]
        positions: list[int] = []
        spans: list[tuple[int, int]] = []
        cursor = 0
        pieces = parsed.split(marker)
        for number, piece in enumerate(pieces):
            if piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False).ids
            cursor += len(piece)
            if number < len(pieces) - 1:
                positions.append(len(ids))
                spans.append((cursor, cursor + len(marker)))
                ids.append(self.tokenizer.mask_token_id)
                cursor += len(marker)
        ids.append(self.tokenizer.sep_token_id)
        if len(ids) > self.max_length:
            raise InputError(f"the text has {len(ids)} tokens, more than this model's limit of {self.max_length}; "
                             f"shorten it around the {marker}")
        return [Feature(item, ids, [0] * len(ids), {"positions": positions, "spans": spans})]

    def forward(self, batch, features, options):
        most = max(len(f.data["positions"]) for f in features)
        positions = torch.zeros((len(features), most), dtype=torch.long)
        for row, feature in enumerate(features):
            positions[row, :len(feature.data["positions"])] = torch.tensor(feature.data["positions"])
        out = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                         mlm_positions=positions.to(self.device))
        logits = out.mlm_logits.float().cpu()  # [B, M, V]
        logits[..., self.tokenizer.all_special_ids] = float("-inf")
        return [logits[row, :len(f.data["positions"])] for row, f in enumerate(features)]

    def finish(self, parsed, features, outputs, options):
        probs = outputs[0].softmax(-1)  # [M, V]
        scores, ids = probs.topk(options["top_k"], dim=-1)
        masks = []
        filled, cursor = [], 0
        for row, (start, end) in enumerate(features[0].data["spans"]):
            tokens = self.tokenizer.convert_ids_to_tokens(ids[row].tolist())
            masks.append({"start": start, "end": end, "predictions": [
                {"token": token, "id": int(i), "score": float(s)}
                for token, i, s in zip(tokens, ids[row].tolist(), scores[row].tolist())]})
            filled += [parsed[cursor:start], tokens[0].removeprefix("##")]
            cursor = end
        filled.append(parsed[cursor:])
        return {"masks": masks, "filled": "".join(filled)}


# --- classify --------------------------------------------------------------------------------------------

class ClassifyPipeline(Pipeline):
    """Labels and probabilities (single- or multi-label) or a regression value, for texts or text pairs.

    Inputs: "text", {"text": ..., "text_pair": ...} or ["text", "pair"]. Long inputs are truncated longest
    first (as fine-tuning does); `long_text="windows"` instead scores overlapping windows of a single text
    and averages their probabilities (or values).
    """

    task = "classify"
    defaults = {"long_text": "truncate", "threshold": 0.5}
    probe_inputs = ["This film was a delight from start to finish.",
                    {"text": "A man is playing a guitar.", "text_pair": "Someone is making music."},
                    "The service was slow and the food arrived cold."]

    def check_model(self, model):
        if not isinstance(model, BertForSequenceClassification):
            raise CheckpointError(f"classify needs a sequence classifier (BertForSequenceClassification); this "
                                  f"is a {type(model).__name__}")
        if model.config.problem_type != "regression" and not model.config.id2label:
            raise CheckpointError("the model's config.json has no id2label (label names); add them, e.g. "
                                  "\"id2label\": {\"0\": \"negative\", \"1\": \"positive\"}")
        self.require_head(model, ("classifier.", "bert.pooler."), "classifier head")

    def validate_options(self, options):
        if options["long_text"] not in ("truncate", "windows"):
            raise InputError(f"long_text must be 'truncate' or 'windows', got {options['long_text']!r}")
        threshold = options["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
            raise InputError(f"threshold must be a number in [0, 1], got {threshold!r}")

    def parse(self, item):
        if isinstance(item, str):
            return check_text(item, "text"), None
        if isinstance(item, list | tuple):
            if not 1 <= len(item) <= 2:
                raise InputError(f"a list input must be [text] or [text, text_pair], got {len(item)} elements")
            return check_text(item[0], "text"), (check_text(item[1], "text_pair") if len(item) == 2 else None)
        if isinstance(item, Mapping):
            text = text_of(item)
            pair = item.get("text_pair")
            return text, None if pair is None else check_text(pair, "text_pair")
        raise InputError(f"expected a string, [text, text_pair] or {{\"text\": ..., \"text_pair\": ...}}, "
                         f"got {type(item).__name__}")

    def featurize(self, parsed, item, options):
        text, pair = parsed
        if options["long_text"] == "windows" and pair is None:
            room = self.max_length - 2
            encoding = self.tokenizer.encode(text, truncation="only_first", max_length=self.max_length,
                                             stride=self.stride_for(room), return_overflowing=True)
            windows = [encoding, *encoding.overflowing]
        else:
            windows = [self.tokenizer.encode(text, pair, truncation="longest_first", max_length=self.max_length)]
        return [Feature(item, w.ids, w.type_ids) for w in windows]

    def forward(self, batch, features, options):
        logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
        return list(logits.float().cpu())

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[C] logits -> probabilities (softmax, sigmoid for multi-label) or the raw regression value."""
        kind = self.config.problem_type
        if kind == "regression":
            return logits
        if kind == "multi_label_classification":
            return logits.sigmoid()
        return logits.softmax(-1)

    def finish(self, parsed, features, outputs, options):
        scores = torch.stack([self.scores(o) for o in outputs]).mean(0)  # windows averaged: [C]
        if self.config.problem_type == "regression":
            return {"value": float(scores[0])}
        names = self.config.label_names
        by_label = {name: float(s) for name, s in zip(names, scores.tolist())}
        if self.config.problem_type == "multi_label_classification":
            return {"labels": [n for n, s in by_label.items() if s >= options["threshold"]], "scores": by_label}
        best = int(scores.argmax())
        return {"label": names[best], "score": float(scores[best]), "scores": by_label}

    def probe_deviation(self, reference, candidate):
        if self.config.problem_type == "regression":
            return max(float((a - b).abs().max() / (1 + a.abs().max())) for a, b in zip(reference, candidate))
        return max(float((self.scores(a) - self.scores(b)).abs().max()) for a, b in zip(reference, candidate))


# --- tag -------------------------------------------------------------------------------------------------

class TagPipeline(Pipeline):
    """Entities with type, score and character offsets into the original text.

    Each word is labelled by its first sub-token (how token classifiers are trained); words become entities
    by the BIO / IOBES rules of `metrics.sequence_labeling` (labels without a prefix are read as IO).
    Texts longer than a window are split into overlapping windows; each token is taken from the window in
    which it has the most context. An entity's score is the mean probability of its words' labels.
    """

    task = "tag"
    defaults: ClassVar[dict[str, Any]] = {}
    probe_inputs = ["George Washington went to Washington in 1789.", "Angela works for Siemens in Munich.",
                    "The Nile flows through Egypt and Sudan."]

    def check_model(self, model):
        if not isinstance(model, BertForTokenClassification):
            raise CheckpointError(f"tag needs a token classifier (BertForTokenClassification); this is a "
                                  f"{type(model).__name__}")
        if not model.config.id2label:
            raise CheckpointError("the model's config.json has no id2label (tag names such as \"B-PER\"); add them")
        self.require_head(model, ("classifier.",), "token classifier head")
        names = model.config.label_names
        self.scheme = "IOBES" if any(n[:2] in ("E-", "S-") for n in names) else "BIO"
        # Prefix-less labels ("PER", "O") are the IO scheme; read them as I- tags, which start an entity
        # after O or a type change.
        self.tags = [n if n == "O" or (len(n) > 2 and n[1] == "-" and n[0] in "BIES") else f"I-{n}" for n in names]

    def parse(self, item):
        return text_of(item)

    def featurize(self, parsed, item, options):
        room = self.max_length - 2
        stride = self.stride_for(room)
        encoding = self.tokenizer.encode(parsed, truncation="only_first", max_length=self.max_length,
                                         stride=stride, return_overflowing=True)
        windows = [encoding, *encoding.overflowing]
        lengths = [sum(1 for s in w.sequence_ids if s == 0) for w in windows]
        starts = window_starts(lengths, stride)
        return [Feature(item, w.ids, w.type_ids, {"offsets": w.offsets, "word_ids": w.word_ids,
                                                  "start": start, "length": length, "starts": starts,
                                                  "lengths": lengths})
                for w, start, length in zip(windows, starts, lengths)]

    def forward(self, batch, features, options):
        logits = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
        logits = logits.float().cpu()  # [B, T, C]
        return [logits[row, :len(f.ids)] for row, f in enumerate(features)]

    def finish(self, parsed, features, outputs, options):
        starts, lengths = features[0].data["starts"], features[0].data["lengths"]
        # Per word: (probabilities of its first token, character start, character end).
        words: dict[int, list[Any]] = {}
        for window, (feature, logits) in enumerate(zip(features, outputs)):
            probs = logits.softmax(-1)  # [T, C]
            for column, (word, (begin, end)) in enumerate(zip(feature.data["word_ids"], feature.data["offsets"])):
                if word is None:
                    continue
                token = feature.data["start"] + column - 1  # position in the whole text ([CLS] is column 0)
                if max_context_window(token, starts, lengths) != window:
                    continue
                if word not in words:
                    words[word] = [probs[column], begin, end]
                else:
                    words[word][1] = min(words[word][1], begin)
                    words[word][2] = max(words[word][2], end)
        order = sorted(words)
        confidence, best = (torch.stack([words[w][0] for w in order]).max(-1) if order
                            else (torch.zeros(0), torch.zeros(0, dtype=torch.long)))  # [W] each
        tags = [self.tags[b] for b in best.tolist()]
        entities = []
        for entity in get_entities(tags, self.scheme):
            span = order[entity.start:entity.end + 1]
            begin, end = words[span[0]][1], words[span[-1]][2]
            score = float(confidence[entity.start:entity.end + 1].mean())
            entities.append({"type": entity.type, "start": begin, "end": end, "text": parsed[begin:end],
                             "score": score})
        return {"entities": entities}


# --- answer ----------------------------------------------------------------------------------------------

class AnswerPipeline(Pipeline):
    """Extractive answers: the best span of the context, with its probability and character offsets.

    The question is cut to `MAX_QUESTION_TOKENS` (at most half a window); the context is covered by overlapping windows (doc stride).
    Spans are ranked by start + end logit over all windows, starting only at tokens whose window gives them
    maximal context; answers are at most `max_answer_tokens` long. With `allow_no_answer` (SQuAD 2.0 models)
    the answer is empty when the null score ([CLS] start + end) beats the best span by `null_threshold`.
    """

    task = "answer"
    defaults = {"max_answer_tokens": MAX_ANSWER_TOKENS, "allow_no_answer": False, "null_threshold": 0.0}
    probe_inputs = [{"question": "Where does Ana live?", "context": "Ana lives in Lisbon and works in Porto."},
                    {"question": "When was the bridge opened?",
                     "context": "The bridge, designed by a local engineer, was opened in 1932 after six years."}]

    def __init__(self, model, tokenizer, *, max_length: int | None = None, **kwargs):
        super().__init__(model, tokenizer, max_length=max_length or QA_MAX_LENGTH, **kwargs)

    def check_model(self, model):
        if not isinstance(model, BertForQuestionAnswering):
            raise CheckpointError(f"answer needs a question-answering model (BertForQuestionAnswering); this is "
                                  f"a {type(model).__name__}")
        self.require_head(model, ("qa_outputs.",), "span head (qa_outputs)")

    def validate_options(self, options):
        longest = options["max_answer_tokens"]
        if isinstance(longest, bool) or not isinstance(longest, int) or not 1 <= longest <= 512:
            raise InputError(f"max_answer_tokens must be an integer from 1 to 512, got {longest!r}")
        if not isinstance(options["allow_no_answer"], bool):
            raise InputError("allow_no_answer must be true or false")
        if isinstance(options["null_threshold"], bool) or not isinstance(options["null_threshold"], int | float):
            raise InputError("null_threshold must be a number")

    def parse(self, item):
        if isinstance(item, list | tuple) and len(item) == 2:
            item = {"question": item[0], "context": item[1]}
        if not isinstance(item, Mapping):
            raise InputError(f"expected an object {{\"question\": ..., \"context\": ...}}, got {type(item).__name__}")
        missing = [k for k in ("question", "context") if k not in item]
        if missing:
            raise InputError(f"missing field(s) {missing}; send {{\"question\": ..., \"context\": ...}}")
        return check_text(item["question"], "question"), check_text(item["context"], "context")

    def featurize(self, parsed, item, options):
        question, context = parsed
        asked = self.tokenizer.encode(question, add_special_tokens=False)
        # The question keeps at most half a window, so the context always has room.
        budget = min(MAX_QUESTION_TOKENS, (self.max_length - 3) // 2)
        if len(asked.ids) > budget:
            question = question[:asked.offsets[budget - 1][1]]
            asked = self.tokenizer.encode(question, add_special_tokens=False)
        room = self.max_length - 3 - len(asked.ids)
        stride = self.stride_for(room)
        encoding = self.tokenizer.encode(question, context, truncation="only_second", max_length=self.max_length,
                                         stride=stride, return_overflowing=True)
        windows = [encoding, *encoding.overflowing]
        lengths = [sum(1 for s in w.sequence_ids if s == 1) for w in windows]
        starts = window_starts(lengths, stride)
        return [Feature(item, w.ids, w.type_ids, {"offsets": w.offsets, "sequence_ids": w.sequence_ids,
                                                  "start": start, "starts": starts, "lengths": lengths})
                for w, start in zip(windows, starts)]

    def forward(self, batch, features, options):
        out = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        start, end = out.start_logits.float().cpu(), out.end_logits.float().cpu()  # [B, T] each
        return [(start[row, :len(f.ids)], end[row, :len(f.ids)]) for row, f in enumerate(features)]

    def finish(self, parsed, features, outputs, options):
        context = parsed[1]
        best: tuple[float, int, int, float] | None = None  # (logit sum, char start, char end, probability)
        null_score, null_probability = float("inf"), 0.0
        for window, (feature, (start_logits, end_logits)) in enumerate(zip(features, outputs)):
            data = feature.data
            # Google's rule: the no-answer score is the smallest [CLS] score over the windows.
            if float(start_logits[0] + end_logits[0]) < null_score:
                null_score = float(start_logits[0] + end_logits[0])
                null_probability = float(start_logits.softmax(-1)[0] * end_logits.softmax(-1)[0])
            context_columns = [c for c, s in enumerate(data["sequence_ids"]) if s == 1]
            if not context_columns:
                continue
            first = context_columns[0]
            columns = torch.tensor(context_columns)
            k = min(N_BEST, len(context_columns))
            top_starts = columns[start_logits[columns].topk(k).indices].tolist()
            top_ends = columns[end_logits[columns].topk(k).indices].tolist()
            start_probs, end_probs = start_logits.softmax(-1), end_logits.softmax(-1)
            for s in top_starts:
                if max_context_window(data["start"] + s - first, data["starts"], data["lengths"]) != window:
                    continue
                for e in top_ends:
                    if e < s or e - s + 1 > options["max_answer_tokens"]:
                        continue
                    score = float(start_logits[s] + end_logits[e])
                    if best is None or score > best[0]:
                        best = (score, data["offsets"][s][0], data["offsets"][e][1],
                                float(start_probs[s] * end_probs[e]))
        if best is None or (options["allow_no_answer"] and null_score - best[0] > options["null_threshold"]):
            return {"answer": "", "start": None, "end": None, "score": null_probability}
        _, begin, end, probability = best
        return {"answer": context[begin:end], "start": begin, "end": end, "score": probability}


# --- embed -----------------------------------------------------------------------------------------------

POOLINGS = ("cls", "mean", "max")


class EmbedPipeline(Pipeline):
    """Sentence vectors from any model's encoder.

    Pooling over real tokens only (padding never counts): "cls" (the [CLS] hidden state), "mean" (average of
    every real token, specials included, as sentence-transformers does) or "max" (per-feature maximum);
    `layer` picks the hidden state (-1 last, 0 embeddings); `normalize` scales vectors to unit length.
    Raw pretrained BERT vectors are poorly calibrated for cosine similarity (all pairs score high); compare
    ranks, or use a model trained for sentence embeddings (e.g. all-MiniLM-L6-v2) — see docs/serving.md.
    """

    task = "embed"
    defaults = {"pooling": "mean", "normalize": False, "layer": -1}
    probe_inputs = ["A man is eating food.", "A cat sits on the mat.", "The stock market fell sharply today."]
    probe_tolerance = BF16_COSINE_TOLERANCE

    def validate_options(self, options):
        if options["pooling"] not in POOLINGS:
            raise InputError(f"pooling must be one of {POOLINGS}, got {options['pooling']!r}")
        if not isinstance(options["normalize"], bool):
            raise InputError("normalize must be true or false")
        layers = self.config.num_hidden_layers
        layer = options["layer"]
        if isinstance(layer, bool) or not isinstance(layer, int) or not -layers - 1 <= layer <= layers:
            raise InputError(f"layer must be an integer in [{-layers - 1}, {layers}] (-1 = last), got {layer!r}")

    def parse(self, item):
        return text_of(item)

    def featurize(self, parsed, item, options):
        encoding = self.tokenizer.encode(parsed, truncation="longest_first", max_length=self.max_length)
        return [Feature(item, encoding.ids, encoding.type_ids)]

    def forward(self, batch, features, options):
        layer = options["layer"]
        out = self.encoder()(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                             output_hidden_states=layer != -1)
        hidden = (out.last_hidden_state if layer == -1 else out.hidden_states[layer]).float()  # [B, T, H]
        real = batch["attention_mask"].bool()[..., None]  # [B, T, 1]
        if options["pooling"] == "cls":
            vectors = hidden[:, 0]
        elif options["pooling"] == "mean":
            vectors = (hidden * real).sum(1) / real.sum(1).clamp(min=1)  # [B, T, H] -> [B, H]
        else:
            vectors = hidden.masked_fill(~real, float("-inf")).max(1).values  # [B, T, H] -> [B, H]
        if options["normalize"]:
            vectors = F.normalize(vectors, dim=-1)
        return list(vectors.cpu())

    def finish(self, parsed, features, outputs, options):
        return {"embedding": outputs[0].tolist()}

    def probe_deviation(self, reference, candidate):
        return max(1.0 - float(F.cosine_similarity(a, b, dim=0)) for a, b in zip(reference, candidate))

    def encode(self, texts: Sequence[str], **options: Any) -> np.ndarray:
        """Vectors of `texts` as one float32 array [N, H] (no JSON lists in between)."""
        merged = self.check_options(options)
        parsed = [self.parse(t) for t in texts]
        features = [f for index, value in enumerate(parsed) for f in self.featurize(value, index, merged)]
        if not features:
            return np.zeros((0, self.config.hidden_size), dtype=np.float32)
        return torch.stack(self.run_features(features, merged, self.precision)).numpy()


# --- loading ---------------------------------------------------------------------------------------------

PIPELINES: dict[str, type[Pipeline]] = {
    cls.task: cls for cls in (FillMaskPipeline, ClassifyPipeline, TagPipeline, AnswerPipeline, EmbedPipeline)
}
TASKS = tuple(PIPELINES)
# Which model class carries the head each task needs (embed works with every model's encoder).
HEAD_CLASSES: dict[str, type[BertPretrainedModel]] = {
    "fill-mask": BertForPretraining, "classify": BertForSequenceClassification,
    "tag": BertForTokenClassification, "answer": BertForQuestionAnswering,
}


def supported_tasks(model: BertPretrainedModel) -> list[str]:
    """The tasks a loaded model can serve, in `TASKS` order (always including embed)."""
    return [task for task in TASKS if task == "embed" or isinstance(model, HEAD_CLASSES[task])]


def check_task(task: str) -> None:
    if task not in PIPELINES:
        raise InputError(f"unknown task {task!r}; choose one of {list(TASKS)}")


def load_pipeline(model_dir: str | Path, task: str, **options: Any) -> Pipeline:
    """Load a model directory for one task.

    Args:
        model_dir: a saved model (config.json, weights, vocab.txt, tokenizer_config.json).
        task: one of `TASKS`.
        **options: `Pipeline` keyword arguments (device, precision, batch_size, max_length, stride).

    Raises:
        CheckpointError: the directory lacks what the task needs (tokenizer, head, labels), naming it.
    """
    check_task(task)
    config, architecture = read_config(model_dir)
    if task in HEAD_CLASSES and architecture != HEAD_CLASSES[task].__name__:
        needs = HEAD_CLASSES[task].__name__
        raise CheckpointError(f"{model_dir}: config.json names architecture {architecture or 'BertModel'}, but "
                              f"{task} needs a {needs} checkpoint; use a model fine-tuned for {task}, or task "
                              f"'embed'")
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    try:
        return PIPELINES[task](model, tokenizer, **options)
    except CheckpointError as error:
        raise CheckpointError(f"{model_dir}: {error}") from None


def load_pipelines(model_dir: str | Path, tasks: Sequence[str] | None = None,
                   **options: Any) -> dict[str, Pipeline]:
    """Every pipeline the model supports (or the `tasks` named), sharing one loaded model."""
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    available = supported_tasks(model)
    chosen = list(tasks) if tasks else available
    for task in chosen:
        check_task(task)
        if task not in available:
            raise CheckpointError(f"{model_dir}: a {type(model).__name__} cannot serve {task}; it supports "
                                  f"{available}")
    pipelines = {}
    for task in chosen:
        try:
            pipelines[task] = PIPELINES[task](model, tokenizer, **options)
        except CheckpointError as error:
            raise CheckpointError(f"{model_dir}: {error}") from None
    return pipelines


# --- streams (bertforge predict) -------------------------------------------------------------------------

def read_line(line: str, source: str, number: int) -> Any:
    """A JSONL object line as a dict, any other line as raw text (trailing newline removed)."""
    text = line.rstrip("\r\n")
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"line starts with '{{' but is not valid JSON ({error.msg}); fix it or send plain "
                            "text", source, number) from None
        if not isinstance(value, dict):
            raise DataError("expected a JSON object", source, number)
        return value
    return text


def predict_stream(pipeline: Pipeline, lines: Iterable[str], out: IO[str], *, source: str = "<stdin>",
                   chunk_size: int = 256, **options: Any) -> int:
    """Run `pipeline` over lines of text or JSONL and write one JSON result per input line.

    Each non-blank line is either raw text or a JSON object (`{"text": ...}`, `{"text": ..., "text_pair": ...}`,
    `{"question": ..., "context": ...}`); blank lines are skipped. An object's "id" field is copied into its
    result. Lines are processed in chunks of `chunk_size`, so memory stays bounded on endless input.

    Returns:
        The number of results written.

    Raises:
        DataError: a line is malformed or its input invalid (names `source` and the 1-based line).
    """
    merged = pipeline.check_options(options)
    written = 0
    pending: list[tuple[int, Any, Any]] = []  # (line number, parsed input, id)

    def flush() -> None:
        nonlocal written
        if not pending:
            return
        try:
            results = pipeline.run_parsed([p for _, p, _ in pending], merged)
        except InputError as error:
            # Inputs fail one at a time only in featurize; name the line by re-running them singly.
            for number, parsed, _ in pending:
                try:
                    pipeline.run_parsed([parsed], merged)
                except InputError as single:
                    raise DataError(str(single).removeprefix("input 0: "), source, number) from None
            raise DataError(str(error), source) from None
        for (_, _, ident), result in zip(pending, results):
            if ident is not None:
                result = {"id": ident, **result}
            out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()
        written += len(pending)
        pending.clear()

    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        value = read_line(line, source, number)
        try:
            parsed = pipeline.parse(value)
        except InputError as error:
            raise DataError(str(error), source, number) from None
        pending.append((number, parsed, value.get("id") if isinstance(value, dict) else None))
        if len(pending) >= chunk_size:
            flush()
    flush()
    return written


__all__ = [
    "AnswerPipeline", "BF16_COSINE_TOLERANCE", "BF16_PROBABILITY_TOLERANCE", "ClassifyPipeline",
    "EmbedPipeline", "FillMaskPipeline", "Pipeline", "PIPELINES", "TASKS", "TagPipeline", "load_pipeline",
    "load_pipelines", "predict_stream", "supported_tasks",
]
