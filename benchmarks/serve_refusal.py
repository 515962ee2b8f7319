"""What one hostile client costs everyone else: small-request throughput of `--clients` closed-loop clients,
alone and while another process resends one request (`--attack in-limit`: alone, attacked, alone again, the
attacked phase compared with the mean of the two alone phases, as the machine's load drifts):

- `--attack over-budget` (default): a request over `max_request_tokens` (64 texts of 99,000 characters:
  refused with 413 from its words, then with 429 unread during `--refusal-cooldown-s`);
- `--attack in-limit`: the largest request the server's static limits allow (texts of 99,950 characters, just
  under `max_chars`; the attacker asks with 12, and only a 413 naming `max_request_tokens` makes it send as
  many as the refusal's own numbers say fit, 90% of them, or one shorter text where not even one fits),
  resent as soon as it is answered; after a 413 or a 429 it waits the answer's Retry-After (at least 1 s),
  as a client must. Its own throughput (characters answered per second) is printed too, alone (the probe
  that found its size, on the idle server) and under the clients' load. Admission is by the static limits
  alone (issue 46): once its size is found, the large request must never get 413 again, however slow the
  loaded server runs, nor 429 while the queue has room (one large client and `--clients` small ones are far
  from `max_queue`); the run counts both and exits 1 if either happened. (Before, the server refused in-limit
  requests with 413 by its measured speed, a pace guarantee within `request_timeout_s`; the figures of that
  rule are in benchmarks/results/serve_refusal-2026-12-05.json.)

Both phases run against one `bertforge serve` subprocess on a loopback port, one after the other, so they see
the same machine; the figure is the ratio of the two throughputs (the clients' requests per second under
attack / alone). A wall-clock ratio is a property of the machine and its load, which is why it is measured
here and not asserted by the test suite (tests/e2e/test_server_guards.py counts the work instead).

    python -m benchmarks.serve_refusal --clients 8 --seconds 5
    python -m benchmarks.serve_refusal --clients 64 --seconds 30 --attack in-limit --json FILE

`--json FILE` also writes the printed figures: each phase's requests per second, the share kept, errors,
the model calls of each phase (from the server's /metrics) and the large client's answers.

Without `--model` it builds a MiniLM classifier (benchmarks/serve_load.py's), so `classify` windows texts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


# The in-limit attacker: finds the largest request within the static limits (only a 413 naming max_request_tokens
# makes it smaller), then resends it as soon as it is answered; it keeps the rules a client must keep (after a
# 413 or 429 it waits the Retry-After, at least 1 s, and a 413 makes its next request as small as the refusal's
# numbers say fits, 90% of that), so what it costs the others is the work of requests the server admits. Prints {"statuses": [...], "texts": n, "chars":
# c, "seconds": [...]} as JSON (`probe`: the size found and how its first admitted request went, alone).
IN_LIMIT_ATTACKER = """
import json, re, sys, time
import httpx
url, seconds, first = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "probe"
source = "the weather in lisbon was warm, and the market by the river sold fish. " * 1400
count, chars = (12, 99_950) if first else (int(sys.argv[4]), int(sys.argv[5]))
statuses, took, alone, answered = [], [], {"status": None, "seconds": 0}, 0
began_all = time.monotonic()
stop = time.monotonic() + (600 if first else seconds)


def send(client):
    global count, chars
    began = time.monotonic()
    answer = client.post("/v1/classify", json={"inputs": [source[:chars]] * count})
    spent = round(time.monotonic() - began, 1)
    if answer.status_code in (413, 429):
        numbers = re.search(r"make (\\d+) tokens.*?at most (\\d+) per request", answer.text)
        if answer.status_code == 413 and numbers:
            fits = count * int(numbers[2]) / int(numbers[1]) * 0.9  # texts that fit
            count, chars = (int(fits), chars) if fits >= 1 else (1, max(100, int(chars * fits)))
        time.sleep(max(1.0, float(answer.headers.get("retry-after") or 1)))
    return answer.status_code, spent


