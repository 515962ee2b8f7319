"""`ModernBertConfig`: the architecture of one ModernBERT (Warner et al., 2024), with presets.

Field names equal the keys of a Hugging Face ModernBERT `config.json` as the released checkpoints write them
(`global_rope_theta`, `local_rope_theta`, `global_attn_every_n_layers`, plus `layer_types` where a newer
transformers wrote it), so the file we write is the file they read. Keys only a foreign tool writes, and
newer spellings of the same facts (`rope_parameters`), are translated or stripped by
`bertforge.interop.modernbert` before they reach this class; here an unknown key is a user error.

Label names, the problem type and the JSON round trip are shared with `BertConfig` (`config.EncoderConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bertforge.errors import ConfigError
from bertforge.model.config import HIDDEN_ACTIVATIONS, PROBLEM_TYPES, EncoderConfig

# The two kinds of layer, as transformers names them in `layer_types`.
GLOBAL_ATTENTION = "full_attention"
LOCAL_ATTENTION = "sliding_attention"
LAYER_TYPES = (GLOBAL_ATTENTION, LOCAL_ATTENTION)
CLASSIFIER_POOLINGS = ("cls", "mean")


@dataclass
class ModernBertConfig(EncoderConfig):
    """Architecture and head settings of a ModernBERT model (defaults: ModernBERT-base).

    Layer i attends globally when `layer_types[i]` is "full_attention"; when `layer_types` is not given, every
    `global_attn_every_n_layers`-th layer (0, 3, 6, ...) is global and the others attend to a window of
    `local_attention` tokens (half of it each side). Global layers rotate with θ `global_rope_theta`, local
    ones with `local_rope_theta`. `*_bias` switch the biases of the linears and norms (all off in the
    released models); `decoder_bias` is the masked-LM decoder's own bias.
    """

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    bos_token_id: int | None = 50281
    eos_token_id: int | None = 50282
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    global_attn_every_n_layers: int = 3
    layer_types: list[str] | None = None
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    local_attention: int = 128
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    # Task heads: a prediction head (dense, activation, norm) then the classifier.
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    problem_type: str | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # bertforge's task settings, as `BertConfig`'s: a fixed encoder under a trained head; multi-label decision
    # thresholds; the deeper classifier; the layers a head reads, concatenated (index 0 the embeddings, -1 the
    # final-normed last layer); a tagger's CRF.
    freeze_encoder: bool = False
    label_thresholds: list[float] | None = None
    classifier_hidden_sizes: list[int] = field(default_factory=list)
    feature_layers: list[int] | None = None
    use_crf: bool = False
    architectures: list[str] | None = None

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ConfigError(f"ModernBertConfig.{name}={getattr(self, name)!r} is invalid: {fix}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings", "global_attn_every_n_layers", "local_attention"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
                 "use a positive integer")
        need(self.hidden_size % self.num_attention_heads == 0, "hidden_size",
             f"must be a multiple of num_attention_heads ({self.num_attention_heads})")
        need(self.head_size % 2 == 0, "hidden_size",
             "hidden_size / num_attention_heads must be even (rotary embeddings rotate pairs of features)")
        need(self.local_attention % 2 == 0, "local_attention",
             "use an even window (half of it on each side of a token), e.g. 128")
        for name in ("hidden_activation", "classifier_activation"):
            need(getattr(self, name) in HIDDEN_ACTIVATIONS, name, f"use one of {HIDDEN_ACTIVATIONS}")
        for name in ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"):
            need(0.0 <= float(getattr(self, name)) < 1.0, name, "use a probability in [0, 1)")
        for name in ("global_rope_theta", "local_rope_theta", "norm_eps", "initializer_range",
                     "initializer_cutoff_factor"):
            need(float(getattr(self, name)) > 0, name, "use a positive number")
        for name in ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias"):
            need(isinstance(getattr(self, name), bool), name, "use true or false")
        need(isinstance(self.pad_token_id, int) and 0 <= self.pad_token_id < self.vocab_size, "pad_token_id",
             "use an id inside the vocabulary")
        need(self.classifier_pooling in CLASSIFIER_POOLINGS, "classifier_pooling",
             f"use one of {CLASSIFIER_POOLINGS}")
        need(self.problem_type is None or self.problem_type in PROBLEM_TYPES, "problem_type",
             f"use one of {PROBLEM_TYPES} or leave it unset")
        if self.layer_types is not None:
            need(isinstance(self.layer_types, list) and len(self.layer_types) == self.num_hidden_layers
                 and all(kind in LAYER_TYPES for kind in self.layer_types), "layer_types",
                 f"give one of {LAYER_TYPES} per layer ({self.num_hidden_layers}), or leave it unset to put a "
                 "global layer every global_attn_every_n_layers")
        need(isinstance(self.freeze_encoder, bool), "freeze_encoder", "use true or false")
        need(isinstance(self.use_crf, bool), "use_crf", "use true or false")
        self.check_classifier(need)
        self.check_labels(need)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def head_dropout(self) -> float:
        """Dropout before a task's classifier."""
        return self.classifier_dropout

    @property
    def window_radius(self) -> int:
        """How far a token of a local layer sees on each side: |query - key| <= local_attention / 2."""
        return self.local_attention // 2

    @property
    def attention_kinds(self) -> list[str]:
        """Each layer's kind, "full_attention" or "sliding_attention": `layer_types`, else every
        `global_attn_every_n_layers`-th layer global (layer 0 first)."""
        if self.layer_types is not None:
            return list(self.layer_types)
        return [GLOBAL_ATTENTION if i % self.global_attn_every_n_layers == 0 else LOCAL_ATTENTION
                for i in range(self.num_hidden_layers)]

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModernBertConfig:
        """One of `PRESETS` (tiny ... large), with field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown ModernBERT preset {name!r}; choose one of {sorted(PRESETS)} or a model "
                              "directory")
        return cls(**{**PRESETS[name], **overrides})


# base and large are the released ModernBERT sizes; the smaller ones keep their shape (GeGLU width 1.5 H,
# head size 64 where it fits) for tests and CPU experiments.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"num_hidden_layers": 3, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 192},
    "mini": {"num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 384},
    "small": {"num_hidden_layers": 12, "hidden_size": 384, "num_attention_heads": 6, "intermediate_size": 576},
    "base": {"num_hidden_layers": 22, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 1152},
    "large": {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 2624},
}
