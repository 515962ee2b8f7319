"""The sentence-transformers directory layout, both ways, and the `tokenizer.json` every embedding server needs.

A sentence-transformers model directory is a Hugging Face BERT directory plus a list of modules that run after
the encoder (`modules.json`): the encoder itself (path ""), `1_Pooling` (which token states make the sentence
vector: `1_Pooling/config.json`), and optionally `2_Normalize` (unit length). Beside them,
`sentence_bert_config.json` caps the sequence length (and may lower-case text first) and
`config_sentence_transformers.json` names prompts and the similarity function.

Owns: reading those files into one typed `SentenceSettings` (`read_settings`; None for a directory without
`modules.json`), the files that describe one (`settings_files`, written beside every embedding model we save:
always the pooling config, without which sentence-transformers and text-embeddings-inference fall back to
different poolings), the pooling names of both sides (`POOLING_MODES`), and `tokenizer_json` (the Rust
`tokenizers` file of a WordPiece vocabulary: text-embeddings-inference refuses to start without it) with its
readers: `read_tokenizer_json` (to check it against vocab.txt) and `read_wordpiece` (the whole tokenizer of a
directory that has no vocab.txt, as sentence-transformers 6 saves them; anything but BERT's WordPiece refused).

Foreign names live here only: the rest of bertforge speaks of pooling "cls", "mean", "max", "mean_sqrt_len",
"weightedmean", "lasttoken" (several joined by "+", concatenated in that order, as sentence-transformers does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.errors import CheckpointError

MODULES_NAME = "modules.json"
POOLING_CONFIG = "1_Pooling/config.json"
SBERT_CONFIG_NAME = "sentence_bert_config.json"
ST_CONFIG_NAME = "config_sentence_transformers.json"
TOKENIZER_JSON_NAME = "tokenizer.json"

# Ours <-> the legacy boolean keys of 1_Pooling/config.json (which text-embeddings-inference reads) and the
# mode names of sentence-transformers' newer `pooling_mode` key; in their concatenation order.
POOLING_MODES: tuple[tuple[str, str, str], ...] = (
    ("cls", "pooling_mode_cls_token", "cls"),
    ("max", "pooling_mode_max_tokens", "max"),
    ("mean", "pooling_mode_mean_tokens", "mean"),
    ("mean_sqrt_len", "pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("weightedmean", "pooling_mode_weightedmean_tokens", "weightedmean"),
    ("lasttoken", "pooling_mode_lasttoken", "lasttoken"),
)
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
# The module types bertforge runs, by the last part of their class path (old and new package layouts alike).
ENCODER, POOLING, NORMALIZE = "Transformer", "Pooling", "Normalize"
# A SparseEncoder (SPLADE) directory: the masked-LM encoder (sentence-transformers 5's `MLMTransformer`, or 6's
# `Transformer` with transformer_task "fill-mask"), then `SpladePooling`. We write the 5.x names, which 6.x
# still loads.
MLM_ENCODER, SPLADE_POOLING = "MLMTransformer", "SpladePooling"
SPLADE_CONFIG = "1_SpladePooling/config.json"
MLM_TASK = "fill-mask"  # sentence_bert_config.json's transformer_task of a masked-LM encoder
SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SentenceSettings:
    """How a sentence vector is made from the encoder's token states.

    pooling: our pooling name(s), "+"-joined when several are concatenated ("mean", "cls+mean").
    normalize: scale vectors to unit length (the `Normalize` module).
    max_seq_length: tokens per text, special tokens included (None: the model's own limit).
    do_lower_case: lower-case text before tokenizing (sentence_bert_config.json; rare for BERT models, whose
        tokenizer lower-cases itself).
    prompts: named prefixes ({"query": "query: "}); default_prompt_name: the one used when none is named.
    similarity: how vectors are compared ("cosine", the default; "dot" ...).
    splade: a SparseEncoder directory's SPLADE pooling over the vocabulary ("max" or "sum"; None: a dense
        sentence vector, made by `pooling`); splade_activation: "relu" (log(1 + relu)) or "log1p_relu" (a
        second log1p).
    """

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity: str = "cosine"
    splade: str | None = None
    splade_activation: str = "relu"

    @property
    def modes(self) -> tuple[str, ...]:
        return tuple(self.pooling.split("+"))


def pooling_name(modes: Sequence[str]) -> str:
    """Our "+"-joined pooling name of `modes`, in sentence-transformers' concatenation order."""
    order = [ours for ours, _, _ in POOLING_MODES]
    return "+".join(sorted(modes, key=order.index))


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(f"{path}: unreadable sentence-transformers file ({error}); restore it from the "
                              "model's source") from None


