"""Google's TensorFlow 1 BERT checkpoints: their variable names, their layout and their directories.

The file format itself (index, shards, checksums, dtypes) is `interop.tf_bundle`; this module knows what
Google's BERT stores in it. Google's variable names (`bert/encoder/layer_3/attention/self/query/kernel`) map
to ours by `KEY_TABLE`, both ways. Dense kernels are stored [in, out] and are transposed to our [out, in];
`output_weights` (NSP, classifier, SQuAD) are stored [out, in] already and are not. Optimizer state
(`adam_m`, `adam_v`, `global_step`, loss-scale counters) is skipped and counted. `checkpoint_prefix` finds the
checkpoint in a release directory (`bert_model.ckpt`) or a run_pretraining.py output directory
(`model.ckpt-NNNN`, the latest per its `checkpoint` file unless a step is asked for).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertforge.errors import CheckpointError
from bertforge.interop.tf_bundle import INDEX_SUFFIX, STRING, TensorBundle

log = logging.getLogger(__name__)

GOOGLE_CONFIG_NAME = "bert_config.json"
RELEASE_PREFIX = "bert_model.ckpt"
CHECKPOINT_STATE_NAME = "checkpoint"

# --- Google's BERT names ---------------------------------------------------------------------------------

# Dense layers (kernel [in, out] -> our weight [out, in]; bias) and LayerNorms (gamma -> weight, beta -> bias):
# (our module, Google's scope); `{i}` is a layer index. Encoder modules carry `bert.` as Hugging Face keys do.
_DENSE = (
    ("bert.encoder.layers.{i}.attention.query", "bert/encoder/layer_{i}/attention/self/query"),
    ("bert.encoder.layers.{i}.attention.key", "bert/encoder/layer_{i}/attention/self/key"),
    ("bert.encoder.layers.{i}.attention.value", "bert/encoder/layer_{i}/attention/self/value"),
    ("bert.encoder.layers.{i}.attention.output", "bert/encoder/layer_{i}/attention/output/dense"),
    ("bert.encoder.layers.{i}.feed_forward.up", "bert/encoder/layer_{i}/intermediate/dense"),
    ("bert.encoder.layers.{i}.feed_forward.down", "bert/encoder/layer_{i}/output/dense"),
    ("bert.pooler.dense", "bert/pooler/dense"),
    ("mlm.transform", "cls/predictions/transform/dense"),
)
_NORMS = (
    ("bert.embeddings.norm", "bert/embeddings/LayerNorm"),
    ("bert.encoder.layers.{i}.attention.norm", "bert/encoder/layer_{i}/attention/output/LayerNorm"),
    ("bert.encoder.layers.{i}.feed_forward.norm", "bert/encoder/layer_{i}/output/LayerNorm"),
    ("mlm.norm", "cls/predictions/transform/LayerNorm"),
)
# Tensors stored as they are ([out, in] matrices and vectors): embeddings, the MLM output bias (the decoder
# weight is tied to the word embeddings), NSP, and the heads of run_classifier.py and run_squad.py.
_PLAIN = (
    ("bert.embeddings.word.weight", "bert/embeddings/word_embeddings"),
    ("bert.embeddings.position.weight", "bert/embeddings/position_embeddings"),
    ("bert.embeddings.token_type.weight", "bert/embeddings/token_type_embeddings"),
    ("mlm.bias", "cls/predictions/output_bias"),
    ("nsp.weight", "cls/seq_relationship/output_weights"),
    ("nsp.bias", "cls/seq_relationship/output_bias"),
    ("classifier.weight", "output_weights"),
    ("classifier.bias", "output_bias"),
    ("qa_outputs.weight", "cls/squad/output_weights"),
    ("qa_outputs.bias", "cls/squad/output_bias"),
)

# (ours, Google's, transposed): every parameter name pattern, both directions.
KEY_TABLE: tuple[tuple[str, str, bool], ...] = (
    *((f"{o}.weight", f"{g}/kernel", True) for o, g in _DENSE),
    *((f"{o}.bias", f"{g}/bias", False) for o, g in _DENSE),
    *((f"{o}.weight", f"{g}/gamma", False) for o, g in _NORMS),
    *((f"{o}.bias", f"{g}/beta", False) for o, g in _NORMS),
    *((o, g, False) for o, g in _PLAIN),
)


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(name).replace(r"\{i\}", r"(\d+)") + "$")


_FROM_GOOGLE = [(_pattern(g), o, t) for o, g, t in KEY_TABLE]
_TO_GOOGLE = [(_pattern(o), g, t) for o, g, t in KEY_TABLE]


def _lookup(name: str, table) -> tuple[str, bool] | None:
    for pattern, target, transposed in table:
        match = pattern.match(name)
        if match:
            return (target.replace("{i}", match.group(1)) if match.groups() else target), transposed
    return None


def from_google_key(name: str) -> tuple[str, bool] | None:
    """Google's variable name -> (our parameter name, whether the tensor is transposed), or None."""
    return _lookup(name, _FROM_GOOGLE)


