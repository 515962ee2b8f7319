"""Model directories on disk: the generic reader and writer below every model class.

A directory holds everything needed to use a model: `config.json` (architecture, label names, task kind),
`model.safetensors`, and when a tokenizer is saved with it `vocab.txt` + `tokenizer_config.json` (and
`tokenizer.json`), plus the fine-tuning record `finetuning.json` of a fine-tuned model. A directory whose
tokenizer is a `tokenizer.json` alone (what sentence-transformers 6 and transformers 5 save) loads too: its
vocabulary and normaliser settings are read from that file (`interop.sentence_transformers.read_wordpiece`). It is a valid Hugging Face BERT checkpoint:
parameter names are translated by `interop.huggingface` on the way out and on the way in, and
`pytorch_model.bin` files from elsewhere load too (with `weights_only=True`).

Google's TensorFlow 1 directories load as they are shipped or left (read by `interop.google_tf`, with numpy,
no TensorFlow): a release (`bert_config.json`, `vocab.txt`, `bert_model.ckpt.*`) and a run_pretraining.py
output directory (`model.ckpt-NNNN.*` and the `checkpoint` file naming the latest; `step=` picks another;
the run's `bert_config.json` must be copied in). Kernels are transposed and optimizer state is skipped
(listed in the report's `skipped`).

This module knows no model class. It is handed one (`load_model(path, cls)`) and asks the class two things:
`encoder_prefix` (where the encoder sits: "" for `BertModel`, "bert." for models with a head) and
`head_prefixes` (the parameter-name prefixes of its own heads). Which class a directory names is decided
above the models, by `bertforge.families.registry`. Loading returns the model *and* a `LoadReport` (what
started fresh, what was skipped); nothing is attached to the module.

Saving builds the directory aside and puts it in place with one rename (`storage.atomic_directory`), so a
crash never leaves half a model behind and a directory being replaced (`best/`) is complete at every instant;
a full disk is one `CheckpointError`. `checksums.json` records the sha256 of the weights file; loading
verifies it first (`storage.verify_checksum`; BERTFORGE_SKIP_CHECKSUM=1 skips), then refuses tensors holding
NaN or infinity, a vocabulary that cannot belong to the model's embedding table, and warns about a
classifier whose config.json names no labels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertforge import checkpoint_integrity as integrity
from bertforge.constants import (
    CONFIG_NAME,
    FINETUNING_NAME,
    TOKENIZER_CONFIG_NAME,
    TORCH_WEIGHTS_NAME,
    VOCAB_NAME,
    WEIGHTS_NAME,
)
from bertforge.errors import CheckpointError, ConfigError, DataError
from bertforge.initialisation import weights_to_come
from bertforge.interop import colbert, google_tf
from bertforge.interop import huggingface as hf
from bertforge.interop import modernbert as hf_modernbert
from bertforge.interop import sentence_transformers as st
from bertforge.model.config import BertConfig, EncoderConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.storage import (
    atomic_directory,
    read_json,
    record_checksums,
    verify_checksum,
    write_bytes,
    write_json,
    write_text,
)
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.tokenizer_files import TokenizerConfig
from bertforge.tokenization.tokenizer_json import JsonTokenizer, json_model_type
from bertforge.tokenization.vocab import Vocab, check_fits_embeddings

log = logging.getLogger(__name__)

# Our class of a directory whose sentence-transformers modules make SPLADE vectors from masked-LM logits, and of a
# PyLate, sentence-transformers MultiVectorEncoder or Stanford ColBERT one, by the config of its encoder.
SPARSE_ARCHITECTURES = {BertConfig: "BertForSparseEmbedding", ModernBertConfig: "ModernBertForSparseEmbedding"}
COLBERT_ARCHITECTURES = {BertConfig: "BertForColBERT", ModernBertConfig: "ModernBertForColBERT"}
# The encoder's own top-level modules; any other parameter belongs to a head.
ENCODER_MODULES = ("embeddings.", "encoder.", "pooler.")


@dataclass
class LoadReport:
    """What loading did besides copying tensors.

    source: the weights file read. fresh: parameters initialised fresh (a head or pooler the checkpoint
    lacks). skipped: stored tensors deliberately not loaded (another task's head, a pooler the model lacks).
    """

    source: str
    fresh: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def fresh_in(self, prefixes: tuple[str, ...]) -> list[str]:
        return [k for k in self.fresh if k.startswith(prefixes)]


@dataclass
class ModelDirectory:
    """A model directory read once: everything a run needs besides the weights.

    config: the architecture (and label names). architecture: our class name from config.json (None when
    it names none). tokenizer: None when the directory has neither vocab.txt nor tokenizer.json. finetuning: the fine-tuning record
    (`finetuning.json`: how inputs were built), None for a model that was not fine-tuned here. sentence: how
    a sentence-transformers directory pools (its modules.json and configs), None for other directories.
    """

    path: Path
    config: BertConfig
    architecture: str | None
    tokenizer: Tokenizer | JsonTokenizer | None
    finetuning: dict[str, Any] | None
    sentence: st.SentenceSettings | None = None

    def require_tokenizer(self) -> Tokenizer | JsonTokenizer:
        if self.tokenizer is None:
            raise CheckpointError(f"{self.path}: no {VOCAB_NAME} (nor {st.TOKENIZER_JSON_NAME}); this model "
                                  "directory was saved without a tokenizer (copy the vocab.txt and "
                                  f"{TOKENIZER_CONFIG_NAME} it was trained with into it)")
        return self.tokenizer


# config.json's model_type -> (the interop module with its key table and config translation, our config class).
# Each interop module offers to_hf_key, from_hf_key, is_redundant_hf_key, config_from_hf and config_to_hf.
DIALECTS: dict[str, tuple[Any, type[EncoderConfig]]] = {"bert": (hf, BertConfig),
                                                        hf_modernbert.MODEL_TYPE: (hf_modernbert, ModernBertConfig)}


def dialect(config: EncoderConfig):
    """The interop module that names a model of this config in Hugging Face's terms."""
    return next(module for module, cls in DIALECTS.values() if isinstance(config, cls))


def dialect_of_file(data: dict[str, Any], file: Path) -> tuple[Any, type[EncoderConfig]]:
    """(interop module, config class) for a config.json's model_type (BERT when it names none)."""
    model_type = data.get("model_type", "bert")
    if model_type not in DIALECTS:
        raise ConfigError(f"{file}: model_type is {model_type!r}; bertforge loads {sorted(DIALECTS)} checkpoints")
    return DIALECTS[model_type]


# --- writing ---------------------------------------------------------------------------------------------

def replace_directory(build, path: str | os.PathLike) -> Path:
    """Run `build(tmp_dir)` in a fresh sibling directory, then put it at `path` in one rename (replacing a
    directory there: see `storage.atomic_directory`).

    Raises:
        CheckpointError: the disk is full or not writable (OSError, or safetensors' error for it); nothing
            was changed at `path`.
    """
    path = Path(path)
    try:
        with atomic_directory(path) as tmp:
            build(tmp)
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: could not write the model directory ({exc}); check free disk "
                              "space and permissions — nothing was changed at that path") from None
    return path


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names, contiguous, ready for safetensors."""
    names = dialect(model.config)
    return {names.to_hf_key(k): v.detach().contiguous() for k, v in model.state_dict().items()}


def tokenizer_json(tokenizer: Tokenizer) -> str:
    """`tokenizer.json` (the Rust library's file, which text-embeddings-inference needs) of our tokenizer."""
    config = tokenizer.config
    return st.tokenizer_json(tokenizer.vocab.tokens, do_lower_case=config.do_lower_case,
                             strip_accents=config.strip_accents, tokenize_chinese_chars=config.tokenize_chinese_chars,
                             max_input_chars_per_word=config.max_input_chars_per_word, unk_token=config.unk_token,
                             cls_token=config.cls_token, sep_token=config.sep_token, pad_token=config.pad_token,
                             mask_token=config.mask_token)


def write_model_files(model: torch.nn.Module, folder: Path, tokenizer=None,
                      extra_files: dict[str, str | bytes] | None = None) -> None:
    """The files of a model directory, written into the existing `folder` (see `save_model`), with the
    weights' checksum last."""
    config = dialect(model.config).config_to_hf(model.config.to_dict(), type(model).__name__)  # + a class's own:
    write_json(folder / CONFIG_NAME, {**config, **getattr(model, "config_fields", dict)()}, sort_keys=True)
    save_file(hf_state_dict(model), str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    files = dict(getattr(model, "directory_files", dict)())
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)  # a JsonTokenizer writes its own tokenizer.json
        if isinstance(tokenizer, Tokenizer):
            files[st.TOKENIZER_JSON_NAME] = tokenizer_json(tokenizer)
    for name, content in {**files, **(extra_files or {})}.items():
        if isinstance(content, bytes):
            write_bytes(folder / name, content)
        else:
            write_text(folder / name, content)
    # The tokenizer files are covered too: a re-ordered vocab.txt loads and silently changes every answer.
    record_checksums(folder, [WEIGHTS_NAME, *(name for name in (VOCAB_NAME, TOKENIZER_CONFIG_NAME,
                                                                 st.TOKENIZER_JSON_NAME) if (folder / name).is_file())])


def save_model(model: torch.nn.Module, path: str | os.PathLike, tokenizer=None,
               extra_files: dict[str, str | bytes] | None = None) -> Path:
    """Save `model` (and its tokenizer, with its `tokenizer.json`) as a Hugging Face compatible BERT
    directory, atomically. A model class may add files of its own (`directory_files()`: the
    sentence-transformers modules of an embedding model); `extra_files` names may hold a subfolder."""
    return replace_directory(lambda tmp: write_model_files(model, tmp, tokenizer, extra_files), path)


# --- reading ---------------------------------------------------------------------------------------------

def read_json_object(file: Path, what: str) -> dict[str, Any]:
    try:
        data = read_json(file, what=what)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing; a model directory needs {file.name}") from None
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return data


def is_google_directory(path: str | os.PathLike) -> bool:
    """A Google TF 1 directory: a TF checkpoint and no config.json of ours or Hugging Face's."""
    return not (Path(path) / CONFIG_NAME).exists() and google_tf.is_google_directory(path)


# Google's heads -> the class that holds them (run_squad.py's, run_classifier.py's, run_pretraining.py's).
_GOOGLE_ARCHITECTURES = (("cls/squad/", "BertForQuestionAnswering"), ("output_weights", "BertForSequenceClassification"),
                         ("cls/predictions/", "BertForPretraining"), ("cls/seq_relationship/", "BertForPretraining"))


def _read_google_config(path: Path, step: int | None) -> tuple[BertConfig, str | None]:
    file = path / google_tf.GOOGLE_CONFIG_NAME
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; a Google TF checkpoint directory needs the bert_config.json it "
                              "was trained with (run_pretraining.py's --bert_config_file): copy it in")
    fields, _ = hf.config_from_hf(read_json_object(file, google_tf.GOOGLE_CONFIG_NAME), str(file))
    shapes = google_tf.tensor_shapes(google_tf.checkpoint_prefix(path, step))
    architecture = next((arch for head, arch in _GOOGLE_ARCHITECTURES
                         if any(name == head or name.startswith(head) for name in shapes)), None)
    labels = shapes.get("output_weights")
    if labels and "id2label" not in fields:
        fields["id2label"] = {i: f"LABEL_{i}" for i in range(labels[0])}  # run_classifier.py saves no names
    return BertConfig.from_dict(fields, source=str(file)), architecture


