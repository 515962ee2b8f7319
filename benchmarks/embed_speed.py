"""Embedding speed on a device: `load_pipeline(dir, "embed").encode` against sentence-transformers' `encode` on
the same random-weight model directory and the same texts, in one run, and how far our vectors are from fp32.

The directory is built here (no download): a vocabulary from the bundled books (data/demo/en), a randomly
initialised BERT of MiniLM size (6 layers, 384 wide) or base size, saved as a plain BERT directory, which
sentence-transformers opens with mean pooling; ours is asked for mean pooling without normalisation, the same.
Texts: book lines (short) or paragraphs of 6 lines, repeated to --texts.

On CUDA ours runs at precision auto (bf16) and sentence-transformers in fp16 (`model.half()`) and fp32; on a
CPU both in fp32 (a dry run). Figures: texts/s of each, their ratios, and the smallest cosine between our
vectors and sentence-transformers' fp32 vectors.

    python -m benchmarks.embed_speed --device cuda --size minilm --kind lines --texts 40000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab

BOOKS = Path(__file__).resolve().parent.parent / "data" / "demo" / "en"
SIZES = {"minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
         "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
         "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}}


def model_dir(work: Path, size: str, vocab_size: int) -> Path:
    """A random-weight BERT directory of `size` with a vocabulary of the bundled books (cached)."""
    folder = work / f"embed-{size}"
    if (folder / "config.json").is_file():
        return folder
    vocab = work / "vocab"
    if not (vocab / "vocab.txt").is_file():
        Tokenizer(build_vocab(sorted(BOOKS.glob("*.txt")), vocab_size), TokenizerConfig()).save_pretrained(vocab)
    tokenizer = Tokenizer.from_pretrained(vocab)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **SIZES[size])
    BertModel(config).save_pretrained(folder, tokenizer=tokenizer)
    return folder


def book_texts(kind: str, count: int) -> list[str]:
    lines = [line.strip() for path in sorted(BOOKS.glob("*.txt"))
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if kind == "paragraphs":
        lines = [" ".join(lines[i:i + 6]) for i in range(0, len(lines) - 5, 6)]
    return [lines[i % len(lines)] for i in range(count)]


def timed(encode, texts: list[str], device: torch.device) -> tuple[float, np.ndarray]:
    encode(texts[:256])  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    vectors = np.asarray(encode(texts), dtype=np.float32)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, vectors


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default="minilm")
    parser.add_argument("--kind", choices=["lines", "paragraphs"], default="lines")
    parser.add_argument("--texts", type=int, default=40000)
    parser.add_argument("--batch-size", type=int, default=1024, help="ours: most rows per model call")
    parser.add_argument("--max-batch-tokens", type=int, default=65536, help="ours: most padded tokens per call")
    parser.add_argument("--reference-batch-size", type=int, default=128, help="sentence-transformers' batch size")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--work", default="runs/embed-speed")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    from bertforge.inference.pipelines import load_pipeline

    device = torch.device(args.device)
    folder = model_dir(Path(args.work), args.size, args.vocab_size)
    texts = book_texts(args.kind, args.texts)
    ours = load_pipeline(folder, "embed", device=str(device), precision="auto", batch_size=args.batch_size,
                         max_batch_tokens=args.max_batch_tokens, max_length=256)

    def encode_ours(items):
        return ours.encode(items, pooling="mean", normalize=False)

    ours_s, ours_vectors = timed(encode_ours, texts, device)
    reference = SentenceTransformer(str(folder), device=str(device))
    reference.max_seq_length = 256

    def encode_reference(items):
        return reference.encode(items, batch_size=args.reference_batch_size, convert_to_numpy=True)

    fp32_s, fp32_vectors = timed(encode_reference, texts, device)
    result = {"size": args.size, "kind": args.kind, "texts": len(texts), "device": str(device),
              "ours_precision": ours.precision, "ours_texts_per_s": len(texts) / ours_s,
              "st_fp32_texts_per_s": len(texts) / fp32_s, "ratio_to_st_fp32": fp32_s / ours_s}
    if device.type == "cuda":
        reference.half()
        fp16_s, _ = timed(encode_reference, texts, device)
        result.update(st_fp16_texts_per_s=len(texts) / fp16_s, ratio_to_st_fp16=fp16_s / ours_s)
    a = ours_vectors / np.linalg.norm(ours_vectors, axis=1, keepdims=True)
    b = fp32_vectors / np.linalg.norm(fp32_vectors, axis=1, keepdims=True)
    result["min_cosine_to_fp32"] = float((a * b).sum(axis=1).min())
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
