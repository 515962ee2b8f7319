"""The compressed token index of a multi-vector folder (retrieval/token_index.py) against exact MaxSim, in one run:
recall@10, bytes per token, peak resident memory while indexing and at load, queries/s one at a time (index and
exact search, the same queries), and a build killed with SIGKILL in the middle, resumed, compared byte for byte
with the uninterrupted build.

    python -m benchmarks.colbert_index --folder /work/bench/plaid/books200k-colbert [--queries 300] [--exact-timed 20]

Corpus: a folder `bertforge embed --multi-vector` wrote (docs/benchmarks.md: the 200,000 book lines of
`benchmarks.ann_search`, the ANN benchmark's, embedded by all-MiniLM-L6-v2 made a ColBERT model). Queries:
--queries SQuAD v1.1 dev questions (the seeded sample of `benchmarks.ann_search`; none of them is a corpus line),
embedded with the query role by the folder's model. Exact MaxSim (`MultiVectorIndex.search_tokens`, every token of
every document) gives the reference top 10; the index's top 10 is compared with it as sets.

Memory: `bertforge index` runs in a child process, whose peak resident set (ru_maxrss) is reported beside the
folder's token vectors' size; at load, this process's resident set (VmRSS) just before and after opening the
index, and after every search, beside the index's bytes on disk (pages of the memory-mapped parts are resident
once a search has read them, and are the index's own bytes). The kill check builds a second index in a copy of
the folder (the shard files hard-linked: an index only adds files), kills it with SIGKILL once half of its parts
are written, runs it again and compares the sha256 of every index file with the first build's. Not imported by
the package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.ann_search import squad_questions

INDEX_FLAGS = ("centroids", "residual", "nprobe", "probe_tokens", "candidates", "rescore")


def resident_mib() -> float:
    """This process's resident set (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def index_command(folder: Path, args: argparse.Namespace) -> list[str]:
    flags = [part for name in INDEX_FLAGS if getattr(args, name) is not None
             for part in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]
    return [sys.executable, "-m", "bertforge", "index", "--index", str(folder), *flags]