def read_config(path: str | os.PathLike, *, step: int | None = None) -> tuple[EncoderConfig, str | None]:
    """(config, our architecture name or None) from a model directory's config.json, or a Google
    directory's bert_config.json (the architecture then from the heads its checkpoint holds)."""
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: not a model directory; pass a folder holding config.json and weights "
                              "(or a preset name where a command accepts one)")
    if is_google_directory(path):
        return _read_google_config(Path(path), step)
    file = Path(path) / CONFIG_NAME
    data = read_json_object(file, "config.json")
    names, config_class = dialect_of_file(data, file)
    fields, architecture = names.config_from_hf(data, str(file))
    if st.is_sparse_directory(path) or colbert.is_colbert_directory(path):  # SPLADE pooling; ColBERT (3 layouts)
        architecture = (SPARSE_ARCHITECTURES if st.is_sparse_directory(path) else COLBERT_ARCHITECTURES)[config_class]
    config = config_class.from_dict(fields, source=str(file))
    integrity.warn_without_labels(data, config, file)
    return config, architecture


def read_directory(path: str | os.PathLike, *, do_lower_case: bool | None = None) -> ModelDirectory:
    """Config, architecture, tokenizer and fine-tuning record of a model directory, each read once.

    `do_lower_case` overrides the tokenizer's casing (a Google directory records none; see
    `Tokenizer.from_pretrained`)."""
    config, architecture = read_config(path)
    folder = Path(path)
    tokenizer = read_tokenizer(folder, do_lower_case, config.vocab_size)
    record_file = folder / FINETUNING_NAME
    record = read_json_object(record_file, FINETUNING_NAME) if record_file.exists() else None
    sentence = None if architecture in COLBERT_ARCHITECTURES.values() else st.read_settings(folder)  # ColBERT's: no pooling
    return ModelDirectory(folder, config, architecture, tokenizer, record, sentence)


