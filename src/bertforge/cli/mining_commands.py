"""`bertforge mine-negatives` (hard negatives for (anchor, positive) training pairs, by an embedding model) and
`bertforge score-margins` (a cross-encoder's margin for each triplet, for MarginMSE distillation, or its score
of each candidate, for KL distillation of an embedding or, as lists, a ColBERT model): their flags
and what they run. The work is `retrieval.negative_mining`; the files are `data.embedding`'s tables."""

from __future__ import annotations

import argparse
import sys

from bertforge.cli.corpus_commands import FORMAT_CHOICES
from bertforge.cli.flags import add_engine_flags


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare this module's subcommands on the `bertforge` parser."""
    add_mine_negatives(sub)
    add_score_margins(sub)


def add_mine_negatives(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mine-negatives", help="hard negatives for (anchor, positive) training pairs: each anchor's "
                       "nearest texts by an embedding model, minus its positives and near-positives",
                       description="Embeds the pairs' positives (the corpus) and anchors, takes each anchor's "
                       "nearest texts ranked --range-min to --range-max once its own positives are removed, drops "
                       "those scored too close to the positive (possible false negatives: --relative-margin, "
                       "--margin) and writes anchor, positive, negative rows (one per negative), the file "
                       "`finetune --format embedding-triplets` reads. With --corpus the candidates are that corpus's "
                       "texts too (embedded by the `bertforge embed` job into --corpus-vectors, ranked by exact "
                       "search), a text equal to the anchor or to one of its positives (whitespace aside) is never "
                       "its negative, the pairs are mined in shards a rerun resumes, and under torchrun each "
                       "process mines every N-th shard (the output is the same as one process's).")
    p.add_argument("--model", required=True, metavar="DIR", help="the embedding model that ranks (usually the "
                   "model you will train)")
    p.add_argument("--train", required=True, metavar="FILE", help="(anchor, positive) pairs: TSV/CSV/JSONL with a "
                   "header (e.g. from `bertforge retrieval-set --train-pairs`)")
    p.add_argument("--out", required=True, metavar="FILE", help="the triplets (.tsv, .csv or .jsonl: by its name)")
    corpus = p.add_argument_group("mining from a corpus (resumable, runs under torchrun)")
    corpus.add_argument("--corpus", metavar="FILE_OR_DIR", help="mine from these texts (a text/TSV/CSV/JSONL file "
                        "or a folder of them, read as `bertforge embed --input` reads it) besides the pairs' "
                        "positives; embedded once into --corpus-vectors, pairs mined in shards written to "
                        "OUT.parts/, so a rerun resumes")
    corpus.add_argument("--corpus-vectors", metavar="DIR", help="--corpus: the corpus's embedding folder (default "
                        "OUT.corpus-vectors; kept, reused by the next mining of the same model and corpus, an "
                        "unfinished one is finished)")
    corpus.add_argument("--positives", action=argparse.BooleanOptionalAction, default=True, help="--corpus: the "
                        "pairs' positives compete too, as without --corpus (default; never as their own anchor's "
                        "negative); --no-positives: only corpus texts")
    corpus.add_argument("--shard-size", type=int, help="--corpus: pairs per shard, the unit of resuming and of "
                        "sharing among torchrun processes (default 1000)")
    corpus.add_argument("--format", choices=FORMAT_CHOICES, default="auto",
                        help="--corpus's format (default auto: by file name; .txt and others: one text per line)")
    corpus.add_argument("--text-column", "--text-field", dest="text_column", default="text",
                        help="--corpus: TSV/CSV header name (or 0-based index) or JSONL field of the text (default "
                        "text)")
    corpus.add_argument("--id-column", "--id-field", dest="id_column",
                        help="--corpus: column or field of each record's id (default: 'id' where present, else the "
                        "line)")
    p.add_argument("--text-a", default="anchor", help="the anchor column (default anchor)")
    p.add_argument("--text-b", default="positive", help="the positive column (default positive)")
    p.add_argument("--on-invalid", choices=["error", "skip"], default="error", help="a malformed row: stop naming "
                   "its file and line (default), or skip it, counted")
    p.add_argument("--num-negatives", type=int, default=1, help="negatives per pair, one row each (default 1)")
    p.add_argument("--range-min", type=int, default=0, help="skip the anchor's nearest N candidates (default 0)")
    p.add_argument("--range-max", type=int, default=50, help="consider candidates ranked below N (default 50)")
    p.add_argument("--relative-margin", type=float, default=0.05, help="keep a candidate only if its cosine is at "
                   "most (1 - this) x the positive's (default 0.05; 0 turns it off)")
    p.add_argument("--margin", type=float, help="keep a candidate only if its cosine is at most the positive's "
                   "minus this (default: no absolute margin)")
    p.add_argument("--output-format", choices=["triplet", "labeled-pair", "labeled-list"], default="triplet",
                   help="triplet: anchor, positive, negative rows (default; `finetune --format embedding-triplets`); "
                   "labeled-pair: anchor, text, label rows, the positive labelled 1 and each negative 0 (a "
                   "cross-encoder's training file: `finetune --format pair --text-a anchor --text-b text`); "
                   "labeled-list: one JSON line per pair, its query, docs (the positive, then its negatives) and "
                   "labels (1, then 0s) (listwise cross-encoder training: `finetune --format rerank-lists`; the "
                   "file must be .jsonl)")
    p.add_argument("--sampling", choices=["top", "random"], default="top", help="top: the best-ranked candidates "
                   "left (default); random: drawn from all that are left")
    p.add_argument("--seed", type=int, default=0, help="--sampling random's seed (default 0)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, help="tokens per text (default: the model's)")
    add_engine_flags(p)
    p.set_defaults(func=cmd_mine_negatives)


def add_score_margins(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score-margins", help="a cross-encoder's margin (positive minus negative relevance) for each "
                       "(anchor, positive, negative) triplet, or its score of each text: MarginMSE or KL "
                       "distillation data",
                       description="Scores both texts of every triplet against its anchor with a cross-encoder "
                       "(the rerank task) and writes anchor, positive, negative, margin rows, the file `finetune "
                       "--format embedding-margins` trains on (loss margin_mse); with --output-format scores, "
                       "anchor, positive, negative, positive_score, negative_score rows, the file `finetune "
                       "--format embedding-scores` trains on (loss kl); with --output-format lists, each pair's "
                       "positive and negatives with a score each, one JSON line per pair, the file `finetune "
                       "--format colbert-distill` trains on (PyLate's distillation loss).")
    p.add_argument("--model", required=True, metavar="DIR", help="the cross-encoder directory (a pair classifier "
                   "with one output or two labels, e.g. trained by `bertforge finetune --format pair`)")
    p.add_argument("--triplets", required=True, metavar="FILE", help="anchor, positive, negative rows (e.g. from "
                   "`bertforge mine-negatives`)")
    p.add_argument("--out", required=True, metavar="FILE", help="the scored triplets (.tsv, .csv or .jsonl)")
    p.add_argument("--on-invalid", choices=["error", "skip"], default="error", help="a malformed row: stop naming "
                   "its file and line (default), or skip it, counted")
    p.add_argument("--output-format", choices=["margin", "scores", "lists"], default="margin", help="margin: one "
                   "margin column (default; MarginMSE); scores: the teacher's score of the positive and of the "
                   "negative (KL distillation of an embedding model); lists: one JSON line per (anchor, positive) "
                   "pair, {\"query\", \"documents\": [positive, its negatives...], \"scores\": [...]} (the "
                   "rows of a pair mined with --num-negatives N grouped; KL distillation of a ColBERT model: "
                   "`finetune --format colbert-distill`; the file must be .jsonl)")
    p.add_argument("--margin-of", choices=["score", "logit"], help="what is compared: score, relevance in [0, 1], "
                   "so margins lie in [-1, 1] like the cosine margins the student learns (the default of "
                   "margin); logit, the raw output (the default of scores: a softmax over logits keeps the "
                   "teacher's confidence)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, help="tokens per (anchor, text) input (default: the model's)")
    add_engine_flags(p)
    p.set_defaults(func=cmd_score_margins)


def _engine_options(args: argparse.Namespace) -> dict:
    return {"device": args.device, "precision": args.precision, "engine": args.engine, "threads": args.threads,
            "batch_size": args.batch_size, "max_length": args.max_length}


def cmd_mine_negatives(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.embedding import read_text_groups, write_text_groups
    from bertforge.errors import ConfigError
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.retrieval.negative_mining import MiningReport, MiningSettings, mine_negatives, output_rows

    if args.output_format == "labeled-list" and not str(args.out).endswith(".jsonl"):
        raise ConfigError(f"--out {args.out}: --output-format labeled-list writes JSON Lines; name the file .jsonl")
    settings = MiningSettings(num_negatives=args.num_negatives, range_min=args.range_min, range_max=args.range_max,
                              margin=args.margin, relative_margin=args.relative_margin or None,
                              sampling=args.sampling, seed=args.seed)
    groups = read_text_groups(args.train, texts=[args.text_a, args.text_b], on_invalid=args.on_invalid)  # a bad row fails before loading
    pairs = [(g.texts[0], g.texts[1]) for g in groups]
    corpus_only = [flag for flag, given in (("--corpus-vectors", args.corpus_vectors is not None),
                                            ("--no-positives", not args.positives),
                                            ("--shard-size", args.shard_size is not None),
                                            ("--format", args.format != "auto"),
                                            ("--text-column", args.text_column != "text"),
                                            ("--id-column", args.id_column is not None)) if given]
    if args.corpus is None and corpus_only:
        raise ConfigError(f"{corpus_only[0]} applies to mining from a corpus; add --corpus FILE_OR_DIR or remove it")
    if args.corpus is not None:
        from bertforge.processes import Ranks
        from bertforge.retrieval.embed_corpus import CorpusSettings
        from bertforge.retrieval.mine_corpus import DEFAULT_SHARD_SIZE, mine_corpus

        report = mine_corpus(args.model, args.train, pairs, args.corpus, args.out, settings=settings,
                             pairs_columns=(args.text_a, args.text_b),
                             corpus_settings=CorpusSettings(file_format=args.format, text_column=args.text_column,
                                                            id_column=args.id_column),
                             corpus_vectors=args.corpus_vectors, include_positives=args.positives,
                             output_format=args.output_format, shard_size=args.shard_size or DEFAULT_SHARD_SIZE,
                             **_engine_options(args))
        if Ranks.from_env().rank != 0:  # rank 0 reports for every process
            return
    else:
        pipeline = load_pipeline(args.model, "embed", **_engine_options(args))
        report = MiningReport()
        mined = mine_negatives(pairs, lambda texts: pipeline.encode(texts), settings, report=report)
        if not mined:
            raise ConfigError(f"no pair of {args.train} found a negative ({report.removed_by_margin} candidates were "
                              "scored too close to their positive): lower --relative-margin (a model not trained for "
                              "sentence vectors gives every pair a cosine near 1) or --margin, or widen --range-max")
        write_text_groups(args.out, *output_rows(mined, args.output_format))
    use = {"triplet": "train with --format embedding-triplets",
           "labeled-pair": "train a cross-encoder with --format pair --text-a anchor --text-b text",
           "labeled-list": "train a cross-encoder on the lists with --format rerank-lists"}[args.output_format]
    for line in report.lines():
        print(line, file=sys.stderr)
    print(f"{args.output_format} rows written to {args.out} ({use})", file=sys.stderr)


def cmd_score_margins(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.embedding import read_text_groups, write_text_groups
    from bertforge.errors import ConfigError
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.retrieval.negative_mining import candidate_lists, teacher_scores

    if args.output_format == "lists" and not str(args.out).endswith(".jsonl"):
        raise ConfigError(f"--out {args.out}: --output-format lists writes JSON Lines; name the file .jsonl")
    groups = read_text_groups(args.triplets, texts=["anchor", "positive", "negative"],
                              on_invalid=args.on_invalid)
    pipeline = load_pipeline(args.model, "rerank", **_engine_options(args))
    kind = args.margin_of or ("score" if args.output_format == "margin" else "logit")
    if args.output_format == "lists":
        lists = candidate_lists(g.texts for g in groups)
        scores = teacher_scores([(anchor, *docs) for anchor, docs in lists], pipeline.run, kind=kind)
        write_text_groups(args.out, ("query", "documents", "scores"),
                          [(anchor, docs, list(s)) for (anchor, docs), s in zip(lists, scores)])
        first = sum(max(range(len(s)), key=s.__getitem__) == 0 for s in scores)
        print(f"{len(lists)} lists ({len(groups)} triplets) scored by {args.model} ({kind}); the positive scored "
              f"highest in {first}; written to {args.out} (train a ColBERT model with --format colbert-distill)",
              file=sys.stderr)
        return
    scores = teacher_scores([g.texts for g in groups], pipeline.run, kind=kind)
    margins = [positive - negative for positive, negative in scores]
    if args.output_format == "scores":
        write_text_groups(args.out, ("anchor", "positive", "negative", "positive_score", "negative_score"),
                          [(*g.texts, *s) for g, s in zip(groups, scores)])
        use = "--format embedding-scores"
    else:
        write_text_groups(args.out, ("anchor", "positive", "negative", "margin"),
                          [(*g.texts, m) for g, m in zip(groups, margins)])
        use = "--format embedding-margins"
    mean = sum(margins) / len(margins)
    wrong = sum(m <= 0 for m in margins)
    print(f"{len(margins)} triplets scored by {args.model} ({kind}): mean margin {mean:.4f}, {wrong} with the negative "
          f"scored at least as high as the positive; written to {args.out} (train with {use})", file=sys.stderr)
