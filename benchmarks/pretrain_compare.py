"""ModernBERT-shaped vs BERT-shaped: the same CPU minutes, non-embedding parameters, data and tokens per step.

On the bundled books (data/demo/en, the demo's corpus and vocabulary recipe), each architecture is pretrained
for the same budget of CPU time (`budget_clock = "cpu"`: the process's CPU seconds, which the other jobs of a
shared machine do not use up) from the same contiguous rows of text (`prepare --contiguous`), once per seed,
then:

1. held-out MLM accuracy on the same held-out documents with the same masks for every model: 15% of the
   tokens (BERT's rate) whatever rate a model trained with, masks drawn with one fixed seed;
2. fine-tuned on the demo's book task (which of the 4 books is a sentence from?), its dev accuracy.

What is held equal: the vocabulary and the shards, the sequence length and batch (so tokens per step), the
training masking rate (30%, ModernBERT's recipe, for both), the schedule (warmup-stable-decay on CPU time),
lr, Adam's betas, no dropout, one intra-op thread per run, and the non-embedding parameters (every parameter
but the token, position and token-type tables): the BERT is the demo's `tiny` (2 layers, hidden 128, FFN 512);
the ModernBERT has `--modernbert-layers` (3) layers of hidden 128 (deeper and narrower, as ModernBERT's shapes;
global attention every third layer, a 128-token window in the others) and the GeGLU width that brings its
non-embedding count nearest the BERT's (printed).
What differs is the architecture and each one's own initialisation (BERT: normal, std 0.05 as the demo;
ModernBERT: its truncated normal).

Runs are separate processes so that several can share the machine (each counts only its own CPU time):

    python -m benchmarks.pretrain_compare prepare --out /work/bench/mbcompare
    python -m benchmarks.pretrain_compare run --out /work/bench/mbcompare --arch bert --seed 1 --cpu-minutes 3
    ... (each arch and seed; `run` without --arch/--seed runs them all, one after another)
    python -m benchmarks.pretrain_compare report --out /work/bench/mbcompare \
        --json benchmarks/results/pretrain_compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from bertforge.data.datasets import PretrainingData
from bertforge.data.masking import MaskingConfig
from bertforge.data.preparation import prepare_corpus
from bertforge.data.shards import ShardIndex, vocab_checksum
from bertforge.data.text_files import resolve_inputs
from bertforge.demo import (
    ADAM_BETAS,
    FINETUNE_BATCH,
    FINETUNE_LR,
    FINETUNE_TASK,
    HELDOUT_DOCUMENTS,
    LANGUAGES,
    MODEL_SETTINGS,
    PEAK_LR,
    WARMUP_RATIO,
    write_book_task,
)
from bertforge.families.pretraining import FAMILY as PRETRAINING
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import (
    DataConfig,
    FeatureConfig,
    FinetuneConfig,
    FinetuneTrainingConfig,
)
from bertforge.training.pretraining import (
    PretrainConfig,
    PretrainTrainingConfig,
    preset_config,
    run_pretraining,
)
from bertforge.training.schedules import process_cpu_seconds

CORPUS = Path("data/demo/en")
# The demo's rows and batch (2,048 tokens per step for both): a step cheap enough for the thousand-odd steps
# that take a small model off the plateau of frequent tokens in a few CPU minutes. Rows this short are within
# ModernBERT's local window (64 tokens each side), so its local layers see the whole row here.
SEQUENCE_LENGTH = 64
BATCH_SIZE = 32
TRAIN_MASK_RATE = 0.3  # ModernBERT's recipe, for both
EVAL_MASK_RATE = 0.15  # the measurement: BERT's rate, the same masks for every model
EVAL_SEED = 0
EVAL_BATCHES = 0  # the whole held-out split (its 8 documents), every row once
BOOK_SEED = 0  # the book task's sentences are the same for every model
FINETUNE_LENGTH = 64  # the demo's
BERT_PRESET = "tiny"  # the demo's: 2 layers, hidden 128, FFN 512
MODERNBERT_PRESET = "tiny"  # hidden 128, 2 heads; its layers and GeGLU width set below
ARCHES = ("bert", "modernbert")
EMBEDDING_TABLES = (torch.nn.Embedding,)


def embedding_parameters(model: torch.nn.Module) -> int:
    """The parameters of the token, position and token-type tables."""
    return sum(p.numel() for m in model.modules() if isinstance(m, EMBEDDING_TABLES) for p in m.parameters())


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Every parameter but the embedding tables (a tied decoder is the token table: counted once, out)."""
    return sum(p.numel() for p in model.parameters()) - embedding_parameters(model)


