"""What an over-budget client costs everyone else: small-request throughput of `--clients` closed-loop clients,
alone and while another process resends one request that is over `max_request_tokens` (64 texts of 99,000
characters: refused with 413 from its words, then with 429 unread during `--refusal-cooldown-s`).

Both phases run against one `bertforge serve` subprocess on a loopback port, one after the other, so they see
the same machine; the figure is the ratio of the two throughputs (the clients' requests per second under
attack / alone). A wall-clock ratio is a property of the machine and its load, which is why it is measured
here and not asserted by the test suite (tests/e2e/test_server_guards.py counts the work instead).

    python benchmarks/serve_refusal.py --clients 8 --seconds 5

Without `--model` it builds a MiniLM classifier (benchmarks/serve_load.py's), so `classify` windows texts.
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
from pathlib import Path

from benchmarks.serve_load import classifier_dir, free_port, load, load_texts

# The attacker: another process resending one body for `seconds`; prints its statuses as JSON.
ATTACKER = """
import json, sys, time
import httpx
url, seconds, body = sys.argv[1], float(sys.argv[2]), open(sys.argv[3], "rb").read()
statuses = []
stop = time.monotonic() + seconds
with httpx.Client(base_url=url, timeout=60) as client:
    while time.monotonic() < stop:
        answer = client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
        statuses.append(answer.status_code)
print(json.dumps(statuses))
"""


def over_budget_body() -> bytes:
    text = ("the weather in lisbon was warm, and the market by the river sold fish. " * 1400)[:99_000]
    return json.dumps({"inputs": [text] * 64}).encode("utf-8")


def wait_ready(port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the server exited during start-up")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("the server did not become ready in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a classifier directory (default: a MiniLM classifier)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase")
    parser.add_argument("--refusal-cooldown-s", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or classifier_dir(Path(scratch))
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", model, "--port", str(port),
                                   "--precision", "fp32", "--refusal-cooldown-s", str(args.refusal_cooldown_s)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, server)
            texts = load_texts()
            asyncio.run(load(port, "classify", texts, 2, 1.0))  # warm-up
            alone, errors = asyncio.run(load(port, "classify", texts, args.clients, args.seconds))
            (Path(scratch) / "body.json").write_bytes(over_budget_body())
            attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, f"http://127.0.0.1:{port}",
                                         str(args.seconds + 1), str(Path(scratch) / "body.json")],
                                        stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)  # its first request is in the server before the clients start
            attacked, attacked_errors = asyncio.run(load(port, "classify", texts, args.clients, args.seconds))
            statuses = json.loads(attacker.communicate(timeout=120)[0])
        finally:
            server.terminate()
            server.wait(timeout=60)
    base, under = len(alone) / args.seconds, len(attacked) / args.seconds
    print(f"{args.clients} clients, {args.seconds:g} s per phase, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}: {base:.1f} requests/s alone, {under:.1f} requests/s while one client resent "
          f"an over-budget request {len(statuses)} times ({statuses.count(413)} read and refused with 413, "
          f"{statuses.count(429)} refused unread with 429): {under / base:.2f} of their throughput kept; "
          f"errors {errors + attacked_errors}")


if __name__ == "__main__":
    main()
