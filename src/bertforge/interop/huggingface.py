"""Hugging Face BERT checkpoints: parameter-name table (both directions), config keys, architecture names.

Our parameter names are our own (`embeddings.word`, `encoder.layers.3.feed_forward.up`); a saved model
directory must nevertheless be a valid Hugging Face BERT checkpoint. `KEY_TABLE` pairs each of our name
patterns with theirs; `to_hf_key` / `from_hf_key` apply it, and a test proves the mapping bijective and
complete against `transformers`' own state dicts.
"""

from __future__ import annotations

import re
from typing import Any

from bertforge.errors import ConfigError

MODEL_NAME = "BERT"  # in messages

# The optional deeper classifier (`classifier_hidden_sizes`) has no Hugging Face counterpart (BERT's or
# ModernBERT's): its names pass through unchanged so the directory still saves and loads here.
DEEPER_CLASSIFIER_KEYS: tuple[tuple[str, str], ...] = (("classifier.hidden.{i}", "classifier.hidden.{i}"),
                                                       ("classifier.out", "classifier.out"))
# (ours, theirs) — `{i}` is a layer index; each applies to `.weight` and `.bias` suffixes alike.
KEY_TABLE: tuple[tuple[str, str], ...] = (
    ("embeddings.word", "embeddings.word_embeddings"),
    ("embeddings.position", "embeddings.position_embeddings"),
    ("embeddings.token_type", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("encoder.layers.{i}.attention.query", "encoder.layer.{i}.attention.self.query"),
    ("encoder.layers.{i}.attention.key", "encoder.layer.{i}.attention.self.key"),
    ("encoder.layers.{i}.attention.value", "encoder.layer.{i}.attention.self.value"),
    ("encoder.layers.{i}.attention.output", "encoder.layer.{i}.attention.output.dense"),
    ("encoder.layers.{i}.attention.norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    ("encoder.layers.{i}.feed_forward.up", "encoder.layer.{i}.intermediate.dense"),
    ("encoder.layers.{i}.feed_forward.down", "encoder.layer.{i}.output.dense"),
    ("encoder.layers.{i}.feed_forward.norm", "encoder.layer.{i}.output.LayerNorm"),
    ("pooler.dense", "pooler.dense"),
    # Heads (task models keep the encoder under `bert.`, as Hugging Face does).
    ("mlm.transform", "cls.predictions.transform.dense"),
    ("mlm.norm", "cls.predictions.transform.LayerNorm"),
    ("nsp", "cls.seq_relationship"),
    ("classifier", "classifier"),
    *DEEPER_CLASSIFIER_KEYS,
    ("qa_outputs", "qa_outputs"),
    # ColBERT's projection: Stanford ColBERT's `HF_ColBERT` keeps it beside the encoder as `linear` (and PyLate's
    # Dense module names it so in its own file, `interop.colbert`).
    ("projection", "linear"),
)
# The tagger's CRF (`head.crf`) has no Hugging Face counterpart: its names pass through, and their
# BertForTokenClassification (or ModernBertForTokenClassification) loads the directory without it.
CRF_KEYS: tuple[tuple[str, str], ...] = (("crf.transitions", "crf.transitions"), ("crf.start", "crf.start"),
                                         ("crf.end", "crf.end"))
# Parameters whose full name is not `<module>.weight|bias`.
EXACT_KEYS: tuple[tuple[str, str], ...] = (("mlm.bias", "cls.predictions.bias"), *CRF_KEYS)

# Keys in their files that carry nothing of their own: the MLM decoder is tied to the word embeddings
# (weight) and to `cls.predictions.bias` (bias); `position_ids` is a constant buffer older versions saved.
REDUNDANT_HF_KEYS = re.compile(r"^(bert\.)?(cls\.predictions\.decoder\.(weight|bias)|embeddings\.position_ids)$")
# TF-era spellings of LayerNorm parameters found in some converted checkpoints.
LEGACY_SUFFIXES = {".gamma": ".weight", ".beta": ".bias"}

# Config keys that Hugging Face (or Google's original configs) write and a BERT encoder does not need.
HF_ONLY_CONFIG_KEYS = frozenset({
    "model_type", "transformers_version", "_name_or_path", "name_or_path", "gradient_checkpointing",
    "use_cache", "torch_dtype", "dtype", "is_decoder", "add_cross_attention", "bos_token_id", "eos_token_id",
    "tie_word_embeddings", "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
    "tokenizer_class", "finetuning_task", "directionality", "pooler_fc_size", "pooler_num_attention_heads",
    "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type", "num_labels", "task_specific_params",
    "sep_token_id", "prefix", "decoder_start_token_id", "torchscript", "pruned_heads",
    "is_encoder_decoder", "cross_attention_hidden_size", "tie_encoder_decoder", "label_smoothing",
})

# Hugging Face reads our fixed sinusoidal table as an ordinary learned one ("absolute"), which computes the
# same outputs; older transformers releases skip position embeddings for any other value, so the file says
# "absolute" and records ours under this key.
POSITION_EMBEDDING_KEY = "bertforge_position_embedding_type"

# Our class names <-> theirs (theirs spells "PreTraining").
ARCHITECTURES = {
    "BertModel": "BertModel",
    "BertForPretraining": "BertForPreTraining",
    "BertForMaskedLM": "BertForMaskedLM",
    "BertForSequenceClassification": "BertForSequenceClassification",
    "BertForTokenClassification": "BertForTokenClassification",
    "BertForQuestionAnswering": "BertForQuestionAnswering",
    "BertForMultipleChoice": "BertForMultipleChoice",
    # A trained sentence-embedding model is their plain encoder (its pooling is in the sentence-transformers
    # files beside it), and reads back as our `BertModel`.
    "BertForSentenceEmbedding": "BertModel",
    # A sparse (SPLADE) model is their masked-LM model; its SPLADE pooling is in the sentence-transformers files
    # beside it (`checkpoint_format.read_config` reads such a directory back as ours).
    "BertForSparseEmbedding": "BertForMaskedLM",
    # A ColBERT model is their plain encoder; its projection and settings are PyLate's files beside it
    # (`checkpoint_format.read_config` reads such a directory back as ours).
    "BertForColBERT": "BertModel",
}
# Theirs -> ours: the first of ours that maps to each of theirs.
_THEIRS_TO_OURS = {theirs: ours for ours, theirs in reversed(ARCHITECTURES.items())}
# Their head-only variants that our pretraining model covers (the missing head starts fresh).
FOREIGN_ARCHITECTURE_ALIASES = {"BertForNextSentencePrediction": "BertForPretraining",
                                "BertLMHeadModel": "BertForPretraining"}


def compile_pattern(pattern: str) -> str:
    """A key-table pattern (`{i}` a layer index) as a regex matching its `.weight` / `.bias` names."""
    return "^" + re.escape(pattern).replace(r"\{i\}", r"(\d+)") + r"\.(weight|bias)$"


_OURS_TO_HF = [(re.compile(compile_pattern(o)), t) for o, t in KEY_TABLE]
_HF_TO_OURS = [(re.compile(compile_pattern(t)), o) for o, t in KEY_TABLE]


def translate(key: str, table, exact: dict[str, str]) -> str | None:
    """`key` through an exact-name map, else the first matching (regex, target pattern) of `table`."""
    if key in exact:
        return exact[key]
    for pattern, target in table:
        match = pattern.match(key)
        if match:
            groups = match.groups()
            name = target.replace("{i}", groups[0]) if "{i}" in target else target
            return f"{name}.{groups[-1]}"
    return None


def to_hf_key(key: str) -> str:
    """Our parameter name -> Hugging Face's.  Keys under `bert.` keep the prefix; unknown keys raise."""
    prefix, rest = ("bert.", key[5:]) if key.startswith("bert.") else ("", key)
    name = translate(rest, _OURS_TO_HF, dict(EXACT_KEYS))
    if name is None:
        raise KeyError(f"no Hugging Face name for parameter {key!r}")
    return prefix + name


def from_hf_key(key: str) -> str | None:
    """Hugging Face parameter name -> ours, or None when the table has no entry for it."""
    for old, new in LEGACY_SUFFIXES.items():
        if key.endswith(old):
            key = key[: -len(old)] + new
    prefix, rest = ("bert.", key[5:]) if key.startswith("bert.") else ("", key)
    name = translate(rest, _HF_TO_OURS, {t: o for o, t in EXACT_KEYS})
    return None if name is None else prefix + name


def is_redundant_hf_key(key: str) -> bool:
    return bool(REDUNDANT_HF_KEYS.match(key))


def config_from_hf(data: dict[str, Any], source: str) -> tuple[dict[str, Any], str | None]:
    """Strip foreign keys from a config.json; returns (BertConfig fields, our architecture name or None)."""
    model_type = data.get("model_type", "bert")
    if model_type != "bert":
        raise ConfigError(f"{source}: model_type is {model_type!r}; bertforge loads BERT checkpoints "
                          "(model_type 'bert') only")
    fields = {k: v for k, v in data.items()
              if k not in HF_ONLY_CONFIG_KEYS and k not in ("architectures", POSITION_EMBEDDING_KEY)}
    if POSITION_EMBEDDING_KEY in data:
        fields["position_embedding_type"] = data[POSITION_EMBEDDING_KEY]
    if "num_labels" in data and "id2label" not in data and data.get("problem_type") != "regression":
        fields["id2label"] = {i: f"LABEL_{i}" for i in range(int(data["num_labels"]))}
    architecture = None
    for name in data.get("architectures") or []:
        architecture = FOREIGN_ARCHITECTURE_ALIASES.get(name) or _THEIRS_TO_OURS.get(name)
        if architecture:
            break
    return fields, architecture


def config_to_hf(fields: dict[str, Any], architecture: str) -> dict[str, Any]:
    """Our config fields plus what a Hugging Face loader needs to recognise the directory."""
    data = {k: v for k, v in fields.items() if v is not None and k != "architectures"}
    data["model_type"] = "bert"
    if data.get("position_embedding_type", "absolute") != "absolute":
        data[POSITION_EMBEDDING_KEY] = data["position_embedding_type"]
        data["position_embedding_type"] = "absolute"
    data["architectures"] = [ARCHITECTURES[architecture]]
    if "id2label" in data:
        data["num_labels"] = len(data["id2label"])
    elif data.get("problem_type") == "regression":
        data["num_labels"] = 1  # their default is 2, which would not fit a one-output regression head
    return data