def to_google_key(name: str) -> str:
    """Our parameter name (encoder keys under `bert.`) -> Google's variable name; unknown names raise."""
    found = _lookup(name, _TO_GOOGLE)
    if found is None:
        raise KeyError(f"no Google TF name for parameter {name!r}")
    return found[0]


# Optimizer and training-loop state: AdamWeightDecayOptimizer's slots (`<var>/adam_m`, `<var>/adam_v`), TF's
# own optimizers' slots and accumulators, the step counter and mixed-precision loss-scale counters.
OPTIMIZER_SLOTS = frozenset({"adam_m", "adam_v", "Adam", "Adam_1", "Momentum", "lamb_m", "lamb_v", "Adagrad",
                             "RMSProp", "RMSProp_1", "ExponentialMovingAverage"})
TRAINING_STATE = frozenset({"global_step", "bad_steps", "good_steps", "loss_scale", "current_loss_scale",
                            "beta1_power", "beta2_power", "learning_rate"})


def is_optimizer_state(name: str) -> bool:
    last = name.rsplit("/", 1)[-1]
    return last in OPTIMIZER_SLOTS or last in TRAINING_STATE


@dataclass
class GoogleWeights:
    """A Google BERT checkpoint under our names.

    tensors: our parameter name -> array (kernels already transposed). optimizer: optimizer and training
    state skipped (Google names). strings: string tensors skipped. unknown: names with no entry in the table
    (left under their Google name in `tensors`, so the caller reports them).
    """

    source: Path
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    optimizer: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def read_google_weights(prefix: str | os.PathLike) -> GoogleWeights:
    """Read a Google BERT checkpoint: model tensors under our names, optimizer state skipped and counted."""
    bundle = TensorBundle(prefix)
    out = GoogleWeights(bundle.index_file)
    for name, entry in bundle.entries.items():
        if is_optimizer_state(name):
            out.optimizer.append(name)
            continue
        if entry.dtype == STRING:
            out.strings.append(name)
            continue
        found = from_google_key(name)
        if found is None:
            out.unknown.append(name)
            out.tensors[name] = bundle.read(name)
            continue
        ours, transposed = found
        value = bundle.read(name)
        if transposed:
            if value.ndim != 2:
                raise CheckpointError(f"{bundle.index_file}: tensor {name!r} should be a 2-D kernel, has shape "
                                      f"{list(value.shape)}")
            value = np.ascontiguousarray(value.T)
        out.tensors[ours] = value
    if out.optimizer:
        log.info("%s: skipped %d optimizer-state tensors (%s)", bundle.index_file, len(out.optimizer),
                 ", ".join(sorted({n.rsplit('/', 1)[-1] for n in out.optimizer})))
    return out


