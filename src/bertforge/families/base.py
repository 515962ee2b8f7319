"""What every task family shares: the `Family` interface, the fine-tuning model base and input settings.

A family (classification, tagging, question answering, multiple choice, pretraining) is one object that
every consumer asks: the fine-tuning run, training-time evaluation, `bertforge evaluate`, `bertforge
predict`, the Python pipelines, the server, export and the CLI's choices. None of them tests a family's
name. Each family module defines its model class and a `Family` subclass; `families.registry` holds one
instance of each under its name and aliases.

The one path from input to answer, in the order a consumer calls it:

    examples = family.read(path, ...)           # a data file (evaluate, fine-tuning)
    example  = family.parse(item)               # one JSON input (predict, pipelines, server)
    features = family.features(examples, tokenizer, settings, report)
    outputs  = evaluation.run_features(model, features, family.forward, ...)   # length-sorted batches
    results  = family.decode(examples, features, outputs, options, config)     # one JSON dict per example
    metrics  = family.score(examples, results)                                  # evaluate only

`Family` holds that path and nothing else, so a family that only runs (predict, embed, serve) writes
`parse`, `features`, `forward` (or keeps the default) and `decode`, and one that is evaluated adds `read`,
`score` and `record`. What training alone asks (the label vocabulary and head of a run, the settings it
honours, the model class it trains, the one loss) is the family's companion `family.training`, a
`FamilyTraining`: its defaults train nothing, so a family that does not train overrides none of it.
`training.objective_for(config)` gives the one `Objective` (`counts(batch)`, `loss_terms(output, batch)`),
and the model's own `forward(labels=...)` computes its loss with the same function. What a run reads and how
it builds inputs is a `families.task.TaskDescription`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.finetuning import DataReport, Feature, FinetuneBatch
from bertforge.errors import ConfigError, InputError
from bertforge.model.bert import BertModel, BertOutput, BertPretrainedModel
from bertforge.model.config import BertConfig
from bertforge.model.heads import needs_hidden_states
from bertforge.tokenization.normalizer import is_blank
from bertforge.tokenization.tokenizer import Tokenizer

# The positions of BERT's released checkpoints: the window the families' defaults were chosen for.
BERT_POSITIONS = 512

# Problem kinds of a task (the names Hugging Face's `problem_type` uses); classification has all three.
SINGLE_LABEL, MULTI_LABEL, REGRESSION = "single_label_classification", "multi_label_classification", "regression"


@dataclass
class InputSettings:
    """How examples become model inputs; saved in `finetuning.json` so every consumer rebuilds them alike.

    max_seq_length: tokens per window, special tokens included.
    doc_stride: step between window starts over the long segment (None = half a window); see
        `tokenization.windows`.
    max_query_length: QA: longer questions are cut to this many tokens.
    tag_scheme, label_policy: tagging: the label scheme of the model ("BIO"/"IOBES") and which sub-tokens
        carry a word's label in training ("first"/"all").
    """

    max_seq_length: int = 128
    doc_stride: int | None = None
    max_query_length: int = 64
    tag_scheme: str = "BIO"
    label_policy: str = "first"

    def __post_init__(self) -> None:
        if not isinstance(self.max_seq_length, int) or self.max_seq_length < 8:
            raise ConfigError(f"max_seq_length={self.max_seq_length!r}: use at least 8 tokens")
        if self.doc_stride is not None and (not isinstance(self.doc_stride, int) or self.doc_stride < 1):
            raise ConfigError(f"doc_stride={self.doc_stride!r}: use a positive number of tokens (or leave it unset)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FineTuningModel(BertPretrainedModel):
    """Holds `self.bert`; with `config.freeze_encoder` the encoder is fixed (no gradients, no dropout).

    Freezing gives the feature-based approach of the BERT paper (section 5.3): the head learns on top of
    fixed contextual features, optionally concatenated from several layers (`config.feature_layers`).
    """

    encoder_prefix = "bert."

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=add_pooling_layer)
        if config.freeze_encoder:
            self.bert.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.config.freeze_encoder:
            self.bert.eval()
        return self

    def constant_outputs(self) -> dict[str, Any]:
        """Output fields that do not depend on the input (a CRF's transition scores): what an engine running
        the exported graph adds to the graph's outputs."""
        return {}

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, output_attentions=False,
               output_hidden_states=False) -> BertOutput:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_encoder):
            return self.bert(input_ids, token_type_ids, attention_mask,
                             output_hidden_states=output_hidden_states or needs_hidden_states(self.config),
                             output_attentions=output_attentions)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in the precision given (decoders run it on float64 logits)."""
    shifted = scores - scores.max(axis=-1, keepdims=True)
    return np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)


def mean_loss(terms: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A model's `loss` from the family objective: each term's sum over its count, added up."""
    return sum(total / count.clamp(min=1.0) for total, count in terms.values())