with httpx.Client(base_url=url, timeout=600) as client:
    while time.monotonic() < stop:
        sending = count * chars
        status, spent = send(client)
        statuses.append(status)
        took.append(spent)
        answered += sending if status == 200 else 0
        if first and status not in (413, 429):
            alone = {"status": status, "seconds": spent, "texts": count, "chars": chars}
            break
if first:
    print(json.dumps({"texts": alone.get("texts", count), "chars": chars, "alone": alone, "statuses": statuses}))
else:
    print(json.dumps({"statuses": statuses, "texts": count, "chars": chars, "seconds": took,
                      "answered_chars": answered, "elapsed": time.monotonic() - began_all}))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a classifier directory (default: a MiniLM classifier)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase")
    parser.add_argument("--refusal-cooldown-s", type=float, default=1.0)
    parser.add_argument("--attack", choices=("over-budget", "in-limit"), default="over-budget")
    parser.add_argument("--request-timeout-s", type=float, default=None,
                        help="the server's --request-timeout-s (default: the server's own, none)")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    if args.attack == "in-limit":
        return 1 if in_limit(args) else 0
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
    write_figures(args, {"requests_per_s": {"alone": base, "attacked": under}, "kept": under / base,
                         "errors": errors + attacked_errors,
                         "attacker_statuses": dict(Counter(statuses))})
    return 0