def tensor_shapes(prefix: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Google name -> stored shape, from the index alone (no tensor data read)."""
    return {name: entry.shape for name, entry in TensorBundle(prefix).entries.items()}


# --- directories -----------------------------------------------------------------------------------------

_STEP = re.compile(r"^model\.ckpt-(\d+)\.index$")


def available_steps(directory: str | os.PathLike) -> list[int]:
    """Steps of the `model.ckpt-NNNN` checkpoints in a run_pretraining.py output directory, ascending."""
    folder = Path(directory)
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP.match(p.name)))


def is_google_directory(directory: str | os.PathLike) -> bool:
    """A directory holding a TF 1 checkpoint (`bert_model.ckpt.index` or `model.ckpt-N.index`)."""
    folder = Path(directory)
    if not folder.is_dir():
        return False
    return (folder / (RELEASE_PREFIX + INDEX_SUFFIX)).is_file() or bool(available_steps(folder)) \
        or any(p.name.endswith(".ckpt" + INDEX_SUFFIX) for p in folder.iterdir())


def _latest_from_state(folder: Path) -> Path | None:
    """The checkpoint the `checkpoint` file (a CheckpointState text proto) names as latest."""
    file = folder / CHECKPOINT_STATE_NAME
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: unreadable ({exc})") from None
    match = re.search(r'^\s*model_checkpoint_path\s*:\s*"((?:[^"\\]|\\.)*)"', text, re.MULTILINE)
    if match is None:
        raise CheckpointError(f"{file}: no model_checkpoint_path line; expected e.g. "
                              'model_checkpoint_path: "model.ckpt-1000"')
    named = match.group(1).encode("utf-8").decode("unicode_escape")
    candidate = Path(named) if os.path.isabs(named) or "://" in named else folder / named
    if not Path(f"{candidate}{INDEX_SUFFIX}").is_file():
        # Written on another machine (an absolute or gs:// path): the checkpoint sits next to the file.
        candidate = folder / re.split(r"[/\\]", named)[-1]
    if not Path(f"{candidate}{INDEX_SUFFIX}").is_file():
        raise CheckpointError(f"{file}: names checkpoint {named!r}, but {candidate.name}{INDEX_SUFFIX} is not "
                              f"in {folder}; pass step= to pick one of {available_steps(folder)}")
    return candidate


def checkpoint_prefix(directory: str | os.PathLike, step: int | None = None) -> Path:
    """The checkpoint PREFIX of a Google directory.

    `step` picks `model.ckpt-<step>`; otherwise the `checkpoint` file's latest, else `bert_model.ckpt`
    (a release), else the single `*.ckpt` prefix, else the highest step present.
    """
    folder = Path(directory)
    steps = available_steps(folder)
    if step is not None:
        if not isinstance(step, int) or isinstance(step, bool) or step not in steps:
            raise CheckpointError(f"{folder}: no checkpoint for step {step!r}; the directory has steps {steps} "
                                  "(files model.ckpt-NNNN.index)")
        return folder / f"model.ckpt-{step}"
    latest = _latest_from_state(folder)
    if latest is not None:
        return latest
    if (folder / (RELEASE_PREFIX + INDEX_SUFFIX)).is_file():
        return folder / RELEASE_PREFIX
    if steps:
        log.info("%s: no checkpoint file; taking the highest step, %d", folder, steps[-1])
        return folder / f"model.ckpt-{steps[-1]}"
    others = sorted(p.name.removesuffix(INDEX_SUFFIX) for p in folder.iterdir()
                    if p.name.endswith(".ckpt" + INDEX_SUFFIX))
    if len(others) == 1:
        return folder / others[0]
    raise CheckpointError(f"{folder}: no TensorFlow checkpoint found (expected {RELEASE_PREFIX}.index or "
                          "model.ckpt-NNNN.index)" + (f"; several prefixes {others}" if others else ""))