def pretrain_config(arch: str, data_dir: Path, out_dir: Path, seed: int, cpu_minutes: float,
                    overrides: dict, lr: float = PEAK_LR, mask_rate: float = TRAIN_MASK_RATE) -> PretrainConfig:
    training = PretrainTrainingConfig(minutes=cpu_minutes, budget_clock="cpu", batch_size=BATCH_SIZE, lr=lr,
                                      schedule="wsd", warmup_ratio=WARMUP_RATIO, betas=list(ADAM_BETAS),
                                      log_every=50, eval_every=0, save_every=0, keep_last=1, seed=seed,
                                      out_dir=str(out_dir), precision="fp32", device="cpu", progress=False)
    model = BERT_PRESET if arch == "bert" else MODERNBERT_PRESET
    return PretrainConfig(data_dir=str(data_dir), arch=arch, model=model, model_overrides=overrides,
                          eval_batches=EVAL_BATCHES, objective="mlm",
                          masking=MaskingConfig(mlm_probability=mask_rate), training=training)


def shapes(data_dir: Path, modernbert_layers: int) -> dict:
    """Each architecture's model overrides, the ModernBERT's GeGLU width chosen (multiples of 8) so that its
    non-embedding parameters come nearest the BERT's; and both counts."""
    tokenizer = Tokenizer.from_pretrained(data_dir)
    family = PRETRAINING.training
    bert_overrides = dict(MODEL_SETTINGS)
    bert = family.model_class_for("mlm", "bert")(
        preset_config(pretrain_config("bert", data_dir, data_dir, 0, 1, bert_overrides), tokenizer))
    target = non_embedding_parameters(bert)

    def modernbert(width: int) -> torch.nn.Module:
        overrides = {"num_hidden_layers": modernbert_layers, "intermediate_size": width}
        config = preset_config(pretrain_config("modernbert", data_dir, data_dir, 0, 1, overrides), tokenizer)
        return family.model_class_for("mlm", "modernbert")(config)

    # The formula leaves out what does not depend on the width (the decoder's bias): measured once, added.
    first = modernbert(192)
    hidden = first.config.hidden_size
    rest = non_embedding_parameters(first) - non_embedding_parameters_of_width(modernbert_layers, 192, hidden)
    width = min(range(8, 4096, 8), key=lambda w: abs(
        non_embedding_parameters_of_width(modernbert_layers, w, hidden) + rest - target))
    model = modernbert(width)
    counts = {"bert": {"non_embedding": target, "embedding": embedding_parameters(bert),
                       "layers": bert.config.num_hidden_layers, "hidden": bert.config.hidden_size,
                       "intermediate": bert.config.intermediate_size},
              "modernbert": {"non_embedding": non_embedding_parameters(model),
                             "embedding": embedding_parameters(model), "layers": modernbert_layers,
                             "hidden": model.config.hidden_size, "intermediate": width,
                             "global_attn_every_n_layers": model.config.global_attn_every_n_layers,
                             "local_attention": model.config.local_attention}}
    counts["non_embedding_ratio"] = counts["modernbert"]["non_embedding"] / target
    return {"bert": bert_overrides,
            "modernbert": {"num_hidden_layers": modernbert_layers, "intermediate_size": width},
            "parameters": counts}


def non_embedding_parameters_of_width(layers: int, width: int, hidden: int) -> int:
    """A ModernBERT's non-embedding parameters from its shape, without building it (the width search): per
    layer a fused QKV and an output projection (4 H^2), GeGLU's Wi (H x 2I) and Wo (I x H), two bias-free
    norms; the rest (embedding and final norms, the head, the decoder's bias) does not depend on the width."""
    return layers * (4 * hidden * hidden + 3 * hidden * width + 2 * hidden)


def prepare(out: Path) -> None:
    files = resolve_inputs(CORPUS)
    spec = LANGUAGES["en"]
    tokenizer = Tokenizer(build_vocab(files, spec.vocab_size, lang="en"), TokenizerConfig(do_lower_case=True))
    data = out / "data"
    report = prepare_corpus(files, tokenizer, data, max_seq_length=SEQUENCE_LENGTH,
                            heldout_documents=HELDOUT_DOCUMENTS, seed=1, contiguous=True)
    tokenizer.save_pretrained(data)
    print(report.summary())
    train, dev, labels = write_book_task(files, out / "books", spec.min_sentence_chars,
                                         FINETUNE_TASK.per_book_train, FINETUNE_TASK.per_book_dev,
                                         random.Random(BOOK_SEED))
    print(f"book task: {train}, {dev}: {labels}")