def write_figures(args: argparse.Namespace, figures: dict) -> None:
    """`--json`: the run's settings, machine and figures (NaN written as null), written atomically."""
    if args.json is None:
        return
    from bertforge.storage import write_json

    def clean(value):
        if isinstance(value, float):
            return None if math.isnan(value) else round(value, 4)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    run = {"attack": args.attack, "clients": args.clients, "seconds_per_phase": args.seconds,
           "admission": "static limits only (issue 46)", "request_timeout_s": args.request_timeout_s, "refusal_cooldown_s": args.refusal_cooldown_s,
           "model": args.model or "MiniLM classifier (benchmarks/serve_load.py)", "cpu_count": os.cpu_count(),
           "load_average": os.getloadavg(), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json(args.json, clean({**run, **figures}))
    print(f"figures in {args.json}")


def call_counts(url: str) -> dict[str, float]:
    """The server's model calls so far (/metrics): calls, tokens, and calls of more than 2048 tokens."""
    import httpx

    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return {"calls": values.get("bertforge_model_calls_total", float("nan")),
            "tokens": values.get("bertforge_batch_tokens_sum", float("nan")),
            "over_2048": values.get("bertforge_batch_tokens_count", float("nan"))
            - values.get('bertforge_batch_tokens_bucket{le="2048.0"}', float("nan"))}


def calls_between(before: dict[str, float], after: dict[str, float]) -> str:
    calls = after["calls"] - before["calls"]
    tokens = after["tokens"] - before["tokens"]
    return (f"{calls:.0f} model calls, {tokens / max(calls, 1):.0f} tokens each on average, "
            f"{after['over_2048'] - before['over_2048']:.0f} of more than 2048 tokens")


def in_limit(args: argparse.Namespace) -> bool:
    """Both phases with the in-limit attacker (see the module docstring); prints both throughputs. Returns
    whether the rule broke: the request of the size found refused with 413, or with 429 while the queue had
    room."""
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or classifier_dir(Path(scratch))
        port = free_port()
        deadline = [] if args.request_timeout_s is None else ["--request-timeout-s", str(args.request_timeout_s)]
        server = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", model, "--port", str(port),
                                   "--precision", "fp32", *deadline], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(port, server)
            texts = load_texts()
            asyncio.run(load(port, "classify", texts, 2, 1.0))  # warm-up
            probe = subprocess.run([sys.executable, "-c", IN_LIMIT_ATTACKER, url, "0", "probe"], capture_output=True,
                                   text=True, timeout=600, check=True)
            found = json.loads(probe.stdout)
            count = found["texts"]
            counts = [call_counts(url)]
            alone, errors = asyncio.run(load(port, "classify", texts, args.clients, args.seconds))
            counts.append(call_counts(url))
            attacker = subprocess.Popen([sys.executable, "-c", IN_LIMIT_ATTACKER, url, str(args.seconds), "send",
                                         str(count), str(found["chars"])], stdout=subprocess.PIPE, text=True)
            time.sleep(1.0)  # its first request is in the server before the clients start
            counts.append(call_counts(url))
            attacked, attacked_errors = asyncio.run(load(port, "classify", texts, args.clients, args.seconds))
            counts.append(call_counts(url))
            report = json.loads(attacker.communicate(timeout=900)[0])
            # Alone again once the large client has stopped: the machine's load drifts over minutes (other
            # jobs), so the attacked phase is compared with the mean of the phases before and after it.
            again, again_errors = asyncio.run(load(port, "classify", texts, args.clients, args.seconds))
            errors += again_errors
        finally:
            server.terminate()
            server.wait(timeout=120)
    before, under, after = (len(phase) / args.seconds for phase in (alone, attacked, again))
    base = (before + after) / 2
    print(f"{args.clients} clients, {args.seconds:g} s per phase, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}: {base:.1f} requests/s alone ({before:.1f} before, {after:.1f} after), "
          f"{under:.1f} requests/s while one client sent "
          f"{report['texts']} texts of {report['chars']} characters per request (found by {found['statuses']}; "
          f"alone: status {found['alone']['status']} in {found['alone']['seconds']} s), "
          f"{len(report['statuses'])} times (statuses {dict(Counter(report['statuses']))}, seconds each "
          f"{report['seconds'][:20]}): {under / base:.2f} of their throughput kept; errors {errors + attacked_errors}")
    print(f"model calls: alone {calls_between(counts[0], counts[1])}; with the large client "
          f"{calls_between(counts[2], counts[3])}")
    statuses = Counter(report["statuses"])
    broken = statuses[413] + statuses[429]
    print(f"the large client's request of the size found (within every static limit): {statuses[200]} answered, "
          f"{statuses[413]} refused with 413, {statuses[429]} with 429 "
          f"({'the rule held' if not broken else 'THE RULE BROKE: admission must not depend on the load'})")
    first = found["alone"]
    heavy_alone = first["texts"] * first["chars"] / first["seconds"] if first["status"] == 200 else float("nan")
    heavy_under = report["answered_chars"] / report["elapsed"]
    print(f"the large client: {heavy_alone:.0f} characters/s answered alone (its first admitted request, idle "
          f"server), {heavy_under:.0f} characters/s under the clients' load ({report['answered_chars']} characters "
          f"answered in {report['elapsed']:.1f} s)")

    def phase_calls(first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
        calls = last["calls"] - first["calls"]
        return {"calls": calls, "tokens_per_call": (last["tokens"] - first["tokens"]) / max(calls, 1),
                "over_2048_tokens": last["over_2048"] - first["over_2048"]}

    write_figures(args, {
        "requests_per_s": {"alone_before": before, "attacked": under, "alone_after": after, "alone_mean": base},
        "kept": under / base, "errors": errors + attacked_errors,
        "model_calls": {"alone": phase_calls(counts[0], counts[1]), "attacked": phase_calls(counts[2], counts[3])},
        "large_client": {"texts": report["texts"], "chars_per_text": report["chars"], "found_by": found["statuses"],
                         "alone": found["alone"], "requests": len(report["statuses"]),
                         "statuses": dict(Counter(report["statuses"])), "seconds_each": report["seconds"],
                         "answered_chars": report["answered_chars"], "elapsed_s": report["elapsed"],
                         "chars_per_s_alone": heavy_alone, "chars_per_s_attacked": heavy_under},
        "in_limit_refused": {"413": statuses[413], "429": statuses[429]}})
    return bool(broken)


if __name__ == "__main__":
    sys.exit(main())
