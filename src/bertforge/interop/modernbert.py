"""Hugging Face ModernBERT checkpoints: parameter-name table (both directions), config keys, architecture names.

The ModernBERT counterpart of `interop.huggingface` (same functions, same contract): our parameter names
(`embeddings.word`, `encoder.layers.3.attention.qkv`, a task model's encoder under `bert.`) against
transformers' (`embeddings.tok_embeddings`, `layers.3.attn.Wqkv`, a task model's encoder under `model.`).
A test proves the table bijective and complete against transformers' own state dicts.

config.json: the released checkpoints spell the rotary bases `global_rope_theta` / `local_rope_theta`;
transformers 5 writes `rope_parameters` per layer type instead (and reads both). We read both and write the
first spelling, which every transformers since 4.48 reads.
"""

from __future__ import annotations

import re
from typing import Any

from bertforge.errors import ConfigError
from bertforge.interop.huggingface import (
    CRF_KEYS,
    DEEPER_CLASSIFIER_KEYS,
    HF_ONLY_CONFIG_KEYS,
    compile_pattern,
    translate,
)

MODEL_TYPE = "modernbert"

MODEL_NAME = "ModernBERT"  # in messages

# (ours, theirs) — `{i}` is a layer index; each applies to `.weight` and `.bias` suffixes alike.
KEY_TABLE: tuple[tuple[str, str], ...] = (
    ("embeddings.word", "embeddings.tok_embeddings"),
    ("embeddings.norm", "embeddings.norm"),
    ("encoder.layers.{i}.attention_norm", "layers.{i}.attn_norm"),
    ("encoder.layers.{i}.attention.qkv", "layers.{i}.attn.Wqkv"),
    ("encoder.layers.{i}.attention.output", "layers.{i}.attn.Wo"),
    ("encoder.layers.{i}.feed_forward_norm", "layers.{i}.mlp_norm"),
    ("encoder.layers.{i}.feed_forward.up", "layers.{i}.mlp.Wi"),
    ("encoder.layers.{i}.feed_forward.down", "layers.{i}.mlp.Wo"),
    ("encoder.norm", "final_norm"),
    # Heads (task models keep the encoder under `bert.`, transformers under `model.`).
    ("head.dense", "head.dense"),
    ("head.norm", "head.norm"),
    ("classifier", "classifier"),
    *DEEPER_CLASSIFIER_KEYS,
    # ColBERT's projection, where PyLate's Dense module keeps it (`interop.colbert` adds it to the stored tensors).
    ("projection", "linear"),
)
# Parameters whose full name is not `<module>.weight|bias`: the MLM decoder's bias (its weight is the tied
# word-embedding matrix), and the tagger's CRF, whose names pass through as BERT's do.
EXACT_KEYS: tuple[tuple[str, str], ...] = (("decoder_bias", "decoder.bias"), *CRF_KEYS)
# Keys in their files that carry nothing of their own: the decoder weight, tied to the word embeddings.
REDUNDANT_HF_KEYS = re.compile(r"^decoder\.weight$")
ENCODER_PREFIX, THEIR_ENCODER_PREFIX = "bert.", "model."

# Config keys transformers (or the ModernBERT training code) write that our encoder does not need: flash
# attention and compile switches, the sparse-prediction training trick, unpadding flags (our layouts decide),
# and spellings of facts held elsewhere (`layer_norm_eps` beside `norm_eps`).
HF_ONLY_MODERNBERT_KEYS = (HF_ONLY_CONFIG_KEYS - {"bos_token_id", "eos_token_id", "sep_token_id"}) | {
    "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index", "reference_compile",
    "repad_logits_with_grad", "unpad_inputs", "unpad_no_grad", "position_embedding_type", "layer_norm_eps",
    "head_dim", "cls_token", "sep_token", "pad_token", "mask_token",
}
ROPE_KINDS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}

# Our class names; transformers spells them the same. Their heads we do not have load as the encoder.
ARCHITECTURES = ("ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
                 "ModernBertForTokenClassification", "ModernBertForQuestionAnswering", "ModernBertForMultipleChoice")
# Their span head is sized by num_labels (start and end: 2), ours is fixed at 2 whatever labels the config
# carries (one fine-tuned from a classifier keeps that classifier's).
SPAN_ARCHITECTURE, SPAN_OUTPUTS = "ModernBertForQuestionAnswering", 2
ENCODER_ARCHITECTURE = "ModernBertModel"
# Our classes saved as one of theirs (the rest of them is in files beside: sentence-transformers' SPLADE pooling,
# PyLate's projection and settings; `checkpoint_format.read_config` reads such a directory back as ours).
SAVED_AS = {"ModernBertForSparseEmbedding": "ModernBertForMaskedLM", "ModernBertForColBERT": ENCODER_ARCHITECTURE}