def heldout_accuracy(model_dir: Path, data_dir: Path) -> dict:
    """Held-out MLM accuracy at EVAL_MASK_RATE with masks of EVAL_SEED: the same positions for every model."""
    from bertforge.families.registry import load_model

    model, _ = load_model(model_dir)
    tokenizer = Tokenizer.from_pretrained(data_dir)
    index = ShardIndex.load(data_dir)
    masking = MaskingConfig(mlm_probability=EVAL_MASK_RATE,
                            max_predictions_per_seq=int(EVAL_MASK_RATE * SEQUENCE_LENGTH + 1))
    heldout = PretrainingData(index, split="heldout", batch_size=BATCH_SIZE, drop_last=False, masking=masking,
                              seed=EVAL_SEED, vocab_size=tokenizer.vocab_size,
                              special_ids=tokenizer.all_special_ids, mask_id=tokenizer.mask_token_id,
                              pad_id=tokenizer.pad_token_id, pad_to_multiple_of=8,
                              vocab_checksum=vocab_checksum(tokenizer))
    with torch.no_grad():
        values = PRETRAINING.training.evaluate(model, heldout.evaluation_batches(EVAL_BATCHES or None))
    return {key: float(value) for key, value in values.items()}


def run_one(out: Path, arch: str, seed: int, cpu_minutes: float, modernbert_layers: int,
            lr: float = PEAK_LR, mask_rate: float = TRAIN_MASK_RATE) -> dict:
    torch.set_num_threads(1)  # the CPU budget counts every thread: one, so no thread waits on another
    data = out / "data"
    chosen = shapes(data, modernbert_layers)
    run_dir = out / "runs" / f"{arch}-{seed}"
    started_cpu, started = process_cpu_seconds(), time.perf_counter()
    result = run_pretraining(pretrain_config(arch, data, run_dir / "pretrain", seed, cpu_minutes, chosen[arch],
                                             lr=lr, mask_rate=mask_rate))
    pretrain_cpu, pretrain_wall = process_cpu_seconds() - started_cpu, time.perf_counter() - started
    heldout = heldout_accuracy(result.checkpoint, data)
    began_cpu = process_cpu_seconds()
    finetune = run_finetuning(FinetuneConfig(
        model=str(result.checkpoint),
        data=DataConfig(format="classification", train=str(out / "books" / "train.tsv"),
                        dev=str(out / "books" / "dev.tsv"), text_a_column="text_a", label_column="label"),
        features=FeatureConfig(max_seq_length=FINETUNE_LENGTH),
        training=FinetuneTrainingConfig(out_dir=str(run_dir / "finetune"), epochs=FINETUNE_TASK.epochs,
                                        batch_size=FINETUNE_BATCH, lr=FINETUNE_LR, seed=seed, device="cpu",
                                        precision="fp32", progress=False)))
    figures = {"arch": arch, "seed": seed, "cpu_minutes_budget": cpu_minutes, "lr": lr,
               "train_mask_rate": mask_rate, "steps": result.step,
               "tokens_per_step": BATCH_SIZE * SEQUENCE_LENGTH, "pretrain_cpu_s": pretrain_cpu,
               "pretrain_wall_s": pretrain_wall, "overrides": chosen[arch], "parameters": chosen["parameters"],
               "heldout_at_15": heldout, "heldout_during_training": result.eval,
               "book_dev_accuracy": finetune.best_metrics.get("accuracy"),
               "finetune_cpu_s": process_cpu_seconds() - began_cpu,
               "loadavg_end": os.getloadavg(), "torch_threads": torch.get_num_threads()}
    (run_dir / "result.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: figures[k] for k in ("arch", "seed", "steps", "pretrain_cpu_s", "pretrain_wall_s",
                                              "book_dev_accuracy")}), flush=True)
    print(f"held-out MLM accuracy at 15%: {heldout['mlm_acc']:.4f} (majority {heldout['mlm_majority_acc']:.4f})")
    return figures


