"""Long context: a whole article in one window of up to 8,192 tokens against 512-token chunks, with a
ModernBERT-shaped embedding model trained here, on the held-apart SQuAD articles.

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42` (made once by
`benchmarks.serve_search.held_apart_set`): the held-apart articles' questions are the queries; the documents
are the 48 articles, each its paragraphs in order joined by a space (the corpus's paragraphs grouped by title).
A query's relevant document is the article of its answer paragraph. Figures: recall@1 and recall@10 of that
article, and the seconds each side took to embed the articles.

Runs, each model on the same articles and queries:
- `window`: one vector per article, the article in one window of `--window` tokens (default: the model's own
  limit, 8,192 for ModernBERT; an article longer than that is cut to it, as `embed` cuts every text, and the
  report counts them).
- `chunks`: the article cut into windows of `--chunk` tokens (default 512, [CLS] and [SEP] included) by the one
  windowing rule (`retrieval.text_chunks.chunk_spans`, `--overlap` tokens shared, default 0), each chunk a
  vector; an article scores a query by its best chunk.
Vectors are compared by cosine. `--reference` adds the same two runs for another model (default
all-MiniLM-L6-v2, chunks of its own 256-token window, the `window` run cut to 256 too).

    python -m benchmarks.long_context --model DIR [--out runs/long_context] [--json FILE] [--threads 1]

How DIR was made for the results in benchmarks/results/ (a tiny ModernBERT on the shared 2-core CPU):
`bertforge vocab` (16,000 WordPiece tokens) and `bertforge prepare --max-seq-length 256` over the bundled books
and the training-split paragraphs, `bertforge pretrain --arch modernbert --model tiny --minutes 15`, then
`bertforge finetune --format embedding-pairs` on the training split's (question, paragraph) pairs
(`retrieval-set --train-pairs`; --max-seq-length 256, batch 32: 120 steps at lr 5e-4, then the checkpoint at step
60 of a 240-step run at lr 3e-4 from there, stopped to free the CPU for the measurement). That
pretraining ran before `pretrain` saved the tokenizer with the model's 8,192 positions (its vocabulary said 512),
so the fine-tuned directory was re-saved with the tokenizer's model_max_length at 8,192 first. Not imported by
the package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from benchmarks.serve_search import held_apart_set
from benchmarks.vector_storage import minilm
from bertforge.inference.pipelines import load_pipeline
from bertforge.retrieval.text_chunks import chunk_spans


def articles(beir: Path) -> tuple[list[str], list[str], dict[str, str]]:
    """(titles, article texts, paragraph id -> title) of a BEIR folder whose documents carry their title."""
    texts: dict[str, list[str]] = {}
    owner = {}
    for line in (beir / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            texts.setdefault(row["title"], []).append(row["text"])
            owner[row["_id"]] = row["title"]
    titles = list(texts)
    return titles, [" ".join(texts[t]) for t in titles], owner


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def embed(pipeline, texts: list[str]) -> np.ndarray:
    return unit(np.asarray([answer["embedding"] for answer in pipeline(texts)], dtype=np.float32))


def recall(scores: np.ndarray, wanted: list[int], k: int) -> float:
    """Share of queries (rows of `scores` [Q, A]) whose wanted article is among their k best."""
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return float(np.mean([w in row for w, row in zip(wanted, best)]))


def runs(model: str, texts: list[str], queries: list[str], wanted: list[int], window: int | None, chunk: int,
         overlap: int, batch_size: int) -> dict:
    """The `window` and `chunks` runs of one model."""
    whole = load_pipeline(model, "embed", device="cpu", max_length=window, batch_size=1)
    limit = whole.max_length
    tokenizer = whole.tokenizer
    lengths = [len(tokenizer.encode(text, add_special_tokens=False).ids) + 2 for text in texts]
    short = load_pipeline(model, "embed", device="cpu", max_length=min(chunk, limit), batch_size=batch_size)
    started = time.perf_counter()
    query_vectors = embed(short, queries)
    query_seconds = time.perf_counter() - started
    started = time.perf_counter()
    article_vectors = embed(whole, texts)
    window_seconds = time.perf_counter() - started
    scores = query_vectors @ article_vectors.T  # [Q, A]
    report = {"model": model, "articles": len(texts), "article_tokens": {"min": min(lengths), "max": max(lengths),
              "mean": round(float(np.mean(lengths)), 1)}, "queries": len(queries),
              "query_seconds": round(query_seconds, 1)}
    report["window"] = {"tokens": limit, "articles_cut": sum(n > limit for n in lengths),
                        "recall@1": round(recall(scores, wanted, 1), 4),
                        "recall@10": round(recall(scores, wanted, 10), 4), "embed_seconds": round(window_seconds, 1)}
    size = min(chunk, limit) - 2  # the chunk's tokens; [CLS] and [SEP] make the window
    pieces, owner = [], []
    for number, text in enumerate(texts):
        for span in chunk_spans(tokenizer, text, size, overlap):
            pieces.append(text[span.start:span.end])
            owner.append(number)
    started = time.perf_counter()
    chunk_vectors = embed(short, pieces)
    chunk_seconds = time.perf_counter() - started
    by_chunk = query_vectors @ chunk_vectors.T  # [Q, C]
    best = np.full((len(queries), len(texts)), -np.inf, dtype=np.float32)
    owners = np.asarray(owner)
    for number in range(len(texts)):
        best[:, number] = by_chunk[:, owners == number].max(axis=1)
    report["chunks"] = {"tokens": size + 2, "overlap": overlap, "chunks": len(pieces),
                        "recall@1": round(recall(best, wanted, 1), 4), "recall@10": round(recall(best, wanted, 10), 4),
                        "embed_seconds": round(chunk_seconds, 1)}
    print(json.dumps(report), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a ModernBERT-shaped embedding model directory")
    parser.add_argument("--reference", default="minilm", help="another model for the same runs ('minilm': "
                        "all-MiniLM-L6-v2; 'none' for no reference)")
    parser.add_argument("--out", type=Path, default=Path("runs/long_context"))
    parser.add_argument("--window", type=int, default=8192, help="tokens of the whole-article window, at most the "
                        "model's limit (default 8192)")
    parser.add_argument("--chunk", type=int, default=512, help="tokens per chunk window (default 512)")
    parser.add_argument("--overlap", type=int, default=0)
    parser.add_argument("--queries", type=int, help="the first N queries (default: all)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the report here too")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    beir, rows, queries, _, relevant = held_apart_set(args.out, args.queries)
    titles, texts, owner = articles(beir)
    wanted = [titles.index(owner[next(iter(ids))]) for ids in relevant]
    report = {"benchmark": "long_context", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs", "threads":
              args.threads, "load_before": os.getloadavg(), "held_apart_articles": len(set(wanted)),
              "model": runs(args.model, texts, queries, wanted, args.window, args.chunk, args.overlap, args.batch_size)}
    if args.reference != "none":
        reference = minilm() if args.reference == "minilm" else args.reference
        report["reference"] = runs(reference, texts, queries, wanted, None, args.chunk, args.overlap,
                                   args.batch_size)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    for path in filter(None, (args.json, args.out / "report.json")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