def check_tokenizer_json(folder: Path, tokenizer: Tokenizer, casing_given: bool = False) -> None:
    """CheckpointError when the directory's `tokenizer.json` (what Hugging Face consumers and
    text-embeddings-inference read) describes another tokenizer than `vocab.txt` and `tokenizer_config.json`
    (what bertforge reads): other ids for a token, or other casing, accents or CJK handling. `casing_given`:
    the caller overrode the casing on purpose, so the files' casing is not compared."""
    file = folder / st.TOKENIZER_JSON_NAME
    if not file.is_file():
        return
    verify_checksum(file)
    theirs = st.read_tokenizer_json(file)
    fix = (f"the two describe different tokenizers, so a Hugging Face consumer of this folder would tokenise "
           f"differently: restore both from the same save, or re-save the model with bertforge (save_pretrained "
           f"writes both from one tokenizer), or delete {st.TOKENIZER_JSON_NAME} if {VOCAB_NAME} and "
           f"{TOKENIZER_CONFIG_NAME} are right")
    if not (folder / VOCAB_NAME).exists():  # the vocabulary came from tokenizer.json: only the settings can differ
        fix = (f"Hugging Face tokenizers run {st.TOKENIZER_JSON_NAME}'s normalizer: make {TOKENIZER_CONFIG_NAME} "
               "say the same (or restore both from the same save)")
    tokens = tokenizer.vocab.tokens
    wrong = next(((token, index) for index, token in enumerate(tokens) if theirs.vocab.get(token) != index), None)
    if wrong is not None or len(theirs.vocab) != len(tokens):
        token, index = wrong if wrong is not None else (None, None)
        what = (f"{token!r} is id {index} in {VOCAB_NAME} but {theirs.vocab.get(token)} there" if wrong is not None
                else f"it has {len(theirs.vocab)} tokens, {VOCAB_NAME} {len(tokens)}")
        raise CheckpointError(f"{file}: does not agree with {folder / VOCAB_NAME} ({what}); {fix}")
    config = tokenizer.config
    strip = config.do_lower_case if config.strip_accents is None else config.strip_accents
    settings = [("handle_chinese_chars", theirs.handle_chinese_chars, "tokenize_chinese_chars",
                 config.tokenize_chinese_chars)]
    if not casing_given:
        their_strip = theirs.lowercase if theirs.strip_accents is None else theirs.strip_accents
        settings += [("lowercase", theirs.lowercase, "do_lower_case", config.do_lower_case),
                     ("strip_accents", their_strip if theirs.lowercase is not None else None, "strip_accents", strip)]
    for name, value, ours, own in settings:
        if value is not None and bool(value) != bool(own):
            raise CheckpointError(f"{file}: normalizer {name} is {value} but {TOKENIZER_CONFIG_NAME} has {ours} "
                                  f"{own}; {fix}")


