"""ColBERT (late interaction) model directories, both ways: PyLate's, sentence-transformers 6's
`MultiVectorEncoder`'s and Stanford ColBERT's.

A ColBERT model is a BERT encoder, a linear projection without bias to a small width (128 in most checkpoints)
and a unit-length vector per token. Its settings say how texts become tokens: a marker token after [CLS]
(one for queries, one for documents), queries padded with [MASK] to a fixed length (query expansion; the
encoder attends to those positions or not), documents cut to a length and stripped of the vectors of
punctuation tokens (the skiplist).

Three layouts hold one:
- PyLate's (what bertforge writes): a Hugging Face BERT directory plus sentence-transformers modules: the
  encoder, then `1_Dense` (its `model.safetensors` holds the projection as `linear.weight`);
  `config_sentence_transformers.json` holds the markers (`query_prefix`, `document_prefix`), `query_length`,
  `document_length`, `do_query_expansion`, `attend_to_expansion_tokens`, `skiplist_words`, with
  model_type "ColBERT" (PyLate 1.6 writes none: its `query_prefix` marks it). sentence-transformers' `MultiVectorEncoder` loads it as PyLate does.
- sentence-transformers 6's own: the encoder (`sentence_bert_config.json` holds `query_length`,
  `document_length` and `query_expansion` {strategy, attend, length}), `Dense`, `MultiVectorMask`
  (`skiplist_words`) and `Normalize`; the markers are the "query" and "document" prompts.
- Stanford ColBERT's (`HF_ColBERT`): config.json names architecture "HF_ColBERT", the weights file holds the
  encoder under `bert.` and the projection as `linear.weight`; `artifact.metadata` (JSON) holds
  `query_token_id`, `doc_token_id` (marker tokens, "[unused0]"/"[unused1]"), `query_maxlen`, `doc_maxlen`,
  `attend_to_mask_tokens`, `mask_punctuation` and `dim`.

Owns: the typed settings (`ColbertSettings`), telling a ColBERT directory (`is_colbert_directory`), reading
the settings of any of the three (`read_colbert_settings`), the projection stored beside the encoder
(`read_projection`), and the files that make a BERT directory a PyLate one (`colbert_files`) or a Stanford
one (`stanford_metadata`, `STANFORD_ARCHITECTURE`). Foreign names live here only.
"""

from __future__ import annotations

import io
import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from bertforge.errors import CheckpointError
from bertforge.interop.sentence_transformers import MODULES_NAME, SBERT_CONFIG_NAME, ST_CONFIG_NAME

STANFORD_ARCHITECTURE = "HF_ColBERT"
STANFORD_METADATA = "artifact.metadata"
DENSE_FOLDER = "1_Dense"
DENSE_WEIGHT = "linear.weight"  # the projection's name in PyLate's and sentence-transformers' Dense and Stanford's root
PYLATE_MODEL_TYPE = "ColBERT"
DENSE, MASK = "Dense", "MultiVectorMask"
PUNCTUATION = tuple(string.punctuation)