def mean_sd(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def report(out: Path, json_path: Path | None) -> dict:
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json"))]
    summary: dict = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_now": os.getloadavg()},
                     "date": time.strftime("%Y-%m-%d", time.gmtime()),
                     "settings": {"sequence_length": SEQUENCE_LENGTH, "batch_size": BATCH_SIZE,
                                  "eval_mask_rate": EVAL_MASK_RATE, "eval_batches": EVAL_BATCHES,
                                  "schedule": "wsd",
                                  "warmup_ratio": WARMUP_RATIO, "betas": list(ADAM_BETAS),
                                  "finetune": {"per_book_train": FINETUNE_TASK.per_book_train,
                                               "per_book_dev": FINETUNE_TASK.per_book_dev,
                                               "epochs": FINETUNE_TASK.epochs, "lr": FINETUNE_LR,
                                               "batch_size": FINETUNE_BATCH, "max_seq_length": FINETUNE_LENGTH}},
                     "runs": runs, "arches": {}}
    for arch in ARCHES:
        mine = [r for r in runs if r["arch"] == arch]
        if not mine:
            continue
        summary["parameters"] = mine[0]["parameters"]
        summary["arches"][arch] = {
            "seeds": [r["seed"] for r in mine],
            "cpu_minutes_budget": mine[0]["cpu_minutes_budget"],
            # runs from before --lr/--train-mask-rate used the defaults
            "lr": mine[0].get("lr", PEAK_LR), "train_mask_rate": mine[0].get("train_mask_rate", TRAIN_MASK_RATE),
            "steps": mean_sd([r["steps"] for r in mine]),
            "pretrain_cpu_s": mean_sd([r["pretrain_cpu_s"] for r in mine]),
            "pretrain_wall_s": mean_sd([r["pretrain_wall_s"] for r in mine]),
            "heldout_mlm_acc_at_15": mean_sd([r["heldout_at_15"]["mlm_acc"] for r in mine]),
            "heldout_majority_acc_at_15": mine[0]["heldout_at_15"]["mlm_majority_acc"],
            "book_dev_accuracy": mean_sd([r["book_dev_accuracy"] for r in mine]),
        }
        row = summary["arches"][arch]
        print(f"{arch:10s} lr {row['lr']:g}, masking {row['train_mask_rate']:g}, {len(mine)} seeds, "
              f"{row['steps']['mean']:.0f} steps: held-out MLM acc at 15% "
              f"{row['heldout_mlm_acc_at_15']['mean']:.4f} ± {row['heldout_mlm_acc_at_15']['sd']:.4f} "
              f"(majority {row['heldout_majority_acc_at_15']:.4f}); book task "
              f"{row['book_dev_accuracy']['mean']:.4f} ± {row['book_dev_accuracy']['sd']:.4f}")
    if "parameters" in summary:
        counts = summary["parameters"]
        print(f"non-embedding parameters: BERT {counts['bert']['non_embedding']:,}, ModernBERT "
              f"{counts['modernbert']['non_embedding']:,} ({counts['non_embedding_ratio']:.4f}x)")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["prepare", "run", "report", "shapes"])
    parser.add_argument("--out", type=Path, default=Path("runs/pretrain_compare"))
    parser.add_argument("--arch", choices=ARCHES, action="append", help="(run) default: both")
    parser.add_argument("--seed", type=int, action="append", help="(run) default: 1 2 3")
    parser.add_argument("--cpu-minutes", type=float, default=3.0, help="(run) CPU minutes of pretraining")
    parser.add_argument("--modernbert-layers", type=int, default=3)
    parser.add_argument("--lr", type=float, default=PEAK_LR, help="(run) peak learning rate (the demo's: %(default)s)")
    parser.add_argument("--train-mask-rate", type=float, default=TRAIN_MASK_RATE,
                        help="(run) the masking rate pretraining uses (default %(default)s, ModernBERT's)")
    parser.add_argument("--json", type=Path, default=None, help="(report) write the summary here")
    args = parser.parse_args(argv)
    if args.stage == "prepare":
        prepare(args.out)
    elif args.stage == "shapes":
        print(json.dumps(shapes(args.out / "data", args.modernbert_layers), indent=2))
    elif args.stage == "run":
        for arch in args.arch or ARCHES:
            for seed in args.seed or [1, 2, 3]:
                run_one(args.out, arch, seed, args.cpu_minutes, args.modernbert_layers, args.lr,
                        args.train_mask_rate)
    else:
        report(args.out, args.json)


if __name__ == "__main__":
    main()