def tokenizer_source(folder: Path) -> Path:
    """The file a directory's vocabulary is read from: vocab.txt, else tokenizer.json."""
    return folder / VOCAB_NAME if (folder / VOCAB_NAME).exists() else folder / st.TOKENIZER_JSON_NAME


def read_tokenizer(folder: Path, do_lower_case: bool | None = None,
                   vocab_size: int | None = None) -> Tokenizer | JsonTokenizer | None:
    """The tokenizer of a model directory: from vocab.txt and tokenizer_config.json (checked against a
    tokenizer.json beside them), else from a tokenizer.json alone (BERT's WordPiece into `Tokenizer`, any
    other model, such as ModernBERT's BPE, run by the `tokenizers` library: `JsonTokenizer`); None when it has
    neither. `vocab_size`: the model's embedding rows, which the vocabulary must fit (checked first: the
    clearest error)."""
    json_file = folder / st.TOKENIZER_JSON_NAME
    if not (folder / VOCAB_NAME).exists() and json_file.is_file() and json_model_type(json_file) != "WordPiece":
        verify_checksum(json_file)
        if do_lower_case is not None:
            raise ConfigError(f"{json_file}: do_lower_case applies to BERT's WordPiece tokenizer only; this "
                              "tokenizer.json normalises text itself")
        tokenizer = JsonTokenizer.from_pretrained(folder)
        if vocab_size is not None:
            check_fits_embeddings(tokenizer.vocab_size, vocab_size, json_file)
        return tokenizer
    if (folder / VOCAB_NAME).exists():
        tokenizer = Tokenizer.from_pretrained(folder, do_lower_case=do_lower_case)
    elif (folder / st.TOKENIZER_JSON_NAME).is_file():
        tokenizer = tokenizer_from_json(folder, do_lower_case)
    else:
        return None
    if vocab_size is not None:
        check_fits_embeddings(len(tokenizer.vocab), vocab_size, tokenizer_source(folder))
    check_tokenizer_json(folder, tokenizer, do_lower_case is not None)
    return tokenizer