@dataclass(frozen=True)
class ColbertSettings:
    """How a ColBERT model turns texts into tokens and tokens into vectors.

    query_marker / document_marker: the token put after [CLS] of a query / a document (a vocabulary entry).
    query_length: tokens of every query, special tokens and markers included; with `expand_query` shorter
        queries are filled with [MASK] up to it. document_length: the most tokens of a document.
    expand_query: fill queries with [MASK] (ColBERT's query augmentation); attend_to_expansion: the encoder
        attends to those [MASK] positions (they score either way).
    skiplist: words (single vocabulary tokens) whose document vectors are dropped (punctuation by default).
    """

    query_marker: str = "[unused0]"
    document_marker: str = "[unused1]"
    query_length: int = 32
    document_length: int = 180
    expand_query: bool = True
    attend_to_expansion: bool = False
    skiplist: tuple[str, ...] = field(default=PUNCTUATION)

    def __post_init__(self) -> None:
        for name in ("query_length", "document_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 4:
                raise CheckpointError(f"ColBERT {name} must be an integer >= 4 (room for [CLS], the marker, a token "
                                      f"and [SEP]), got {value!r}")
        for name in ("query_marker", "document_marker"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise CheckpointError(f"ColBERT {name} must be a token of the vocabulary, got {getattr(self, name)!r}")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None


def _object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = _read(path)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _module_kinds(folder: Path) -> list[tuple[str, str]]:
    """(class name, path) of each module of a sentence-transformers directory; [] without modules.json."""
    listing = folder / MODULES_NAME
    if not listing.is_file():
        return []
    modules = _read(listing)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{listing}: expected a JSON list of modules")
    return [(str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", ""))) for m in modules]


def is_stanford_directory(folder: str | Path) -> bool:
    """Whether config.json names Stanford ColBERT's architecture."""
    config = _object(Path(folder) / "config.json")
    return STANFORD_ARCHITECTURE in (config.get("architectures") or [])


def is_colbert_directory(folder: str | Path) -> bool:
    """Whether a directory holds a ColBERT model in any of the three layouts."""
    folder = Path(folder)
    if is_stanford_directory(folder):
        return True
    kinds = [kind for kind, _ in _module_kinds(folder)]
    if MASK in kinds:
        return True
    extra = _object(folder / ST_CONFIG_NAME)
    # PyLate 1.6 writes no model_type; its query_prefix says ColBERT (a sentence embedder has none).
    return DENSE in kinds and (extra.get("model_type") in (PYLATE_MODEL_TYPE, "MultiVectorEncoder")
                               or "query_prefix" in extra)


def _marker(value: Any, default: str, source: Path, key: str) -> str:
    """A marker token from a prefix or prompt, as written: PyLate's "[Q] " is a token of its tokenizer, space
    and all (ModernBERT's tokenizer.json holds it so); "[unused0]" a WordPiece vocabulary's (the model's
    `ColbertTokens` looks a marker up as written, then without its spaces)."""
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip() or len(value.split()) != 1:
        raise CheckpointError(f"{source}: {key} {value!r} is not one marker token; bertforge inserts one token "
                              "after [CLS] (e.g. \"[unused0]\")")
    return value


def _skiplist(value: Any, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise CheckpointError(f"{source}: skiplist_words must be a list of strings, got {value!r}")
    return tuple(value)


def read_colbert_settings(folder: str | Path) -> ColbertSettings:
    """The settings of a ColBERT directory (PyLate's, sentence-transformers 6's or Stanford's layout); defaults
    for what a file leaves out, as those libraries take them."""
    folder = Path(folder)
    if is_stanford_directory(folder):
        path = folder / STANFORD_METADATA
        meta = _object(path)
        return ColbertSettings(
            query_marker=_marker(meta.get("query_token_id"), "[unused0]", path, "query_token_id"),
            document_marker=_marker(meta.get("doc_token_id"), "[unused1]", path, "doc_token_id"),
            query_length=meta.get("query_maxlen") or 32, document_length=meta.get("doc_maxlen") or 180,
            expand_query=True, attend_to_expansion=bool(meta.get("attend_to_mask_tokens")),
            skiplist=PUNCTUATION if meta.get("mask_punctuation", True) else ())
    extra_path, sbert_path = folder / ST_CONFIG_NAME, folder / SBERT_CONFIG_NAME
    extra, sbert = _object(extra_path), _object(sbert_path)
    kinds = _module_kinds(folder)
    if "query_prefix" in extra or extra.get("model_type") == PYLATE_MODEL_TYPE:  # PyLate
        length = extra.get("query_length") or 32
        skiplist = extra.get("skiplist_words")
        return ColbertSettings(
            query_marker=_marker(extra.get("query_prefix"), "[unused0]", extra_path, "query_prefix"),
            document_marker=_marker(extra.get("document_prefix"), "[unused1]", extra_path, "document_prefix"),
            query_length=length, document_length=extra.get("document_length") or 180,
            expand_query=extra.get("do_query_expansion", True) is not False,
            attend_to_expansion=bool(extra.get("attend_to_expansion_tokens", False)),
            skiplist=PUNCTUATION if skiplist is None else _skiplist(skiplist, extra_path))
    # sentence-transformers 6: the markers are prompts, the lengths the encoder's, the skiplist the mask's.
    prompts = extra.get("prompts") or {}
    expansion = sbert.get("query_expansion")
    if expansion is not None and (not isinstance(expansion, dict) or expansion.get("strategy") != "fixed"
                                  or expansion.get("token") not in (None, "[MASK]")):
        raise CheckpointError(f"{sbert_path}: query_expansion {expansion!r}: bertforge expands queries with [MASK] "
                              "to a fixed length (strategy \"fixed\")")
    mask_path = next((folder / path / "config.json" for kind, path in kinds if kind == MASK), None)
    mask = _object(mask_path) if mask_path is not None else {}
    if mask.get("skiplist_tasks", ["document"]) != ["document"] or mask.get("keep_only_token_ids"):
        raise CheckpointError(f"{mask_path}: bertforge drops skiplist tokens from documents only; "
                              f"skiplist_tasks {mask.get('skiplist_tasks')!r} / keep_only_token_ids are not supported")
    length = (expansion or {}).get("length") or sbert.get("query_length") or 32
    return ColbertSettings(
        query_marker=_marker(prompts.get("query"), "[unused0]", extra_path, "prompts.query"),
        document_marker=_marker(prompts.get("document"), "[unused1]", extra_path, "prompts.document"),
        query_length=length, document_length=sbert.get("document_length") or 180,
        expand_query=expansion is not None, attend_to_expansion=bool((expansion or {}).get("attend", False)),
        skiplist=_skiplist(mask.get("skiplist_words", []), mask_path or extra_path))


def read_projection(folder: str | Path) -> torch.Tensor | None:
    """The projection [dimension, hidden] a PyLate or sentence-transformers directory keeps in its Dense
    module (None when it keeps none: Stanford's sits in the encoder's weights file)."""
    folder = Path(folder)
    path = next((folder / p / "model.safetensors" for kind, p in _module_kinds(folder) if kind == DENSE), None)
    if path is None:
        return None
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; the Dense module's weights hold the ColBERT projection")
    try:
        tensors = load(path.read_bytes())
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc}); re-save the model") from None
    if set(tensors) != {DENSE_WEIGHT}:
        raise CheckpointError(f"{path}: expected the one tensor {DENSE_WEIGHT!r} (a projection without bias), "
                              f"found {sorted(tensors)}")
    return tensors[DENSE_WEIGHT]


def _json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def colbert_files(settings: ColbertSettings, projection: torch.Tensor) -> dict[str, str | bytes]:
    """The files that make a BERT directory a PyLate ColBERT one (which sentence-transformers loads too):
    modules.json, the Dense module (its config and `linear.weight`), and the settings."""
    width, hidden = projection.shape
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": DENSE_FOLDER, "type": "pylate.models.Dense.Dense"}]
    dense = {"in_features": hidden, "out_features": width, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}
    sbert = {"max_seq_length": settings.document_length - 1, "do_lower_case": False}
    extra = {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
             "model_type": PYLATE_MODEL_TYPE,
             "query_prefix": settings.query_marker, "document_prefix": settings.document_marker,
             "query_length": settings.query_length, "document_length": settings.document_length,
             "attend_to_expansion_tokens": settings.attend_to_expansion,
             "do_query_expansion": settings.expand_query, "skiplist_words": list(settings.skiplist)}
    buffer = io.BytesIO(save({DENSE_WEIGHT: projection.detach().float().contiguous()}, metadata={"format": "pt"}))
    return {MODULES_NAME: _json_text(modules), f"{DENSE_FOLDER}/config.json": _json_text(dense),
            f"{DENSE_FOLDER}/model.safetensors": buffer.getvalue(), SBERT_CONFIG_NAME: _json_text(sbert),
            ST_CONFIG_NAME: _json_text(extra)}


def stanford_metadata(settings: ColbertSettings, dimension: int) -> str:
    """`artifact.metadata` of a Stanford ColBERT directory with these settings. Stanford skips punctuation or
    nothing: another skiplist cannot be written there."""
    if settings.skiplist not in (PUNCTUATION, ()):
        raise CheckpointError("a Stanford ColBERT directory skips all punctuation or nothing; this model's skiplist "
                              f"{list(settings.skiplist)} cannot be written there (save it in PyLate's layout)")
    if not settings.expand_query:
        raise CheckpointError("Stanford ColBERT always expands queries with [MASK]; this model does not (save it "
                              "in PyLate's layout)")
    return _json_text({"query_token_id": settings.query_marker, "doc_token_id": settings.document_marker,
                       "query_maxlen": settings.query_length, "doc_maxlen": settings.document_length,
                       "attend_to_mask_tokens": settings.attend_to_expansion,
                       "mask_punctuation": bool(settings.skiplist), "dim": dimension, "similarity": "cosine"})


def settings_with(settings: ColbertSettings, values: Mapping[str, Any]) -> ColbertSettings:
    """`settings` with some fields replaced (the names of `ColbertSettings`)."""
    return replace(settings, **dict(values))