_OURS_TO_HF = [(re.compile(compile_pattern(o)), t) for o, t in KEY_TABLE]
_HF_TO_OURS = [(re.compile(compile_pattern(t)), o) for o, t in KEY_TABLE]


def to_hf_key(key: str) -> str:
    """Our parameter name -> transformers'. `bert.` becomes `model.`; unknown keys raise."""
    prefix, rest = (THEIR_ENCODER_PREFIX, key.removeprefix(ENCODER_PREFIX)) if key.startswith(ENCODER_PREFIX) \
        else ("", key)
    name = translate(rest, _OURS_TO_HF, dict(EXACT_KEYS))
    if name is None:
        raise KeyError(f"no Hugging Face ModernBERT name for parameter {key!r}")
    return prefix + name


def from_hf_key(key: str) -> str | None:
    """transformers' ModernBERT parameter name -> ours, or None when the table has no entry for it."""
    prefix, rest = (ENCODER_PREFIX, key.removeprefix(THEIR_ENCODER_PREFIX)) \
        if key.startswith(THEIR_ENCODER_PREFIX) else ("", key)
    name = translate(rest, _HF_TO_OURS, {t: o for o, t in EXACT_KEYS})
    return None if name is None else prefix + name


def is_redundant_hf_key(key: str) -> bool:
    return bool(REDUNDANT_HF_KEYS.match(key))


def _rope_fields(rope: Any, source: str) -> dict[str, float]:
    """`rope_parameters` ({layer type: {"rope_type": "default", "rope_theta": θ}}) -> our two θ fields."""
    if not isinstance(rope, dict):
        raise ConfigError(f"{source}: rope_parameters must be an object of layer types; got {rope!r}")
    fields = {}
    for kind, params in rope.items():
        if kind not in ROPE_KINDS or not isinstance(params, dict):
            raise ConfigError(f"{source}: rope_parameters[{kind!r}] is not understood; expected "
                              f"{sorted(ROPE_KINDS)} each with rope_theta")
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"{source}: rope_parameters[{kind!r}].rope_type is {params['rope_type']!r}; "
                              "bertforge runs the plain rotary embedding only ('default'): remove the scaling")
        if "rope_theta" in params:
            fields[ROPE_KINDS[kind]] = float(params["rope_theta"])
    return fields


def config_from_hf(data: dict[str, Any], source: str) -> tuple[dict[str, Any], str | None]:
    """Strip foreign keys from a ModernBERT config.json; returns (ModernBertConfig fields, our architecture
    name or None)."""
    if data.get("model_type") != MODEL_TYPE:
        raise ConfigError(f"{source}: model_type is {data.get('model_type')!r}, not {MODEL_TYPE!r}")
    if data.get("tie_word_embeddings", True) is not True:
        raise ConfigError(f"{source}: tie_word_embeddings is false; bertforge's ModernBERT ties the masked-LM "
                          "decoder to the word embeddings, as every released ModernBERT does")
    if data.get("rope_scaling") is not None:
        raise ConfigError(f"{source}: rope_scaling is set; bertforge runs the plain rotary embedding only: "
                          "remove it")
    fields = {k: v for k, v in data.items()
              if k not in HF_ONLY_MODERNBERT_KEYS and k not in ("architectures", "rope_parameters", "rope_scaling")}
    if data.get("rope_parameters") is not None:
        fields.update(_rope_fields(data["rope_parameters"], source))
    if "num_labels" in data and "id2label" not in data and data.get("problem_type") != "regression":
        fields["id2label"] = {i: f"LABEL_{i}" for i in range(int(data["num_labels"]))}
    architecture = None
    for name in data.get("architectures") or []:
        architecture = name if name in ARCHITECTURES else ENCODER_ARCHITECTURE
        break
    return fields, architecture


def config_to_hf(fields: dict[str, Any], architecture: str) -> dict[str, Any]:
    """Our config fields plus what a Hugging Face loader needs to recognise the directory."""
    data = {k: v for k, v in fields.items() if v is not None and k != "architectures"}
    data["model_type"] = MODEL_TYPE
    data["architectures"] = [architecture if architecture in ARCHITECTURES else SAVED_AS.get(architecture,
                                                                                              ENCODER_ARCHITECTURE)]
    data["tie_word_embeddings"] = True
    if data["architectures"] == [SPAN_ARCHITECTURE]:
        for key in ("id2label", "label2id", "problem_type"):
            data.pop(key, None)
        data["num_labels"] = SPAN_OUTPUTS
    elif "id2label" in data:
        data["num_labels"] = len(data["id2label"])
    elif data.get("problem_type") == "regression":
        data["num_labels"] = 1
    return data