def tokenizer_from_json(folder: Path, do_lower_case: bool | None = None) -> Tokenizer:
    """The WordPiece tokenizer a directory's tokenizer.json describes (no vocab.txt beside it): the vocabulary,
    casing, accent and CJK handling from that file; special tokens and the length limit from
    tokenizer_config.json when there is one (its casing must then agree: `check_tokenizer_json`)."""
    file = folder / st.TOKENIZER_JSON_NAME
    verify_checksum(file)
    wordpiece = st.read_wordpiece(file)
    if wordpiece.beyond:
        log.warning("%s: added tokens %s follow the vocabulary; bertforge's tokenizer does not read them: text "
                    "holding them is split into word pieces", file, list(wordpiece.beyond[:8]))
    config_file = folder / TOKENIZER_CONFIG_NAME
    stated = read_json_object(config_file, TOKENIZER_CONFIG_NAME) if config_file.is_file() else {}
    try:
        config = TokenizerConfig.from_dict({**wordpiece.settings, **stated})
        if do_lower_case is not None:
            config = replace(config, do_lower_case=do_lower_case)
        return Tokenizer(Vocab(wordpiece.tokens, unk_token=config.unk_token), config)
    except (ConfigError, DataError) as error:
        raise CheckpointError(f"{config_file if stated else file}: {error}") from None


def load_tokenizer(path: str | os.PathLike, *, do_lower_case: bool | None = None) -> Tokenizer | JsonTokenizer:
    """The tokenizer saved in a model directory (clear error when the directory has none)."""
    folder = Path(path)
    vocab_size = read_config(folder)[0].vocab_size if (folder / CONFIG_NAME).is_file() else None
    tokenizer = read_tokenizer(folder, do_lower_case, vocab_size)
    if tokenizer is None:
        raise CheckpointError(f"{folder}: no {VOCAB_NAME} (nor {st.TOKENIZER_JSON_NAME}); this model directory was "
                              f"saved without a tokenizer (copy the vocab.txt and {TOKENIZER_CONFIG_NAME} it was "
                              "trained with into it)")
    return tokenizer


# Files of a model directory that decide its vectors (a README or an ONNX export beside them do not).
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "*.safetensors", "*.safetensors.index.json",
               "pytorch_model*.bin")