def _object(path: Path) -> dict[str, Any]:
    data = _read(path) if path.is_file() else {}
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _pooling_modes(path: Path) -> tuple[str, ...]:
    data = _object(path)
    if not data:
        raise CheckpointError(f"{path}: missing; modules.json lists a Pooling module, whose config says how the "
                              "sentence vector is made")
    if data.get("include_prompt", True) is False:
        raise CheckpointError(f"{path}: include_prompt=false (prompt tokens left out of the pooling) is not "
                              "supported by bertforge")
    named = data.get("pooling_mode")
    if named is not None:
        theirs = {new: ours for ours, _, new in POOLING_MODES}
        given = [named] if isinstance(named, str) else list(named)
        unknown = [mode for mode in given if mode not in theirs]
        if unknown or not given:
            raise CheckpointError(f"{path}: pooling_mode {named!r} is not one of {sorted(theirs)}")
        return tuple(theirs[mode] for mode in given)
    modes = tuple(ours for ours, legacy, _ in POOLING_MODES if data.get(legacy) is True)
    if not modes:
        raise CheckpointError(f"{path}: no pooling mode is true; set one of "
                              f"{[legacy for _, legacy, _ in POOLING_MODES]}")
    return modes


def read_settings(folder: str | Path) -> SentenceSettings | None:
    """The sentence settings of a sentence-transformers directory; None when it has no `modules.json`.

    Raises:
        CheckpointError: a module bertforge does not run (a Dense projection, another encoder ...), a
            missing or malformed pooling config, an unknown similarity function; each names the file.
    """
    folder = Path(folder)
    listing = folder / MODULES_NAME
    if not listing.is_file():
        return None
    modules = _read(listing)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{listing}: expected a JSON list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if SPLADE_POOLING in kinds or MLM_ENCODER in kinds:
        return _sparse_settings(folder, modules, kinds)
    if not kinds or kinds[0] != ENCODER or kinds.count(ENCODER) != 1:
        raise CheckpointError(f"{listing}: the first module must be the one Transformer encoder; found {kinds}")
    others = [kind for kind in kinds[1:] if kind not in (POOLING, NORMALIZE)]
    if others or kinds[1:] not in ([POOLING], [POOLING, NORMALIZE]):
        raise CheckpointError(f"{listing}: modules {kinds}: bertforge runs a Transformer, a Pooling and an "
                              "optional Normalize module, in that order; other modules (Dense projections ...) "
                              "are not supported")
    pooling_path = folder / modules[1].get("path", "1_Pooling") / "config.json"
    sbert, prompts, default_prompt = _extra_settings(folder)
    extra = _object(folder / ST_CONFIG_NAME)
    similarity = extra.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITIES:
        raise CheckpointError(f"{folder / ST_CONFIG_NAME}: similarity_fn_name {similarity!r} is not one of "
                              f"{list(SIMILARITIES)}")
    return SentenceSettings(pooling=pooling_name(_pooling_modes(pooling_path)), normalize=NORMALIZE in kinds,
                            max_seq_length=sbert.get("max_seq_length"), do_lower_case=bool(sbert.get("do_lower_case", False)),
                            prompts=prompts, default_prompt_name=default_prompt, similarity=similarity)


def _extra_settings(folder: Path) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """(sentence_bert_config.json, prompts, default prompt name) of a directory, checked."""
    sbert = _object(folder / SBERT_CONFIG_NAME)
    extra = _object(folder / ST_CONFIG_NAME)
    prompts = extra.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise CheckpointError(f"{folder / ST_CONFIG_NAME}: prompts must map names to strings")
    default_prompt = extra.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise CheckpointError(f"{folder / ST_CONFIG_NAME}: default_prompt_name {default_prompt!r} is not among "
                              f"the prompts {sorted(prompts)}")
    length = sbert.get("max_seq_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 8):
        raise CheckpointError(f"{folder / SBERT_CONFIG_NAME}: max_seq_length must be an integer >= 8, got {length!r}")
    return sbert, dict(prompts), default_prompt


def _sparse_settings(folder: Path, modules: list[dict[str, Any]], kinds: list[str]) -> SentenceSettings:
    """The settings of a SparseEncoder directory: a masked-LM encoder, then SPLADE pooling, nothing else."""
    listing = folder / MODULES_NAME
    sbert, prompts, default_prompt = _extra_settings(folder)
    task = sbert.get("transformer_task", MLM_TASK)
    if len(kinds) != 2 or kinds[0] not in (ENCODER, MLM_ENCODER) or kinds[1] != SPLADE_POOLING or task != MLM_TASK:
        raise CheckpointError(f"{listing}: modules {kinds}: bertforge runs a sparse encoder made of a masked-LM "
                              "Transformer then SpladePooling; other modules (SparseStaticEmbedding, Router, "
                              "SparseAutoEncoder ...) are not supported")
    pooling_path = folder / modules[1].get("path", "1_SpladePooling") / "config.json"
    pooling = _object(pooling_path)
    strategy = pooling.get("pooling_strategy", "max")
    activation = pooling.get("activation_function", "relu")
    if strategy not in SPLADE_STRATEGIES or activation not in SPLADE_ACTIVATIONS:
        raise CheckpointError(f"{pooling_path}: pooling_strategy {strategy!r} / activation_function {activation!r}: "
                              f"bertforge runs {list(SPLADE_STRATEGIES)} / {list(SPLADE_ACTIVATIONS)}")
    return SentenceSettings(max_seq_length=sbert.get("max_seq_length"), prompts=prompts,
                            default_prompt_name=default_prompt, similarity="dot", splade=strategy,
                            splade_activation=activation)


def is_sparse_directory(folder: str | Path) -> bool:
    """Whether a directory's `modules.json` makes it a SparseEncoder (SPLADE pooling over MLM logits)."""
    listing = Path(folder) / MODULES_NAME
    if not listing.is_file():
        return False
    modules = _read(listing)
    return isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).rsplit(".", 1)[-1] == SPLADE_POOLING for m in modules)


