"""Pretraining quality on real text in a fixed CPU time budget (issue: mini, 15 minutes, en and zh).

Builds a vocabulary and shards from ../shared/data/pretrain_<lang>, pretrains the `mini` preset for a time
budget (the trainer's `minutes`: the run ends, and its schedule decays, on time), and prints held-out MLM accuracy against the
majority-token baseline and held-out NSP accuracy. Everything lands in --out (curves via `bertforge plot`).

    python -m benchmarks.pretrain_quality --lang en --minutes 15 --out runs/quality-en
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bertforge.configuration import shared_data_root
from bertforge.data.preparation import prepare_corpus
from bertforge.data.text_files import resolve_inputs
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab
from bertforge.training.config import TrainingConfig
from bertforge.training.pretraining import PretrainConfig, run_pretraining

DATA = shared_data_root()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lang", choices=["en", "zh"], default="en")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--model", default="mini")
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--corpus", default=None)
    args = parser.parse_args(argv)
    out = Path(args.out or f"runs/quality-{args.lang}")
    corpus = Path(args.corpus) if args.corpus else DATA / f"pretrain_{args.lang}"
    vocab_size = args.vocab_size or (16000 if args.lang == "en" else 8000)
    started = time.perf_counter()

    vocab = build_vocab(resolve_inputs(corpus), vocab_size, lang=args.lang)
    tokenizer = Tokenizer(vocab, TokenizerConfig(do_lower_case=True))
    report = prepare_corpus(corpus, tokenizer, out / "data", max_seq_length=args.max_seq_length,
                            heldout_documents=40, seed=1)
    tokenizer.save_pretrained(out / "data")
    print(report.summary())
    prep_seconds = time.perf_counter() - started

    # A time budget ends the run (evaluation time comes on top); logs and evaluations keep a fixed cadence.
    training = TrainingConfig(minutes=args.minutes, batch_size=args.batch_size, lr=args.lr, warmup_ratio=0.05,
                              log_every=25, eval_every=500, save_every=0, keep_last=1, seed=1,
                              out_dir=str(out / "pretrain"), precision="fp32", device="cpu", progress=False)
    result = run_pretraining(PretrainConfig(data_dir=str(out / "data"), model=args.model, eval_batches=0,
                                            training=training))
    figures = {
        "lang": args.lang, "model": args.model, "vocab_size": tokenizer.vocab_size, "steps": result.step,
        "batch_size": args.batch_size, "max_seq_length": args.max_seq_length, "train_minutes": result.seconds / 60,
        "prepare_minutes": prep_seconds / 60, "heldout": result.eval,
        "mlm_acc_over_majority": result.eval["mlm_acc"] / result.eval["mlm_majority_acc"],
    }
    (out / "quality.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