def model_fingerprint(model_dir: str | os.PathLike) -> str:
    """sha256 over the files that decide a model's vectors (config, tokenizer, weights): a moved copy of the
    same model has the same fingerprint, a retrained one another."""
    folder = Path(model_dir)
    files = {weights_file(folder), *(path for pattern in MODEL_FILES for path in folder.glob(pattern))}
    vocabulary = tokenizer_source(folder)  # tokenizer.json where there is no vocab.txt (sentence-transformers 6)
    if vocabulary.is_file():
        files.add(vocabulary)
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def weights_file(path: str | os.PathLike, *, step: int | None = None) -> Path:
    """The weights file of a model directory: `model.safetensors`, its shard index, or `pytorch_model.bin`;
    for a Google directory the `.index` of its checkpoint (`step` picks a run_pretraining.py step)."""
    folder = Path(path)
    if is_google_directory(folder):
        return Path(f"{google_tf.checkpoint_prefix(folder, step)}{google_tf.INDEX_SUFFIX}")
    for candidate in (folder / WEIGHTS_NAME, folder / (WEIGHTS_NAME + ".index.json"), folder / TORCH_WEIGHTS_NAME):
        if candidate.exists():
            return candidate
    raise CheckpointError(f"{folder}: no weights found; expected {WEIGHTS_NAME} or {TORCH_WEIGHTS_NAME}")


