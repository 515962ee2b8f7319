"""`BertConfig`: the architecture of one BERT, with presets and JSON round trip; `EncoderConfig`, what every
encoder's config shares (label names, JSON). ModernBERT's config is `model.config.modernbert`.

Field names equal the keys of a Hugging Face BERT `config.json`, so the file we write is the file they read.
Keys that only a foreign tool writes (`model_type`, `transformers_version`, ...) are stripped by
`bertforge.interop.huggingface` before they reach this class; here an unknown key is a user error.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Self

from bertforge.errors import ConfigError

HIDDEN_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
POSITION_EMBEDDING_TYPES = ("absolute", "sinusoidal")
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


class EncoderConfig:
    """What the configs of every encoder share: label names (`id2label`, `label2id`, `problem_type`), the deeper
    classifier's widths, the layers a task head reads (`feature_layers`), and the JSON round trip whose keys are the dataclass's fields (an unknown key is a user error naming the class)."""

    id2label: dict[int, str] | None
    label2id: dict[str, int] | None
    problem_type: str | None
    label_thresholds: list[float] | None
    classifier_hidden_sizes: list[int]
    feature_layers: list[int] | None
    num_hidden_layers: int

    def check_classifier(self, need) -> None:
        """Validate the deeper classifier's widths (`model.heads.build_classifier`) and the layers whose hidden
        states a task head reads concatenated (`model.heads.token_features`): indices into the encoder's L + 1
        hidden states, 0 the embeddings, -1 the last layer."""
        need(len(self.classifier_hidden_sizes) <= 3 and all(int(w) > 0 for w in self.classifier_hidden_sizes),
             "classifier_hidden_sizes", "give at most 3 positive widths, e.g. [128]")
        if self.feature_layers is not None:
            layers = self.num_hidden_layers
            need(isinstance(self.feature_layers, (list, tuple)) and len(self.feature_layers) > 0
                 and all(isinstance(i, int) and not isinstance(i, bool) and -layers - 1 <= i <= layers
                         for i in self.feature_layers),
                 "feature_layers", f"give layer indices in [-{layers + 1}, {layers}] (0 = embeddings, -1 = last "
                 "layer), or leave it unset to read the last layer")
            self.feature_layers = list(self.feature_layers)

    def check_labels(self, need) -> None:
        """Validate and normalise the label maps and thresholds; `need(cond, field, fix)` raises the config's
        error."""
        if self.label_thresholds is not None:
            need(len(self.label_thresholds) > 0 and all(0.0 <= float(t) <= 1.0 for t in self.label_thresholds),
                 "label_thresholds", "give one threshold in [0, 1] or one per label, or leave it unset")
            self.label_thresholds = [float(t) for t in self.label_thresholds]
        # JSON turns int keys into strings; normalise both label maps so either spelling loads.
        label_fix = ("give the label ids 0..N-1 as keys (strings in config.json), in the order the model was "
                     'trained with, e.g. "id2label": {"0": "negative", "1": "positive"} (and "label2id" the '
                     "other way round), or remove both maps")
        if self.id2label is not None:
            need(isinstance(self.id2label, dict) and _is_ids(self.id2label.keys()), "id2label", label_fix)
        if self.label2id is not None:
            need(isinstance(self.label2id, dict) and _is_ids(self.label2id.values()), "label2id", label_fix)
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}
            if self.id2label is None:
                self.id2label = {v: k for k, v in self.label2id.items()}

    @property
    def num_labels(self) -> int:
        if self.problem_type == "regression":
            return 1
        return len(self.id2label) if self.id2label else 2

    @property
    def label_names(self) -> list[str]:
        """Label names in id order (`LABEL_0`... when none were given)."""
        if self.id2label:
            return [self.id2label[i] for i in range(len(self.id2label))]
        return [f"LABEL_{i}" for i in range(self.num_labels)]

    def with_labels(self, names: list[str], problem_type: str | None = None) -> Self:
        """A copy carrying these label names (id order) and problem type."""
        id2label = {i: str(n) for i, n in enumerate(names)}
        return dataclasses.replace(self, id2label=id2label, label2id={v: k for k, v in id2label.items()},
                                   problem_type=problem_type or self.problem_type)

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

    # --- serialisation -------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["id2label"] is not None:
            data["id2label"] = {str(k): v for k, v in data["id2label"].items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> Self:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown {cls.__name__} key(s) {unknown}; known keys are {sorted(known)}. "
                              "Remove or rename them.")
        try:
            return cls(**data)
        except ConfigError as exc:
            if source == "config":
                raise
            raise ConfigError(f"{source}: {exc}") from None

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> Self:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"{os.fspath(path)}: no such config file; a model directory needs config.json") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{os.fspath(path)}: cannot read as JSON ({exc}); fix or replace the file") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{os.fspath(path)}: expected a JSON object of config keys")
        return cls.from_dict(data, source=os.fspath(path))


@dataclass
class BertConfig(EncoderConfig):
    """Architecture and head settings of a BERT model.

    `position_embedding_type="sinusoidal"` fills the position table with the fixed sines and cosines of the
    original Transformer and freezes it; the table is still saved, so other BERT loaders read it as a learned
    table and compute the same outputs. Task fields (`id2label`, `problem_type`, `classifier_*`) are used
    by the task models and ignored by the bare encoder.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    # Task heads.
    classifier_dropout: float | None = None
    problem_type: str | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # Classification head: [] = one linear layer (the paper's); otherwise widths of hidden layers (1-3).
    classifier_hidden_sizes: list[int] = field(default_factory=list)
    # Feature-based use: which encoder layers feed the head (e.g. [-1, -2, -3, -4], concatenated); None =
    # the usual pooled [CLS] / last layer. `freeze_encoder` keeps the encoder fixed while the head trains.
    feature_layers: list[int] | None = None
    freeze_encoder: bool = False
    # Multi-label classification: the decision threshold per label (one value for all, or one per label),
    # tuned on dev by fine-tuning and applied by every consumer; None = 0.5.
    label_thresholds: list[float] | None = None
    # Token classification: a linear-chain CRF over the tagger's scores (transitions constrained by the
    # BIO/IOBES scheme of the label names), decoded with Viterbi.
    use_crf: bool = False
    architectures: list[str] | None = None

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"BertConfig.{name}={getattr(self, name)!r} is invalid: {fix}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
                 "use a positive integer")
        need(self.hidden_size % self.num_attention_heads == 0, "hidden_size",
             f"must be a multiple of num_attention_heads ({self.num_attention_heads})")
        need(self.hidden_act in HIDDEN_ACTIVATIONS, "hidden_act", f"use one of {HIDDEN_ACTIVATIONS}")
        need(self.position_embedding_type in POSITION_EMBEDDING_TYPES, "position_embedding_type",
             f"use one of {POSITION_EMBEDDING_TYPES}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            need(0.0 <= float(getattr(self, name)) < 1.0, name, "use a probability in [0, 1)")
        if self.classifier_dropout is not None:
            need(0.0 <= float(self.classifier_dropout) < 1.0, "classifier_dropout", "use a probability in [0, 1)")
        need(float(self.layer_norm_eps) > 0, "layer_norm_eps", "use a small positive number such as 1e-12")
        need(0 <= self.pad_token_id < self.vocab_size, "pad_token_id", "use an id inside the vocabulary")
        need(self.problem_type is None or self.problem_type in PROBLEM_TYPES, "problem_type",
             f"use one of {PROBLEM_TYPES} or leave it unset")
        self.check_classifier(need)
        self.check_labels(need)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def head_dropout(self) -> float:
        """Dropout before a task head: `classifier_dropout` when set, else `hidden_dropout_prob`."""
        return self.classifier_dropout if self.classifier_dropout is not None else self.hidden_dropout_prob

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """One of `PRESETS` (tiny ... large), with field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)} or a model directory")
        return cls(**{**PRESETS[name], **overrides})


def _is_ids(ids) -> bool:
    """Whether label ids (ints or their strings, as JSON keys are) are exactly 0..N-1."""
    numbers = {str(i).strip() for i in ids if not isinstance(i, bool)}
    return all(n.isdigit() for n in numbers) and {int(n) for n in numbers} == set(range(len(list(ids))))


def _sizes(layers: int, hidden: int, heads: int) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": 4 * hidden}


# The architectures of the BERT paper and of Google's smaller released BERTs (Turc et al., 2019).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": _sizes(2, 128, 2),
    "mini": _sizes(4, 256, 4),
    "small": _sizes(4, 512, 8),
    "medium": _sizes(8, 512, 8),
    "base": _sizes(12, 768, 12),
    "large": _sizes(24, 1024, 16),
}