@dataclass(frozen=True)
class LossSettings:
    """How a single-label head (classification, tagging) weighs its cross-entropy in training.

    class_weights: one weight per label (id order) multiplying each example's loss by its gold label's
        weight (None: all 1); fine-tuning can compute them from the training counts ("balanced").
    focal_gamma: focal loss (Lin et al., 2017): each loss is multiplied by (1 - p_gold) ** gamma, so
        examples the model already gets right count less; 0 is the plain cross-entropy.
    contrastive: the embedding family's loss settings (`families.contrastive.ContrastiveLoss`); other
        families refuse them.
    """

    class_weights: tuple[float, ...] | None = None
    focal_gamma: float = 0.0
    contrastive: Any = None  # the embedding family's `ContrastiveLoss` (None: its defaults)

    def __post_init__(self) -> None:
        if self.class_weights is not None and (not self.class_weights or any(
                not np.isfinite(w) or w < 0 for w in self.class_weights)):
            raise ConfigError(f"class_weights={list(self.class_weights)}: give one non-negative number per label")
        if not (np.isfinite(self.focal_gamma) and self.focal_gamma >= 0):
            raise ConfigError(f"focal_gamma={self.focal_gamma!r}: use a number >= 0 (2 is the paper's)")

    @property
    def plain(self) -> bool:
        return self.class_weights is None and self.focal_gamma == 0 and self.contrastive is None

    def check_labels(self, num_labels: int) -> None:
        """ConfigError when the weights do not give one number per label of the model."""
        if self.class_weights is not None and len(self.class_weights) != num_labels:
            raise ConfigError(f"class_weights has {len(self.class_weights)} values but the model has {num_labels} "
                              "labels; give one weight per label in label order, or 'balanced' to compute them")