def _read_google(index: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A Google checkpoint's tensors under Hugging Face names (as every other weights file is read), and
    the stored names skipped (optimizer state, string tensors)."""
    stored = google_tf.read_google_weights(Path(str(index).removesuffix(google_tf.INDEX_SUFFIX)))
    tensors = {}
    for name, value in stored.tensors.items():
        if value.dtype.kind not in "fiub":
            raise CheckpointError(f"{index}: tensor {name!r} has dtype {value.dtype}, not a model parameter")
        key = name if name in stored.unknown else hf.to_hf_key(name)  # unknown names are reported by the caller
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
    return tensors, stored.optimizer + stored.strings  # interop.google_tf logs how many


def read_weights(path: str | os.PathLike, *, step: int | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a model directory under their stored names (safetensors, sharded or not, or torch .bin);
    a Google TF directory's under Hugging Face names, kernels transposed, optimizer state left out."""
    return _read_stored(path, step)[0]


def _read_stored(path: str | os.PathLike, step: int | None = None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(tensors, stored names skipped before translation: a Google checkpoint's optimizer state), every
    floating tensor checked finite (`check_finite`)."""
    file = weights_file(path, step=step)
    tensors, skipped = _read_files(file)
    integrity.check_finite(tensors, file)
    return tensors, skipped


def _read_files(file: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    reading = file
    if file.name.endswith(google_tf.INDEX_SUFFIX):
        return _read_google(file)
    verify_checksum(file)
    try:
        if file.name == WEIGHTS_NAME:
            return load_file(str(file)), []
        if file.name == TORCH_WEIGHTS_NAME:
            # weights_only: a .bin is a pickle, and a pickle from elsewhere must not run code on load.
            return torch.load(file, map_location="cpu", weights_only=True), []
        shards = sorted(set(read_json_object(file, "shard index")["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            reading = file.parent / shard
            verify_checksum(reading)
            tensors.update(load_file(str(reading)))
        return tensors, []
    except (SafetensorError, OSError, RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{reading}: weights are unreadable or corrupt ({integrity.brief(exc)}); "
                              "re-save or re-download the checkpoint") from None


def is_encoder_key(name: str) -> bool:
    """Whether a (our-named) parameter belongs to the encoder rather than to a head."""
    return name.removeprefix("bert.").startswith(ENCODER_MODULES)


def translate_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module, expected: set[str],
                      source: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Map stored names onto `model`'s: (our state dict, stored keys we deliberately skipped)."""
    prefix = type(model).encoder_prefix
    own_heads = type(model).head_prefixes
    names = dialect(model.config)
    has_pooler = any(k.removeprefix(prefix).startswith("pooler.") for k in expected)
    ours: dict[str, torch.Tensor] = {}
    skipped: list[str] = []
    unknown: list[str] = []
    for key, value in tensors.items():
        if names.is_redundant_hf_key(key):
            continue
        name = names.from_hf_key(key)
        if name is None:
            unknown.append(key)
            continue
        if not is_encoder_key(name):
            if not name.startswith(own_heads):
                skipped.append(key)  # another task's head: fine-tuning starts from this checkpoint's encoder
                continue
            ours[name] = value
            continue
        name = prefix + name.removeprefix("bert.")
        if not has_pooler and name.removeprefix(prefix).startswith("pooler."):
            skipped.append(key)  # token-level models have no pooler; a pretrained checkpoint has one
            continue
        ours[name] = value
    if unknown:
        raise CheckpointError(f"{source}: unexpected tensors {unknown[:8]}{' ...' if len(unknown) > 8 else ''} "
                              f"that a {names.MODEL_NAME} checkpoint does not have; is this a {names.MODEL_NAME} "
                              "model (config.json's model_type)?")
    return ours, skipped


def load_model(path: str | os.PathLike | ModelDirectory, cls: type, *,
               config_overrides: dict[str, Any] | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, fresh_head: bool = False,
               step: int | None = None, num_labels: int | None = None) -> tuple[Any, LoadReport]:
    """Load a model directory into `cls`, in eval mode: (model, what loading did).

    `path` may be a directory already read (`read_directory`): its config is used as read, not read again.

    `step` picks a checkpoint of a run_pretraining.py output directory (default: the one its `checkpoint`
    file names).

    A head that the checkpoint lacks entirely starts freshly initialised (e.g. a classifier on top of a
    pretrained encoder) and is listed in the report's `fresh`; `fresh_head=True` also discards a stored head
    of another shape (new labels). `num_labels` (transformers' habit) asks for a head of that many labels:
    the stored one when it has as many, else a new one, fresh, named LABEL_0... (logged as a warning).
    Missing encoder tensors or wrong shapes are errors.
    """
    if isinstance(path, ModelDirectory):
        config, path = path.config, path.path
    else:
        config, _ = read_config(path, step=step)
    if num_labels is not None and integrity.label_count(num_labels) != config.num_labels:
        fresh_head = True
        config_overrides = {**(config_overrides or {}), "problem_type": None,
                            "id2label": {i: f"LABEL_{i}" for i in range(num_labels)}}
        log.warning("%s: num_labels=%d: a new head of %d labels (LABEL_0 ... LABEL_%d), initialised at random, "
                    "not read from the directory: fine-tune it before use", path, num_labels, num_labels,
                    num_labels - 1)
    if config_overrides:
        if "id2label" in config_overrides and "label2id" not in config_overrides:
            config_overrides = {**config_overrides, "label2id": None}
        try:
            config = config.replace(**config_overrides)
        except TypeError as exc:
            raise ConfigError(f"bad config override: {exc}") from None
    wanted = getattr(cls, "config_class", BertConfig)
    if not isinstance(config, wanted):
        raise CheckpointError(f"{path}: holds a {type(config).__name__.removesuffix('Config')} model (config.json's "
                              f"model_type), which {cls.__name__} cannot hold; load it with the class its "
                              "config.json names (bertforge.families.registry.load_model)")
    with weights_to_come():  # the checkpoint fills it: only what it lacks is initialised, below
        model = cls(config)
    heads = cls.head_prefixes
    names = dialect(config)
    source = str(weights_file(path, step=step))
    stored, not_weights = _read_stored(path, step)
    stored = getattr(model, "adopt_directory", lambda _, tensors: tensors)(Path(path), stored)  # ColBERT's files
    expected = model.state_dict()
    ours, skipped = translate_weights(stored, model, set(expected), source)
    skipped = not_weights + skipped
    if fresh_head:
        ours = {k: v for k, v in ours.items() if not k.startswith(heads)}
    integrity.check_float_parameters([(names.to_hf_key(k), v, expected[k]) for k, v in ours.items()
                                      if k in expected], source)
    integrity.check_shapes(ours, expected, names.to_hf_key, is_encoder_key, config.num_labels, source,
                           cls.__name__)
    missing = sorted(set(expected) - set(ours))
    stored_heads = {k.split(".")[0] for k in ours if k.startswith(heads)}
    fresh = [k for k in missing if (k.startswith(heads) and k.split(".")[0] not in stored_heads)
             or k.removeprefix(cls.encoder_prefix).startswith("pooler.")]
    hard_missing = [names.to_hf_key(k) for k in missing if k not in fresh]
    if hard_missing:
        raise CheckpointError(f"{source}: missing tensors {hard_missing[:8]}{' ...' if len(hard_missing) > 8 else ''}"
                              "; the checkpoint is incomplete or its config.json describes a different model")
    model.load_state_dict(ours, strict=False)
    model.tie_weights()
    if fresh:
        model.init_weights(only=set(fresh))
        log.info("%s: initialised fresh (not in the checkpoint): %s", source, ", ".join(fresh))
    if dtype is not None or device is not None:
        model.to(device=device, dtype=dtype)
    return model.eval(), LoadReport(source, fresh, skipped)