def build(folder: Path, args: argparse.Namespace) -> dict:
    """`bertforge index` in a child process: its seconds and peak resident set."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run(index_command(folder, args), check=True)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, the largest child so far
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(peak / 1024, 1), "peak_is_this_build": peak > before}


def index_digests(folder: Path) -> dict[str, str]:
    from bertforge.retrieval.token_index import FOLDER_NAME, RECORD_NAME

    files = [folder / RECORD_NAME, *sorted((folder / FOLDER_NAME).iterdir())]
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in files if path.is_file()}


def killed_and_resumed(folder: Path, copy: Path, args: argparse.Namespace, parts: int) -> dict:
    """Build the index of a hard-linked copy of the folder, SIGKILL it once half its parts are written, build
    again; the sha256 of every index file against the uninterrupted build's."""
    from bertforge.retrieval.token_index import FOLDER_NAME, PART_RECORD, RECORD_NAME

    if copy.exists():
        subprocess.run(["rm", "-rf", str(copy)], check=True)
    (copy / "progress").mkdir(parents=True)
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if path.is_file() and relative.parts[0] not in (FOLDER_NAME, RECORD_NAME):
            os.link(path, copy / relative)
    child = subprocess.Popen(index_command(copy, args))
    target = copy / FOLDER_NAME / PART_RECORD.format(parts // 2)
    while child.poll() is None and not target.exists():
        time.sleep(0.2)
    written = sorted(p.name for p in (copy / FOLDER_NAME).glob("part-*.json"))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    committed = (copy / RECORD_NAME).exists()
    started = time.perf_counter()
    subprocess.run(index_command(copy, args), check=True)
    resumed = time.perf_counter() - started
    want, got = index_digests(folder), index_digests(copy)
    return {"killed_with_parts_written": len(written), "of_parts": parts, "committed_before_kill": committed,
            "resume_seconds": round(resumed, 1), "files_compared": len(want), "identical": want == got,
            "different": sorted(name for name in set(want) | set(got) if want.get(name) != got.get(name))}


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found.tolist(), exact.tolist())]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="a complete `embed --multi-vector` folder")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-timed", type=int, default=20, help="queries timed one at a time by exact search")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kill-copy", type=Path, help="run the kill -9 check in this folder (a copy)")
    parser.add_argument("--sweep", default="", help="extra search settings to measure: nprobe:candidates:rescore[:probe_tokens],...")
    for name in INDEX_FLAGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=str if name == "residual" else int)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import faiss
    import torch

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the index builds' children
    from bertforge.retrieval.multi_vector_search import MultiVectorIndex
    from bertforge.retrieval.query_embedding import embed_multi_vector_queries
    from bertforge.retrieval.token_index import open_token_index

    load = {"start": os.getloadavg()}
    exact = MultiVectorIndex(args.folder)
    tokens = sum(int(shard["vector_count"]) for shard in exact.shards)
    vectors_bytes = sum(shard["bytes"]["multivectors"] for shard in exact.shards)
    built = build(args.folder, args)
    record = json.loads((args.folder / "token-index.json").read_text())
    texts = squad_questions(args.queries, args.seed)
    queries = embed_multi_vector_queries(exact, texts, device="cpu")
    load["after_build"] = os.getloadavg()

    exact = MultiVectorIndex(args.folder)
    rss_before = resident_mib()
    index = open_token_index(exact)
    rss_loaded = resident_mib()
    started = time.perf_counter()
    reference_scores, reference = exact.search_tokens(queries, 10)  # every query at once: the reference top 10
    batch_seconds = time.perf_counter() - started
    exact_seconds = []
    for query in queries[:args.exact_timed]:
        started = time.perf_counter()
        exact.search_tokens([query], 10)
        exact_seconds.append(time.perf_counter() - started)

    def measured(**settings) -> dict:
        seconds, found = [], []
        for query in queries:
            started = time.perf_counter()
            found.append(index.search_tokens([query], 10, **settings)[1][0])
            seconds.append(time.perf_counter() - started)
        return {**settings, "recall_at_10": round(recall(np.array(found), reference), 4),
                "queries_per_second": round(len(queries) / sum(seconds), 2),
                "median_ms": round(1000 * float(np.median(seconds)), 1)}

    measured()  # the first pass reads the parts' pages: the timed pass below is the one reported
    default = measured()
    sweep = []
    for item in filter(None, args.sweep.split(",")):
        values = dict(zip(("nprobe", "candidates", "rescore", "probe_tokens"), (int(x) for x in item.split(":"))))
        sweep.append(measured(**values))
    rss_searched = resident_mib()
    load["after_search"] = os.getloadavg()
    kill = killed_and_resumed(args.folder, args.kill_copy, args, record["shards"]) if args.kill_copy else None
    load["end"] = os.getloadavg()
    index_mib = record["bytes"] / 2**20
    results = {
        "benchmark": "colbert_index", "folder": str(args.folder), "model": exact.manifest["model"]["path"],
        "documents": exact.count, "token_vectors": tokens, "dim": exact.dim, "dtype": exact.manifest["dtype"],
        "queries": {"count": len(queries), "source": f"SQuAD v1.1 dev questions, random.Random({args.seed}).sample"},
        "index": {"settings": record["settings"], "centroids": record["centroids"], "code_bytes": record["code_bytes"],
                  "bytes": record["bytes"], "bytes_per_token": record["bytes_per_token"],
                  "token_vectors_bytes": vectors_bytes,
                  "token_vectors_bytes_per_token": round(vectors_bytes / tokens, 1)},
        "build": {**built, "token_vectors_mib": round(vectors_bytes / 2**20, 1)},
        "load": {"index_mib_on_disk": round(index_mib, 1), "rss_before_open_mib": round(rss_before, 1),
                 "rss_after_open_mib": round(rss_loaded, 1),
                 "rss_open_delta_mib": round(rss_loaded - rss_before, 1),
                 "rss_after_searches_mib": round(rss_searched, 1),
                 "rss_searches_delta_mib": round(rss_searched - rss_before, 1),
                 "open_delta_over_index": round((rss_loaded - rss_before) / index_mib, 3),
                 "searched_delta_over_index": round((rss_searched - rss_before) / index_mib, 3)},
        "exact": {"queries_per_second": round(len(exact_seconds) / sum(exact_seconds), 3),
                  "timed_queries": len(exact_seconds), "batch_of_all_seconds": round(batch_seconds, 1)},
        "compressed": default, "sweep": sweep,
        "speedup_one_at_a_time": round(default["queries_per_second"] / (len(exact_seconds) / sum(exact_seconds)), 1),
        "kill_9": kill,
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "threads": args.threads, "load_average": load, "faiss": faiss.__version__,
                    "torch": torch.__version__},
    }
    print(json.dumps(results, indent=2))
    if args.json:
        from bertforge.storage import write_json

        write_json(args.json, results)


if __name__ == "__main__":
    main()
