"""The `bertforge` command line: one subcommand per workflow, each a thin layer over a Python function.

Every subcommand prints a user mistake (`BertforgeError`) as one line and exits with status 2; a traceback
means a bug in bertforge. Commands that train take an optional TOML run file plus `--section.key=value`
overrides (unknown keys are rejected with the list of valid ones).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys

from bertforge.errors import BertforgeError, ConfigError

OVERRIDE = re.compile(r"^--([A-Za-z_][\w]*(\.[A-Za-z_]\w*)+)=(.*)$", re.S)


def split_overrides(extra: list[str]) -> list[str]:
    """`--a.b=v` arguments argparse did not know, as `a.b=v` overrides; anything else is an error."""
    overrides = []
    for arg in extra:
        match = OVERRIDE.match(arg)
        if not match:
            raise ConfigError(f"unrecognised argument {arg!r}; settings from a run file are overridden as "
                              "--section.key=value (e.g. --training.lr=5e-5)")
        overrides.append(f"{match.group(1)}={match.group(3)}")
    return overrides


# --- vocab -----------------------------------------------------------------------------------------------

def cmd_vocab(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.corpus import iter_lines, resolve_inputs
    from bertforge.tokenization.tokenizer import Tokenizer, TokenizerConfig
    from bertforge.tokenization.vocab_builder import build_vocab, unk_rate

    files = resolve_inputs(args.corpus)
    heldout: list[str] = []
    every = max(1, round(1 / args.heldout_fraction)) if args.heldout_fraction > 0 else 0

    def training_lines():
        # Every k-th non-empty line is held out (bounded) to report the [UNK] rate on unseen text.
        count = 0
        for path in files:
            for line in iter_lines(path):
                if not line.strip():
                    continue
                count += 1
                if every and count % every == 0:
                    if len(heldout) < 50_000:
                        heldout.append(line)
                    continue
                yield line

    lower = not args.cased
    vocab = build_vocab(training_lines(), args.vocab_size, do_lower_case=lower, lang=args.lang,
                        min_frequency=args.min_frequency, num_unused=args.unused)
    tokenizer = Tokenizer(vocab, TokenizerConfig(do_lower_case=lower))
    tokenizer.save_pretrained(args.out)
    rate = unk_rate(tokenizer, heldout)
    print(f"vocabulary of {len(vocab)} tokens written to {args.out} (do_lower_case={lower})")
    print(f"[UNK] rate on {len(heldout)} held-out lines: {100 * rate:.3f}%")


# --- prepare ---------------------------------------------------------------------------------------------

def cmd_prepare(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.pretraining import jieba_segmenter
    from bertforge.data.shards import prepare_corpus
    from bertforge.tokenization.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(args.tokenizer)
    report = prepare_corpus(
        args.corpus, tokenizer, args.out, max_seq_length=args.max_seq_length, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, seed=args.seed, workers=args.workers,
        heldout_fraction=args.heldout_fraction, heldout_documents=args.heldout_documents,
        resume=not args.no_resume, format=args.format,
        segmenter=jieba_segmenter() if args.segmenter == "jieba" else None)
    # The data directory carries its vocabulary, so `pretrain --data DIR` needs nothing else.
    tokenizer.save_pretrained(args.out)
    print(report.summary())


# --- pretrain --------------------------------------------------------------------------------------------

PRETRAIN_FLAGS = {
    "data": "data_dir", "tokenizer": "tokenizer", "model": "model", "out": "training.out_dir",
    "steps": "training.steps", "batch_size": "training.batch_size", "lr": "training.lr",
    "precision": "training.precision", "resume": "training.resume", "seed": "training.seed",
    "device": "training.device", "optimizer": "training.optimizer",
    "whole_word_masking": "masking.whole_word_masking", "grad_accumulation": "training.grad_accumulation",
}


def flag_overrides(args: argparse.Namespace, table: dict[str, str]) -> list[str]:
    """Turn the convenience flags that were given into `dotted.key=value` overrides (TOML literals)."""
    overrides = []
    for flag, key in table.items():
        value = getattr(args, flag, None)
        if value is None or value is False:
            continue
        literal = json.dumps(value) if isinstance(value, (str, bool)) else repr(value)
        overrides.append(f"{key}={literal.lower() if isinstance(value, bool) else literal}")
    return overrides


def cmd_pretrain(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.configuration import load_config
    from bertforge.training.pretraining import PretrainConfig, run_pretraining

    overrides = flag_overrides(args, PRETRAIN_FLAGS) + split_overrides(extra)
    config = load_config(PretrainConfig, args.run_file, overrides)
    result = run_pretraining(config)
    print(result.summary() if hasattr(result, "summary") else result)


# --- demo ----------------------------------------------------------------------------------------------

def cmd_demo(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.demo import run_demo

    run_demo(lang=args.lang, out=args.out, corpus=args.corpus, minutes=args.minutes, model=args.model,
             seed=args.seed)


# --- info ------------------------------------------------------------------------------------------------

def cmd_info(args: argparse.Namespace, extra: list[str]) -> None:
    import torch

    from bertforge.model.bert import BertModel
    from bertforge.model.config import PRESETS, BertConfig

    if args.model in PRESETS:
        config = BertConfig.preset(args.model)
        architecture = "BertModel"
    else:
        from bertforge.artifacts import read_config

        config, architecture = read_config(args.model)
    with torch.device("meta"):
        params = sum(p.numel() for p in BertModel(config).parameters())
    print(config.to_json_string().rstrip())
    print(f"architecture: {architecture or 'BertModel'}; encoder parameters (with pooler): {params:,}")


# --- parser ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertforge", description="BERT end to end: vocab, prepare, pretrain, "
                                     "finetune, evaluate, predict, serve.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("vocab", help="learn a WordPiece vocabulary from a corpus")
    p.add_argument("--corpus", nargs="+", required=True, help="files, folders or glob patterns of UTF-8 text")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", required=True, help="directory for vocab.txt + tokenizer_config.json")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case)")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--unused", type=int, default=0, help="number of [unusedN] slots to reserve")
    p.add_argument("--heldout-fraction", type=float, default=0.01, help="lines held out for the [UNK] report")
    p.set_defaults(func=cmd_vocab)

    p = sub.add_parser("prepare", help="turn a corpus into pretraining instance shards")
    p.add_argument("--corpus", nargs="+", required=True)
    p.add_argument("--tokenizer", required=True, help="directory with vocab.txt (e.g. from `bertforge vocab`)")
    p.add_argument("--out", required=True)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--heldout-fraction", type=float, default=0.0)
    p.add_argument("--heldout-documents", type=int, default=None)
    p.add_argument("--format", choices=["auto", "sentences", "text", "documents"], default="auto")
    p.add_argument("--segmenter", choices=["none", "jieba"], default="none",
                   help="word segmenter for Chinese whole-word masking")
    p.add_argument("--no-resume", action="store_true", help="rewrite shards even if complete")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("pretrain", help="pretrain with masked LM + next-sentence prediction")
    p.add_argument("run_file", nargs="?", help="optional TOML run file")
    p.add_argument("--data", help="directory from `bertforge prepare`")
    p.add_argument("--tokenizer", help="vocabulary directory (default: the one recorded with the data)")
    p.add_argument("--model", help="preset (tiny, mini, small, medium, base, large) or a checkpoint directory")
    p.add_argument("--out")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--grad-accumulation", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--optimizer", choices=["adamw", "lamb"])
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--device")
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", help="auto, never, or a checkpoint directory")
    p.add_argument("--whole-word-masking", action="store_true")
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("demo", help="vocab -> shards -> pretrain -> fill-mask -> fine-tune, on the bundled books")
    p.add_argument("--lang", choices=["en", "zh"], default="en")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--corpus", help="folder of books (default: data/demo/<lang>)")
    p.add_argument("--minutes", type=float, default=4.0, help="pretraining time budget")
    p.add_argument("--model", default="mini", help="preset to pretrain")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("info", help="print a model's config and parameter count")
    p.add_argument("model", help="preset name or model directory")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    try:
        if extra and args.command not in ("pretrain", "finetune"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.func(args, extra)
    except BertforgeError as exc:
        print(f"bertforge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