def sparse_settings_files(settings: SentenceSettings, vocab_size: int) -> dict[str, str]:
    """The files that make a BERT masked-LM directory a sentence-transformers SparseEncoder one."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"sentence_transformers.sparse_encoder.models.{MLM_ENCODER}"},
               {"idx": 1, "name": "1", "path": "1_SpladePooling",
                "type": f"sentence_transformers.sparse_encoder.models.{SPLADE_POOLING}"}]
    pooling = {"pooling_strategy": settings.splade or "max", "activation_function": settings.splade_activation,
               "word_embedding_dimension": vocab_size}
    sbert = {"max_seq_length": settings.max_seq_length, "do_lower_case": settings.do_lower_case}
    extra = {"prompts": dict(settings.prompts), "default_prompt_name": settings.default_prompt_name,
             "similarity_fn_name": "dot", "model_type": "SparseEncoder"}
    return {MODULES_NAME: _json_text(modules), SPLADE_CONFIG: _json_text(pooling), SBERT_CONFIG_NAME: _json_text(sbert),
            ST_CONFIG_NAME: _json_text(extra)}


def _json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def settings_files(settings: SentenceSettings, dimension: int) -> dict[str, str]:
    """The files (path in the directory -> JSON text) that make a BERT directory a sentence-transformers one.

    The pooling config carries both the legacy boolean keys (which text-embeddings-inference reads) and
    the dimension under its legacy name; sentence-transformers reads both."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if settings.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    modes = set(settings.modes)
    pooling: dict[str, Any] = {"word_embedding_dimension": dimension}
    pooling.update({legacy: ours in modes for ours, legacy, _ in POOLING_MODES})
    pooling["include_prompt"] = True
    sbert = {"max_seq_length": settings.max_seq_length, "do_lower_case": settings.do_lower_case}
    extra = {"prompts": dict(settings.prompts), "default_prompt_name": settings.default_prompt_name,
             "similarity_fn_name": settings.similarity, "model_type": "SentenceTransformer"}
    return {MODULES_NAME: _json_text(modules), POOLING_CONFIG: _json_text(pooling),
            SBERT_CONFIG_NAME: _json_text(sbert), ST_CONFIG_NAME: _json_text(extra)}


