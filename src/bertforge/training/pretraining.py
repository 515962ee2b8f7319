"""Pretraining entry point: a prepared data directory + a model preset (or checkpoint) -> a trained BERT.

`run_pretraining(PretrainConfig)` wires the parts together — tokenizer, the model the objective trains
(`BertForPretraining` for MLM + NSP, Google's recipe and the default; `BertForMaskedLM` for MLM only), the masked
batch stream (`data.datasets.PretrainingData`, rank-sharded under torchrun), held-out evaluation — and hands
them to the one training loop. A run file looks like:

    data_dir = "runs/shards-en"       # written by prepare_corpus
    tokenizer = "runs/vocab-en"       # vocab.txt + tokenizer_config.json the shards were made with
    model = "mini"                    # a preset (tiny ... large) or a model directory to continue from
    objective = "mlm"                 # or "mlm+nsp" (the default)
    [masking]
    mlm_probability = 0.3             # --mask-rate
    max_predictions_per_seq = 40
    [training]
    minutes = 60                      # a time budget, or steps = 10000
    schedule = "wsd"
    batch_size = 128
    lr = 1e-3

The `[training]` table is `PretrainTrainingConfig`: the loop's settings with pretraining's defaults (6% warmup,
checkpoints in runs/pretrain), kept for every key a run file or flag does not set.

`arch = "modernbert"` (`--arch modernbert`) pretrains a ModernBERT (`model/modernbert.py`) from the same shards,
packed or not (`pack_sequences`), with its recipe's defaults (`ARCH_DEFAULTS`: masked LM only, 30% masking, the
WSD schedule), each overridable but NSP, which it has no head for. Token types and NSP labels of the shards are
not read: it has no segments.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.checkpoint_format import read_config
from bertforge.configuration import dumps_toml, merge, setting
from bertforge.constants import VOCAB_NAME
from bertforge.data.datasets import PretrainingData
from bertforge.data.masking import MaskingConfig
from bertforge.data.shards import ShardIndex, vocab_checksum
from bertforge.errors import ConfigError
from bertforge.families.pretraining import ARCHES, OBJECTIVES
from bertforge.families.pretraining import FAMILY as PRETRAINING
from bertforge.model.bert import BertPretrainedModel
from bertforge.model.config import PRESETS, BertConfig
from bertforge.model.config.modernbert import PRESETS as MODERNBERT_PRESETS
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.runtime import check_user_precision, resolve_device, set_seed
from bertforge.storage import write_text
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.training import distributed
from bertforge.training.config import TrainingConfig
from bertforge.training.loop import TrainResult, train

log = logging.getLogger("bertforge.training")

RUN_CONFIG_NAME = "run.toml"
# The warmup of a pretraining run when none is given: the demo's, and within the 5-10% of the recipes people
# use (BERT: 10k of 1M steps is 1%, RoBERTa 6%, Cramming's one-cycle rises over half the budget).
PRETRAIN_WARMUP_RATIO = 0.06
DEFAULT_MASK_RATE = 0.15  # BERT's; `MaskingConfig.mlm_probability`'s default
# Each architecture's recipe where it differs from BERT's defaults (Warner et al., 2024: MLM only, 30% masking,
# warmup-stable-decay), applied under whatever a run file or flag sets (`PretrainConfig.implied_settings`).
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "modernbert": {"objective": "mlm", "masking": {"mlm_probability": 0.3}, "training": {"schedule": "wsd"}},
}
ARCH_PRESETS = {"bert": PRESETS, "modernbert": MODERNBERT_PRESETS}


@dataclass
class PretrainTrainingConfig(TrainingConfig):
    """`[training]` of a pretraining run: the loop's `TrainingConfig` with 6% warmup (`warmup_ratio`) and
    checkpoints in runs/pretrain. A subclass rather than a `TrainingConfig(...)` default, so that a run
    file's partial `[training]` table or a flag (`--steps 1000`) keeps these defaults for the other keys."""

    warmup_ratio: float = PRETRAIN_WARMUP_RATIO
    out_dir: str = "runs/pretrain"

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as exc:
            raise ConfigError(f"pretrain.{exc}") from None