def label_loss(logits: torch.Tensor, labels: torch.Tensor, loss: LossSettings | None = None,
               ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, count) of the cross-entropy of logits [N, C] against labels [N], rows labelled `ignore_index`
    left out; with `loss`, class-weighted and/or focal.

    The count is the number of labelled rows, weighted or not, so a class weight scales that row's share of
    the mean instead of being normalised away (PyTorch's weighted mean divides by the summed weights).
    """
    labels = labels.long()
    keep = labels != ignore_index
    count = keep.sum().float()
    if loss is None or loss.plain:
        return F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction="sum"), count
    logits, labels = logits[keep].float(), labels[keep]
    log_p = F.log_softmax(logits, dim=-1).gather(-1, labels[:, None]).squeeze(-1)  # [N'] log p(gold)
    per_row = -log_p
    if loss.focal_gamma:
        per_row = per_row * (1.0 - log_p.exp()).clamp(min=0.0) ** loss.focal_gamma
    if loss.class_weights is not None:
        per_row = per_row * logits.new_tensor(loss.class_weights)[labels]
    return per_row.sum(), count


def symmetric_kl(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """Sum over rows of (KL(p_a || p_b) + KL(p_b || p_a)) / 2 of the softmax of logits [N, C]: R-Drop's
    consistency term between two dropout passes (Liang et al., 2021)."""
    log_a, log_b = F.log_softmax(logits_a.float(), dim=-1), F.log_softmax(logits_b.float(), dim=-1)
    return 0.5 * ((log_a.exp() * (log_a - log_b)).sum() + (log_b.exp() * (log_b - log_a)).sum())


def check_text(value: Any, name: str) -> str:
    """`value` if it is a string with some text, else an InputError naming the field.

    Blank means nothing the tokenizer would read: only whitespace, or characters its cleaning deletes
    (zero-width and other control/format characters such as "\u200b" or "\x00"); such text is refused
    with the same message as an empty string, rather than classified from [CLS] [SEP] alone.
    """
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {type(value).__name__}")
    if is_blank(value):
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


def check_number(options: Mapping[str, Any], name: str, low: float | None = None, high: float | None = None,
                 integer: bool = False) -> None:
    """An option that must be a number (an integer with `integer`) in [low, high]."""
    value = options[name]
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or (low is not None and value < low) \
            or (high is not None and value > high):
        what = "an integer" if integer else "a number"
        bounds = f" from {low} to {high}" if low is not None and high is not None else ""
        raise InputError(f"{name} must be {what}{bounds}, got {value!r}")


class Objective:
    """What the training loop asks of a task (every family's `objective_for` returns one):

    - `counts(batch)`: each loss term's denominator from the batch alone (so a step's loss is the mean over
      the whole step however it is split into micro-batches and ranks);
    - `loss_terms(output, batch)`: {term: (sum, count)}; the model's own `forward(labels=...)` loss is
      `mean_loss` of the same terms;
    - `metrics(output, batch)`: {name: (sum, count)} logged during training;
    - `consistency(output_a, output_b, batch)`, where a family defines it: R-Drop's disagreement of two
      dropout passes, summed over the items the first loss term counts (a tensor, or (sum, count)).
    """

    def counts(self, batch: Any) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss_terms(self, output: Any, batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def metrics(self, output: Any, batch: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {}


class FamilyTraining:
    """What fine-tuning and pretraining ask of a family, and nothing else does: the companion every `Family`
    holds as `family.training`. The defaults train nothing (no objective, no labels, no settings), so a family
    that only runs overrides none of it; a family that trains subclasses it beside itself and names the
    subclass as its `training_hooks`.

    Class attributes:
        settings: the fine-tuning settings (dotted `FinetuneConfig` keys) that only some families use and this
            one honours; a run of another family that sets one is refused (`run_settings` per kind).
    """

    settings: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, family: Family):
        self.family = family

    # --- the run's shape ----------------------------------------------------------------------------
    def run_settings(self, kind: str | None) -> frozenset[str]:
        """The family-specific settings (`settings`) a run of this problem kind honours."""
        return self.settings

    def format_reader(self, format_name: str) -> dict[str, Any]:
        """Reader settings a `--format` file of this family has by default (classification: columns named
        text_a, text_b, label)."""
        return {}

    def label_names(self, examples: Sequence[Any], given: Sequence[str] | None,
                    settings: InputSettings, kind: str | None = None) -> list[str] | None:
        """The label vocabulary of a run (None when the head predicts no named labels)."""
        return None

    def head_config(self, label_names: Sequence[str] | None, kind: str | None = None) -> dict[str, Any]:
        """Config changes that shape this family's head for a run (label names, problem type)."""
        return {}

    def label_counts(self, examples: Sequence[Any], label_names: Sequence[str], settings: InputSettings) -> list[int]:
        """Training items per label (label-name order), from which "balanced" class weights are computed."""
        raise ConfigError(f"class weights computed from the data ('balanced') are not defined for {self.family.name}")

    # --- the model and its loss ---------------------------------------------------------------------
    @property
    def trained_class(self) -> type[BertPretrainedModel]:
        """The class a fine-tuning run trains (the family's model class, except where training needs more)."""
        return self.family.model_class

    def prepare_model(self, model: torch.nn.Module, task: Any, loss: LossSettings | None) -> None:
        """Give a freshly loaded training model what it takes from the task rather than its config (embedding:
        pooling, normalization, window, mini-batches); nothing for most families."""

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> Objective:
        """The one objective the training loop asks for a model of this config (`Objective`). `loss` weighs
        single-label cross-entropy (class weights, focal); a family without such a loss refuses non-plain
        settings with a ConfigError naming the option."""
        raise ConfigError(f"the {self.family.name} family has no training objective")

    def refuse_contrastive(self, loss: LossSettings | None) -> None:
        """ConfigError when a run of this (non-embedding) family was given the embedding losses' settings."""
        if loss is not None and loss.contrastive is not None:
            raise ConfigError(f"the embedding losses (head.loss, head.scale, head.symmetric, head.mini_batch_size, "
                              f"head.matryoshka_dims) apply to embedding formats, not to {self.family.name}; remove them")

    def refuse_loss_settings(self, loss: LossSettings | None) -> None:
        """ConfigError when a family without a weighted cross-entropy was given class weights, focal loss or the
        embedding losses' settings."""
        self.refuse_contrastive(loss)
        if loss is not None and not loss.plain:
            raise ConfigError(f"class weights and focal loss apply to single-label classification and tagging, "
                              f"not to {self.family.name}; remove head.class_weights / head.focal_gamma")

    def __repr__(self) -> str:
        return f"<training of {self.family.name}>"


class Family:
    """One task family's path from input to answer, asked by every consumer (training-time evaluation,
    `evaluate`, `predict`, `embed`, the pipelines and the server); what only training asks is `training`.

    Class attributes:
        name: the registry name. aliases: other names users type ("ner", "tag", "token classification").
        model_class: the `nn.Module` with this family's head (its `head_prefixes` name the head's parameters).
        also_runs_on: other classes whose models run this family as they are (sparse vectors: every masked LM).
        task: the pipeline/server route name ("classify", "tag", "answer", "choose", "fill-mask").
        default_max_seq_length: window length when a model directory has no fine-tuning record.
        served_max_seq_length: the window a model directory without this family's fine-tuning record is run
            with (capped by its position table), where it differs from the training default.
        long_inputs: the task's inputs are documents (passages, contexts): a model without this family's
            fine-tuning record that reads past BERT's 512 positions (ModernBERT: 8,192) reads them in one window
            of its own length (`served_window(family, positions)`); the windowing rule past it is unchanged.
        default_language: the scoring language of a file-format run ("auto" detects it from the data).
        input_axes: the model inputs' dimensions (ONNX dynamic axes): [B, T], or [B, C, T] for choices.
        options: decoding options and their defaults, under one name each in training, evaluate, predict and
            the server (a fine-tuning run's `[features]` setting of the same name sets it).
        kinds: the problem kinds a task of this family may have (classification: single-label, multi-label,
            regression); () when the family has one.
        formats: the `--format` names that read a file of this family, and the problem kind each gives.
        export_outputs: ONNX output names and their dynamic axes.
        runs_as_graph: whether `forward` asks the model for nothing but `export_outputs` of the three input
            tensors, so an engine that runs the exported graph (ONNX Runtime) can run the family.
        example_inputs: typical inputs (the server's OpenAPI examples).
        training_hooks: the companion class whose instance is `training` (`FamilyTraining`, or the family's own
            subclass of it): what only training asks.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    model_class: ClassVar[type[BertPretrainedModel]]
    also_runs_on: ClassVar[tuple[type, ...]] = ()
    task: ClassVar[str | None] = None
    default_max_seq_length: ClassVar[int] = 128
    served_max_seq_length: ClassVar[int | None] = None
    long_inputs: ClassVar[bool] = False
    default_language: ClassVar[str] = "en"
    input_axes: ClassVar[dict[int, str]] = {0: "batch", 1: "sequence"}
    options: ClassVar[dict[str, Any]] = {}
    kinds: ClassVar[tuple[str, ...]] = ()
    formats: ClassVar[dict[str, str | None]] = {}
    export_outputs: ClassVar[dict[str, dict[int, str]]] = {}
    runs_as_graph: ClassVar[bool] = True
    example_inputs: ClassVar[list[Any]] = []
    training_hooks: ClassVar[type[FamilyTraining]] = FamilyTraining

    def __init__(self) -> None:
        self.training = self.training_hooks(self)

    # --- configuration ------------------------------------------------------------------------------
    def check_model(self, config: BertConfig) -> None:
        """Raise CheckpointError when a model of this family lacks what decoding needs (label names...)."""

    def serves_by_default(self, config: BertConfig) -> bool:
        """Whether a model of this config offers this family's route without being asked for it (the server's
        routes, `load_pipelines` without tasks): yes, unless the family says otherwise."""
        return True

    def check_options(self, options: Mapping[str, Any], config: BertConfig | None = None) -> dict[str, Any]:
        """Defaults merged with `options`; unknown names or bad values raise InputError."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise InputError(f"unknown option(s) {unknown} for {self.task or self.name}; known: "
                             f"{sorted(self.options) or 'none'}")
        merged = {**self.options, **options}
        self.validate_options(merged)
        return merged

    def validate_options(self, options: dict[str, Any]) -> None:
        """Check option values (InputError naming the option)."""

    def directory_options(self, sentence: Any) -> dict[str, Any]:
        """The options a model directory's sentence-transformers settings (`ModelDirectory.sentence`, or None)
        make this family's defaults: pooling and normalization for embedding; {} for the others."""
        return {}

    def options_for_data(self, options: Mapping[str, Any], examples: Sequence[Any]) -> dict[str, Any]:
        """The decoding options a data set needs (QA: SQuAD v2.0 decoding when it has unanswerable
        questions); the options unchanged for most families."""
        return dict(options)

    # --- data files ---------------------------------------------------------------------------------
    default_metrics: ClassVar[tuple[str, ...]] = ("accuracy",)

    def read(self, path: str, *, part: str | None, task: Any, report: DataReport,
             labelled: bool = True) -> list[Any]:
        """Examples of a data file. `part` picks a deterministic split of it ("train"/"eval", for tasks
        that ship without a dev file); `task` is the `families.task.TaskDescription` whose `reader`
        settings (columns, separator, on_invalid ...) and `kind` the reader follows."""
        raise ConfigError(f"the {self.name} family reads no fine-tuning files")

    def metric_defaults(self, kind: str | None, reader: Any = None) -> tuple[str, ...]:
        """What a task of this kind (read with these `ReaderSettings`, when known) reports first when its
        description names no metrics."""
        return self.default_metrics

    def metric_names(self, task: Any, dev_examples: Sequence[Any] | None = None) -> tuple[str, ...]:
        """Every metric name an evaluation of `task` on `dev_examples` can report (None: on any dev set of the
        task): what `--metric` may choose."""
        return self.default_metrics

    def requested_metrics(self, task: Any, chosen: str | None, config: BertConfig) -> list[str] | None:
        """The metric names the scorer is asked for (`score(metric_names=...)`), so that the chosen one is
        computed even where it is not reported by default; None: the family's own set."""
        return None

    def check_labels(self, examples: Sequence[Any], label_names: Sequence[str] | None,
                     settings: InputSettings, origin: str = "training") -> None:
        """DataError naming the first example whose label the model does not know. `origin` says where the
        label names came from, for the message's fix: "training" (the training file's), "given" (the run's
        --labels) or "model" (a saved model's config)."""

    # --- inputs -------------------------------------------------------------------------------------
    def parse(self, item: Any) -> Any:
        """One JSON input (string, list or object) as an example; InputError naming the problem."""
        raise InputError(f"the {self.name} family takes no inputs from predict or the server")

    def windowed_texts(self, example: Any) -> list[str]:
        """The texts of a parsed example whose every token lands in some window of `features` (the server's
        cheap token floor, `inference.admission`); none for a family that truncates or refuses a long input."""
        return []

    def features(self, examples: Sequence[Any], tokenizer: Tokenizer, settings: InputSettings, *,
                 config: BertConfig, report: DataReport | None = None, training: bool = False) -> list[Feature]:
        """Model inputs of `examples`: one or more windows each (`Feature.example_index` points back)."""
        raise NotImplementedError

    # --- running ------------------------------------------------------------------------------------
    def forward(self, model: torch.nn.Module, batch: FinetuneBatch,
                options: Mapping[str, Any] | None = None) -> list[Any]:
        """Run `model` on a batch; one float32 CPU value per row, trimmed to the row's real length. `options`
        are the call's checked options, for a family whose model run depends on them (embedding's pooling
        and layer); most act in `decode` only."""
        logits = model(**batch.model_inputs()).logits.float().cpu()
        return list(logits)

    # --- outputs ------------------------------------------------------------------------------------
    def decode(self, examples: Sequence[Any], features: Sequence[Feature], outputs: Sequence[Any],
               options: Mapping[str, Any], config: BertConfig, tokenizer: Tokenizer | None = None
               ) -> list[dict[str, Any]]:
        """One JSON-ready result per example, from the outputs of its windows."""
        raise NotImplementedError

    def score(self, examples: Sequence[Any], results: Sequence[dict[str, Any]], config: BertConfig,
              **settings: Any) -> tuple[dict[str, float], dict, list[str]]:
        """(metrics, details, warnings) of `results` against the examples' gold labels.

        `settings` are the run's scoring choices a family may use: `metric_names` (classification),
        `language` (QA), `options` (the decoding options the results were decoded with); others are
        ignored."""
        raise NotImplementedError

    def calibrate(self, examples: Sequence[Any], results: Sequence[dict[str, Any]], config: BertConfig,
                  mode: str | None) -> dict[str, Any]:
        """Config changes tuned on labelled (dev) results, e.g. multi-label decision thresholds; `mode` is the
        run's choice ("global", "per_label", None for none). Most families have nothing to tune: {}."""
        return {}

    def record(self, example: Any, result: dict[str, Any]) -> dict[str, Any]:
        """What `evaluate` writes per example: the example's own fields, its gold label, then the result."""
        raise NotImplementedError

    def labelled(self, examples: Sequence[Any]) -> bool:
        """Whether every example carries a gold label (metrics need them)."""
        return all(getattr(e, "label", None) is not None for e in examples)

    def __repr__(self) -> str:
        return f"<family {self.name}>"


def served_window(family: Family, positions: int) -> int:
    """The window `family` runs a model with `positions` positions and no fine-tuning record of the family
    with: the model's own length for long inputs past BERT's 512 (`Family.long_inputs`), else its default."""
    if family.long_inputs and positions > BERT_POSITIONS:
        return positions
    return family.served_max_seq_length or family.default_max_seq_length