def tokenizer_json(tokens: Sequence[str], *, do_lower_case: bool, strip_accents: bool | None,
                   tokenize_chinese_chars: bool, max_input_chars_per_word: int, unk_token: str, cls_token: str,
                   sep_token: str, pad_token: str, mask_token: str) -> str:
    """The Rust `tokenizers` description (`tokenizer.json`) of a BERT WordPiece tokenizer.

    Servers that read it (text-embeddings-inference) tokenize with the Rust library's BERT normaliser, which
    differs from Google's on rare control and CJK-boundary characters (docs/design.md, faithfulness traps
    3 and 4); on ordinary text the ids are the same as ours, as a test checks.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate(tokens)}
    rust = RustTokenizer(models.WordPiece(vocab, unk_token=unk_token, max_input_chars_per_word=max_input_chars_per_word))
    rust.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                                 strip_accents=strip_accents, lowercase=do_lower_case)
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab[cls_token], vocab[sep_token]
    rust.post_processor = processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0", pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, cls), (sep_token, sep)])
    rust.decoder = decoders.WordPiece(prefix="##")
    rust.add_special_tokens([t for t in (pad_token, unk_token, cls_token, sep_token, mask_token) if t in vocab])
    return rust.to_str(pretty=True) + "\n"


@dataclass(frozen=True)
class TokenizerJson:
    """What a `tokenizer.json` says about a WordPiece tokenizer: its vocabulary (token -> id) and, when its
    normaliser is the BERT one, the casing, accent and CJK settings (None where it does not say)."""

    vocab: dict[str, int]
    lowercase: bool | None = None
    strip_accents: bool | None = None
    handle_chinese_chars: bool | None = None


def _tokenizer_data(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the whole file, its "model" object) of a WordPiece `tokenizer.json`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(f"{path}: unreadable ({type(error).__name__}: {error}); restore it from the model's "
                              "source, or delete it (bertforge reads vocab.txt; save_pretrained writes both)") from None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict) or model.get("type", "WordPiece") != "WordPiece" or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        kind = model.get("type") if isinstance(model, dict) else None
        raise CheckpointError(f"{path}: not a WordPiece tokenizer (model.type {kind!r}; expected \"model\": "
                              "{\"type\": \"WordPiece\", \"vocab\": {token: id}}); bertforge runs BERT's WordPiece "
                              "tokenizer only: restore the file from the model's source, or delete it")
    return data, model


def read_tokenizer_json(path: Path) -> TokenizerJson:
    """The vocabulary and BERT normaliser settings of a Rust `tokenizers` file.

    Raises:
        CheckpointError: not JSON, or not a WordPiece tokenizer with a vocabulary of token -> integer id.
    """
    data, model = _tokenizer_data(path)
    vocab = model["vocab"]
    normalizer = data.get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return TokenizerJson(vocab)
    return TokenizerJson(vocab, normalizer.get("lowercase"), normalizer.get("strip_accents"),
                         normalizer.get("handle_chinese_chars"))


@dataclass(frozen=True)
class WordPieceJson:
    """A `tokenizer.json` read as the whole description of a BERT WordPiece tokenizer (a directory that
    sentence-transformers 6 or transformers 5 saved holds no vocab.txt).

    tokens: the vocabulary in id order. settings: `TokenizerConfig` fields by our names (do_lower_case,
    strip_accents, tokenize_chinese_chars, max_input_chars_per_word, unk_token). beyond: added tokens whose ids
    follow the vocabulary (bertforge's tokenizer does not produce them).
    """

    tokens: tuple[str, ...]
    settings: dict[str, Any]
    beyond: tuple[str, ...] = ()


def read_wordpiece(path: Path) -> WordPieceJson:
    """The BERT WordPiece tokenizer a `tokenizer.json` describes, for a directory without vocab.txt.

    Raises:
        CheckpointError: naming the file and the field, when it describes another tokenizer than BERT's:
            another model type, word-piece prefix, normaliser or pre-tokeniser, or ids with gaps.
    """
    data, model = _tokenizer_data(path)
    vocab: dict[str, int] = model["vocab"]
    fix = ("bertforge runs BERT's WordPiece tokenizer only (BertNormalizer, BertPreTokenizer, '##' pieces); "
           "if this is a BERT model, save its tokenizer with vocab.txt and tokenizer_config.json beside the weights")

    def refuse(field_name: str, value: Any, expected: str) -> CheckpointError:
        return CheckpointError(f"{path}: {field_name} is {value!r}, expected {expected}; {fix}")

    prefix = model.get("continuing_subword_prefix", "##")
    if prefix != "##":
        raise refuse("model.continuing_subword_prefix", prefix, "'##'")
    tokens = sorted(vocab, key=vocab.__getitem__)
    gap = next((index for index, token in enumerate(tokens) if vocab[token] != index), None)
    if gap is not None or not tokens:
        raise refuse("model.vocab", f"{len(tokens)} tokens" if gap is None else f"id {gap} missing",
                     "ids 0 .. n-1, one per token")
    normalizer = data.get("normalizer")
    kind = normalizer.get("type") if isinstance(normalizer, dict) else normalizer
    if kind != "BertNormalizer":
        raise refuse("normalizer.type", kind, "'BertNormalizer'")
    if normalizer.get("clean_text", True) is not True:
        raise refuse("normalizer.clean_text", normalizer.get("clean_text"), "true (bertforge always cleans text)")
    pre = data.get("pre_tokenizer")
    kind = pre.get("type") if isinstance(pre, dict) else pre
    if kind != "BertPreTokenizer":
        raise refuse("pre_tokenizer.type", kind, "'BertPreTokenizer'")
    lowercase = normalizer.get("lowercase", True)
    settings = {"do_lower_case": lowercase, "strip_accents": normalizer.get("strip_accents"),
                "tokenize_chinese_chars": normalizer.get("handle_chinese_chars", True),
                "max_input_chars_per_word": model.get("max_input_chars_per_word", 100),
                "unk_token": model.get("unk_token", "[UNK]")}
    added = data.get("added_tokens") or []
    beyond = tuple(str(entry.get("content")) for entry in added if isinstance(entry, dict)
                   and isinstance(entry.get("id"), int) and entry["id"] >= len(tokens))
    return WordPieceJson(tuple(tokens), settings, beyond)