@dataclass
class PretrainConfig:
    """A pretraining run (`bertforge pretrain`): top-level keys and the tables `[masking]` (`MaskingConfig`) and
    `[training]` (`TrainingConfig`, checkpoints in runs/pretrain). Each field carries its help text
    (`setting`), which `bertforge pretrain --help` shows."""

    data_dir: str = setting("", "a directory written by `bertforge prepare` (`data.preparation.prepare_corpus`)")
    tokenizer: str = setting("", "directory of the tokenizer the data was prepared with (default: data_dir if it "
                                 "holds a vocab.txt, else the model directory when continuing from one)")
    arch: str = setting("bert", "the encoder: bert, or modernbert (rotary positions, global attention every "
                                "third layer and a 128-token window in the others, GeGLU; its recipe's defaults: "
                                "objective mlm, --mask-rate 0.3, --schedule wsd)", choices=ARCHES)
    model: str = setting("base", "a preset of the arch (bert: tiny, mini, small, medium, base, large; modernbert: "
                                 "tiny, mini, small, base, large) or a model directory to continue pretraining "
                                 "from (its MLM/NSP heads are created when it has none)")
    model_overrides: dict[str, Any] = setting(help="config fields for a preset (BertConfig's, or ModernBertConfig's "
                                                   "with --arch modernbert), e.g. {hidden_dropout_prob = 0.1}",
                                              factory=dict)
    eval_batches: int = setting(50, "held-out batches per evaluation on each rank (0 = the whole held-out split)")
    pad_to_multiple_of: int = setting(8, "pad batches to a multiple of this length (8 suits tensor cores)")
    fast_path: bool = setting(True, "skip padding tokens in every matmul and fuse the QKV projection (tested "
                                    "equal to the plain path)")
    # Off by default: with `fast_path` the padding is skipped anyway, so packing pays mainly on the plain path.
    pack_sequences: bool = setting(False, "several short instances per row (block-diagonal attention, positions "
                                          "restarting with each; ModernBERT's window stays inside each): the "
                                          "same instances and losses with fewer rows")
    objective: str = setting("mlm+nsp", "mlm+nsp: masked LM and next-sentence prediction (Google's BERT); mlm: "
                                        "masked LM only, no NSP head or loss (RoBERTa, Cramming and later "
                                        "recipes), saved as a BertForMaskedLM", choices=OBJECTIVES)
    masking: MaskingConfig = setting(help="the MLM masking rule ([masking])", factory=MaskingConfig)
    training: PretrainTrainingConfig = setting(help="the loop settings ([training])", factory=PretrainTrainingConfig)

    def __post_init__(self) -> None:
        if not self.data_dir:
            raise ConfigError("pretraining needs data_dir: a directory prepared with prepare_corpus "
                              "(bertforge prepare --corpus ... --tokenizer ... --out ...)")
        if self.arch not in ARCHES:
            raise ConfigError(f"arch={self.arch!r} is invalid: use one of {ARCHES}")
        presets = ARCH_PRESETS[self.arch]
        if not (Path(self.model).is_dir() or self.model in presets):
            raise ConfigError(f"model={self.model!r} is neither a model directory nor a preset (of arch "
                              f"{self.arch!r}); use one of {sorted(presets)} or the path of a saved model")
        PRETRAINING.training.model_class_for(self.objective, self.arch)  # validates the objective for the arch
        if self.model_overrides and Path(self.model).is_dir():
            raise ConfigError("model_overrides apply to a preset; a model directory keeps its own config.json")
        for name, low in (("eval_batches", 0), ("pad_to_multiple_of", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name}={value!r} is invalid: use an integer >= {low}")

    @classmethod
    def implied_settings(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`data` (a run file's keys and flags) over the defaults of its `arch`'s recipe (`ARCH_DEFAULTS`)."""
        defaults = ARCH_DEFAULTS.get(data.get("arch")) if isinstance(data.get("arch"), str) else None
        if not defaults:
            return data
        tree = copy.deepcopy(defaults)
        merge(tree, data)
        return tree


def load_pretraining_tokenizer(config: PretrainConfig) -> Tokenizer:
    """The tokenizer named by `config.tokenizer`, or found in the data or model directory."""
    if config.tokenizer:
        return Tokenizer.from_pretrained(config.tokenizer)
    for candidate in (Path(config.data_dir), Path(config.model)):
        if (candidate / VOCAB_NAME).is_file():
            return Tokenizer.from_pretrained(candidate)
    raise ConfigError(f"no tokenizer: {config.data_dir} holds no {VOCAB_NAME}; set tokenizer = the directory of "
                      "the vocabulary the data was prepared with")


def preset_config(config: PretrainConfig, tokenizer: Tokenizer) -> BertConfig | ModernBertConfig:
    """The config of `config.model`, a preset of `config.arch`, sized to the tokenizer (vocabulary and special
    ids) under `model_overrides`."""
    overrides: dict[str, Any] = {"vocab_size": tokenizer.vocab_size, "pad_token_id": tokenizer.pad_token_id}
    if config.arch == "modernbert":
        # The released models' [CLS]/[SEP] ids are those of their own vocabulary: here, the tokenizer's.
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        overrides.update(cls_token_id=cls_id, bos_token_id=cls_id, sep_token_id=sep_id, eos_token_id=sep_id)
        return ModernBertConfig.preset(config.model, **{**overrides, **config.model_overrides})
    return BertConfig.preset(config.model, **{**overrides, **config.model_overrides})


def reaching(tokenizer: Tokenizer, positions: int) -> Tokenizer:
    """The tokenizer saved with the model, its `model_max_length` the model's positions: a vocabulary made for
    BERT says 512, and a ModernBERT pretrained with it reads 8,192 (the pipelines' window is the smaller of the
    two)."""
    if tokenizer.model_max_length == positions:
        return tokenizer
    reaches = copy.copy(tokenizer)
    reaches.config = dataclasses.replace(tokenizer.config, model_max_length=positions)
    return reaches


def build_model(config: PretrainConfig, tokenizer: Tokenizer, max_seq_length: int) -> BertPretrainedModel:
    """A fresh model of the objective's and arch's class (`BertForPretraining`, `BertForMaskedLM` or
    `ModernBertForMaskedLM`) from a preset, or one loaded from a model directory (heads the directory lacks
    start fresh; an NSP head the objective does not train is left out)."""
    cls = PRETRAINING.training.model_class_for(config.objective, config.arch)
    if Path(config.model).is_dir():
        saved = read_config(config.model)[0]
        if isinstance(saved, ModernBertConfig) != (config.arch == "modernbert"):
            kind = "modernbert" if isinstance(saved, ModernBertConfig) else "bert"
            raise ConfigError(f"{config.model} holds a {kind} model but arch={config.arch!r}; set arch = "
                              f"{kind!r} (--arch {kind}) to continue pretraining it")
        model = cls.from_pretrained(config.model)
        if model.config.vocab_size != tokenizer.vocab_size:
            raise ConfigError(f"{config.model} has a vocabulary of {model.config.vocab_size} but the tokenizer has "
                              f"{tokenizer.vocab_size}; continue pretraining with the model's own vocab.txt")
    else:
        model = cls(preset_config(config, tokenizer))
    if model.config.max_position_embeddings < max_seq_length:
        raise ConfigError(f"the data has sequences of up to {max_seq_length} tokens but the model has "
                          f"max_position_embeddings={model.config.max_position_embeddings}; prepare shorter "
                          "sequences or raise model_overrides.max_position_embeddings")
    # Instances vary in length (short targets, document ends): skip padding in every matmul, one QKV matmul.
    # Both are tested equal to the plain path (tests/unit/test_fast_paths.py). Not fused under LAMB: its
    # trust ratio is per parameter tensor, so one [3H, H] tensor would train differently from three [H, H].
    fused = config.fast_path and config.training.optimizer != "lamb"
    set_fast_paths(model, unpad=config.fast_path, fused_qkv=fused)
    return model.train()


def predictions_for_rate(masking: MaskingConfig, max_seq_length: int) -> MaskingConfig:
    """`masking` with a prediction cap that lets its rate apply to `max_seq_length` tokens.

    A rate raised above BERT's 15% (`--mask-rate 0.3`) with the cap left below it would quietly mask less than
    asked, so the cap is raised to the rate's share of the length (logged). At 15% a lower cap is Google's
    own choice for long sequences (20 for 128 tokens, 80 for 512) and only warned about.
    """
    expected = math.ceil(masking.mlm_probability * max_seq_length)
    if masking.max_predictions_per_seq >= expected:
        return masking
    if masking.mlm_probability > DEFAULT_MASK_RATE:
        log.info("masking.max_predictions_per_seq raised from %d to %d so that the masking rate %g applies to "
                 "sequences of %d tokens", masking.max_predictions_per_seq, expected, masking.mlm_probability,
                 max_seq_length)
        return dataclasses.replace(masking, max_predictions_per_seq=expected)
    log.warning("masking.max_predictions_per_seq=%d caps the predictions below %.0f%% of %d tokens (%d); "
                "Google used 20 for length 128 and 80 for 512", masking.max_predictions_per_seq,
                100 * masking.mlm_probability, max_seq_length, expected)
    return masking


def describe_warmup(training: TrainingConfig) -> str:
    """The warmup in words, for the log: "600 steps", "6% of the steps", "6% of the time", "half the run"."""
    if training.schedule == "one-cycle":
        return "half the run (one-cycle)"
    if training.warmup_steps:
        return f"{training.warmup_steps} steps"
    return f"{training.warmup_ratio:.0%} of the {'time' if training.minutes else 'steps'}"


def run_pretraining(config: PretrainConfig) -> TrainResult:
    """Pretrain (or continue pretraining) as `config` says; returns the loop's TrainResult.

    Under torchrun every process calls this; each reads its rank's slice of every global batch.
    """
    training = config.training
    check_user_precision(training.precision, resolve_device(training.device),
                         "pretrain.training.precision (--precision)")
    context = distributed.setup(training.device, training.distributed_timeout_s)
    index = ShardIndex.load(config.data_dir)
    tokenizer = load_pretraining_tokenizer(config)
    index.check_vocab(tokenizer)
    if index.settings.get("contiguous") and config.objective != "mlm":
        raise ConfigError(f"{config.data_dir} holds contiguous rows of text (prepare --contiguous), without the "
                          "sentence pairs next-sentence prediction needs: pretrain with objective = \"mlm\" "
                          "(--objective mlm), or prepare the data without --contiguous")
    max_seq_length = int(index.settings.get("max_seq_length", 0))
    masking = config.masking = predictions_for_rate(config.masking, max_seq_length)

    set_seed(training.seed)  # the same initial weights on every rank
    model = build_model(config, tokenizer, max_seq_length)
    tokenizer = reaching(tokenizer, model.config.max_position_embeddings)
    common = {"masking": masking, "seed": training.seed, "rank": context.rank,
              "world_size": context.world_size, "vocab_size": tokenizer.vocab_size,
              "special_ids": tokenizer.all_special_ids, "mask_id": tokenizer.mask_token_id,
              "pad_id": tokenizer.pad_token_id, "pad_to_multiple_of": config.pad_to_multiple_of,
              "vocab_checksum": vocab_checksum(tokenizer), "pack_sequences": config.pack_sequences}
    device = context.device
    batches = PretrainingData(index, split="train", batch_size=training.batch_size,
                              grad_accumulation=training.grad_accumulation, **common,
                              workers=training.resolved_data_workers(device), pin_memory=device.type == "cuda",
                              fixed_shapes=training.compile)  # a few shapes, each compiled once
    eval_fn = None
    task = PRETRAINING.training
    if sum(int(record["instances"]) for record in index.shards("heldout")) > 0:
        heldout = PretrainingData(index, split="heldout", batch_size=training.batch_size,
                                  drop_last=False, **common)
        limit = config.eval_batches or None

        def eval_fn(model, step):
            return task.evaluate(model, heldout.evaluation_batches(limit))
    elif context.is_main:
        log.warning("%s has no held-out split: training without evaluation (prepare the data with "
                    "heldout_fraction > 0 to watch held-out MLM/NSP loss)", config.data_dir)

    if context.is_main:
        log.info("pretraining data: %d training instances of up to %d tokens, %d per step, %d steps per epoch; "
                 "objective %s, masking %.0f%% of the tokens, %s schedule, warmup %s", batches.num_instances,
                 max_seq_length, batches.step_size, batches.steps_per_epoch // batches.grad_accumulation,
                 config.objective, 100 * masking.mlm_probability, training.schedule, describe_warmup(training))
        out_dir = Path(training.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / RUN_CONFIG_NAME, dumps_toml(config))
    objective = task.objective_for(model.config, next_sentence=model.next_sentence)
    return train(model, batches, objective, training, eval_fn=eval_fn, tokenizer=tokenizer, context=context)
