"""`bertforge retrieval-set` (a BEIR-layout retrieval set from SQuAD-format QA files) and `bertforge
evaluate-embeddings` (STS, retrieval and paraphrase figures of an embedding model; a ColBERT model's retrieval by
exact MaxSim), and `bertforge evaluate` on a retrieval-set folder (`evaluate_retrieval_folder`): their flags and
what they run."""

from __future__ import annotations

import argparse
from typing import Any

from bertforge.cli.flags import add_engine_flags

MULTI_VECTOR = "embed-multi-vector"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare this module's subcommands on the `bertforge` parser."""
    add_retrieval_set(sub)
    add_evaluate_embeddings(sub)


def add_retrieval_set(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("retrieval-set", help="a BEIR-layout retrieval set (and training pairs) from SQuAD-format "
                       "QA files: SQuAD, CMRC 2018, DRCD")
    p.add_argument("--squad", nargs="+", required=True, metavar="FILE", help="SQuAD-format JSON files")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for corpus.jsonl, queries.jsonl, qrels/")
    p.add_argument("--eval-fraction", type=float, help="hold out this share of the questions, by article, as the "
                   "evaluation queries; the rest become training pairs (default: every question is a query)")
    p.add_argument("--seed", type=int, default=0, help="which articles are held out (default 0)")
    p.add_argument("--train-pairs", metavar="FILE", help="write the training pairs here as a TSV "
                   "(anchor<TAB>positive); needs --eval-fraction")
    p.add_argument("--eval-corpus", choices=["all", "eval"], default="all",
                   help="all: every paragraph is a document (default); eval: the held-out articles' paragraphs only")
    p.add_argument("--split", default="test", help="name of the qrels split: qrels/SPLIT.tsv (default test)")
    p.set_defaults(func=cmd_retrieval_set)


def add_evaluate_embeddings(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate-embeddings", help="STS, retrieval or paraphrase figures of a model's sentence "
                       "embeddings (the figures sentence-transformers' evaluators report)")
    p.add_argument("--model", required=True, metavar="DIR", help="a model directory (any bertforge or Hugging Face "
                   "BERT; a sentence-transformers directory's pooling is used)")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--retrieval", metavar="BEIR_DIR", help="a BEIR folder (e.g. from `bertforge retrieval-set`)")
    data.add_argument("--sts", metavar="FILE", help="sentence pairs with similarity scores (TSV/CSV/JSONL; GLUE's "
                      "STS-B dev.tsv as shipped)")
    data.add_argument("--paraphrase", metavar="FILE", help="sentence pairs with 0/1 labels (TSV/CSV/JSONL; MRPC, QQP, "
                      "RTE, LCQMC)")
    p.add_argument("--split", default="test", help="retrieval: the qrels split, qrels/SPLIT.tsv (default test)")
    p.add_argument("--no-title", action="store_true", help="retrieval: embed documents without their titles")
    p.add_argument("--rerank-model", metavar="DIR", help="retrieval: a cross-encoder directory (the rerank task) "
                   "that re-scores each query's first documents; adds rerank_<figure> figures")
    p.add_argument("--rerank-depth", type=int, default=100, help="retrieval: documents per query the "
                   "--rerank-model re-scores (default 100)")
    p.add_argument("--sparse", action="store_true", help="retrieval: score --model's sparse (SPLADE) vectors, "
                   "adding query_terms / document_terms (automatic for a SparseEncoder directory; this flag for a "
                   "plain BERT masked-LM one)")
    p.add_argument("--max-terms", type=int, help="--sparse: keep each text's largest N weights (default: all)")
    p.add_argument("--hybrid-model", metavar="DIR", help="retrieval: a model of the other kind (sparse for a dense "
                   "--model, dense for a sparse one); reports dense_, sparse_ and hybrid_ figures, the hybrid "
                   "list fusing both by reciprocal rank fusion")
    p.add_argument("--rrf-k", type=float, default=60, help="--hybrid-model: the fusion constant (default 60)")
    p.add_argument("--fusion-depth", type=int, default=100, help="--hybrid-model: documents of each list fused "
                   "per query (default 100)")
    p.add_argument("--text-a", help="STS/paraphrase: the first sentence's column (default: found by header name)")
    p.add_argument("--text-b", help="STS/paraphrase: the second sentence's column")
    p.add_argument("--label", help="STS/paraphrase: the score or label column")
    p.add_argument("--out", metavar="FILE", help="write the figures here as JSON")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, help="tokens per text (default: the model directory's "
                   "sentence-transformers max_seq_length, else the model's window)")
    add_engine_flags(p)
    p.set_defaults(func=cmd_evaluate_embeddings)


# --- retrieval-set ---------------------------------------------------------------------------------------

def cmd_retrieval_set(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.finetuning import DataReport
    from bertforge.data.retrieval import build_from_squad, write_beir, write_train_pairs
    from bertforge.errors import ConfigError

    if args.train_pairs and args.eval_fraction is None:
        raise ConfigError("--train-pairs needs --eval-fraction (without it every question is an evaluation query)")
    report = DataReport()
    eval_set, pairs = build_from_squad(args.squad, eval_fraction=args.eval_fraction, seed=args.seed,
                                       eval_corpus=args.eval_corpus, split=args.split, report=report)
    write_beir(eval_set, args.out)
    print(f"retrieval set written to {args.out}: {eval_set.summary()}")
    for line in report.lines():
        print(f"  {line}")
    if args.train_pairs:
        write_train_pairs(args.train_pairs, pairs)
        print(f"{len(pairs)} training pairs (question, paragraph) written to {args.train_pairs}")
    elif pairs:
        print(f"{len(pairs)} training pairs not written (pass --train-pairs FILE to keep them)")


# --- evaluate-embeddings ---------------------------------------------------------------------------------

def _read_data(args: argparse.Namespace) -> tuple[str, str, Any]:
    """(kind, path, data) of the one data flag given; read before the model loads, so a bad file fails fast."""
    from bertforge.data.retrieval import read_beir, read_sentence_pairs

    if args.retrieval:
        return "retrieval", args.retrieval, read_beir(args.retrieval, args.split)
    kind, path = ("sts", args.sts) if args.sts else ("paraphrase", args.paraphrase)
    pairs = read_sentence_pairs(path, binary=kind == "paraphrase", text_a=args.text_a, text_b=args.text_b,
                                label=args.label)
    return kind, path, pairs


def is_colbert_directory(model: str) -> bool:
    """Whether --model is a ColBERT directory (PyLate, MultiVectorEncoder or Stanford layout)."""
    from bertforge.interop.colbert import is_colbert_directory as colbert

    return colbert(model)


def late_interaction_figures(pipeline, data, with_title: bool = True) -> dict[str, float]:
    """Retrieval figures of a loaded ColBERT (`embed-multi-vector`) pipeline: exact MaxSim over the corpus,
    queries with the query role, documents with the document role."""
    from bertforge.evaluation.late_interaction import (
        evaluate_late_interaction_retrieval,
        pipeline_token_encoder,
    )

    return evaluate_late_interaction_retrieval(pipeline_token_encoder(pipeline, "query"), data,
                                               encode_documents=pipeline_token_encoder(pipeline, "document"),
                                               with_title=with_title)


def evaluate_retrieval_folder(args: argparse.Namespace, extra: list[str]) -> None:
    """`bertforge evaluate --data BEIR_DIR`: the retrieval figures (nDCG@10, MRR@10, recall@k, ...) of --model
    on a retrieval set, by the model's own scoring: a ColBERT model by exact MaxSim over the corpus, a SPLADE
    model by sparse dot product, any other embedding model by cosine; printed, and written to
    OUT/metrics.json (default MODEL/eval-<folder name>)."""
    from dataclasses import replace
    from pathlib import Path

    from bertforge.checkpoint_format import SPARSE_ARCHITECTURES, read_config
    from bertforge.cli.overrides import evaluate_overrides
    from bertforge.data.retrieval import read_beir
    from bertforge.errors import ConfigError
    from bertforge.evaluation.embedding import evaluate_retrieval, evaluate_sparse_retrieval
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.retrieval.sparse_vectors import encode_sparse
    from bertforge.storage import write_json

    given = [flag for flag, used in (("--unlabelled", args.unlabelled), ("--against", args.against),
                                     ("column flags or overrides", evaluate_overrides(args, extra))) if used]
    if given:
        raise ConfigError(f"{args.data} is a retrieval set (a folder): {given[0]} applies to a data file; remove it")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit {args.limit}: give the number of queries to score (at least 1)")
    data = read_beir(args.data, "test")  # a bad folder fails before the model loads
    if args.limit is not None:
        data = replace(data, query_ids=data.query_ids[:args.limit], query_texts=data.query_texts[:args.limit])
    options = {"device": args.device, "precision": args.precision, "engine": args.engine, "threads": args.threads,
               "batch_size": args.batch_size}
    if is_colbert_directory(args.model):
        scoring, pipeline = "maxsim", load_pipeline(args.model, MULTI_VECTOR, **options)
        figures = late_interaction_figures(pipeline, data)
    elif read_config(args.model)[1] in SPARSE_ARCHITECTURES.values():
        scoring, pipeline = "sparse", load_pipeline(args.model, "embed-sparse", **options)
        figures = evaluate_sparse_retrieval(lambda texts: encode_sparse(pipeline, texts), data)
    else:
        scoring, pipeline = "cosine", load_pipeline(args.model, "embed", **options)
        figures = evaluate_retrieval(lambda texts: pipeline.encode(texts), data)
    counts = {"documents": len(data.corpus_ids), "queries": len(data.evaluated_queries())}
    print(f"retrieval on {args.data} ({counts['documents']} documents, {counts['queries']} queries), model "
          f"{args.model} ({scoring}):")
    for name, value in figures.items():
        print(f"  {name}: {value:.4f}")
    target = Path(args.out) if args.out else Path(args.model) / f"eval-{Path(args.data).name}"
    write_json(target / "metrics.json", {"model": str(args.model), "data": str(args.data), "task": "retrieval",
                                         "scoring": scoring, **counts, "metrics": figures,
                                         "precision": args.precision})
    print(f"figures written to {target / 'metrics.json'}")


def cmd_evaluate_embeddings(args: argparse.Namespace, extra: list[str]) -> None:
    from functools import partial

    from bertforge.errors import ConfigError
    from bertforge.evaluation.embedding import evaluate_paraphrase, evaluate_retrieval, evaluate_sts
    from bertforge.inference.pipelines import load_pipeline, rerank_scores
    from bertforge.storage import write_json

    _check_retrieval_flags(args)
    kind, path, data = _read_data(args)
    sparse = _sparse_model(args)
    options = {"device": args.device, "precision": args.precision, "engine": args.engine, "threads": args.threads,
               "batch_size": args.batch_size}
    task = "embed-sparse" if sparse else MULTI_VECTOR if kind == "retrieval" and is_colbert_directory(
        args.model) and not args.hybrid_model else "embed"
    pipeline = load_pipeline(args.model, task, max_length=args.max_length, **options)

    def encode(texts: list[str]):
        return pipeline.encode(texts)

    if kind == "retrieval" and is_colbert_directory(args.model) and not (args.sparse or args.hybrid_model):
        if args.rerank_model:
            raise ConfigError(f"{args.model} is a ColBERT model, scored by exact MaxSim over the corpus; remove "
                              "--rerank-model")
        counts = {"documents": len(data.corpus_ids), "queries": len(data.evaluated_queries())}
        figures = late_interaction_figures(pipeline, data, with_title=not args.no_title)
    elif kind == "retrieval" and (sparse or args.hybrid_model):
        counts = {"documents": len(data.corpus_ids), "queries": len(data.evaluated_queries())}
        figures = _sparse_figures(args, pipeline, sparse, data, options)
    elif kind == "retrieval":
        counts = {"documents": len(data.corpus_ids), "queries": len(data.evaluated_queries())}
        rerank = None
        if args.rerank_model:
            reranker = load_pipeline(args.rerank_model, "rerank", **options)
            rerank = partial(rerank_scores, reranker)
        figures = evaluate_retrieval(encode, data, with_title=not args.no_title, rerank=rerank,
                                     rerank_depth=args.rerank_depth)
    else:
        counts = {"pairs": len(data.labels)}
        evaluate = evaluate_sts if kind == "sts" else evaluate_paraphrase
        figures = evaluate(encode, data.sentences_a, data.sentences_b, data.labels)
    print(f"{kind} on {path} ({', '.join(f'{n} {name}' for name, n in counts.items())}), model {args.model}:")
    for name, value in figures.items():
        print(f"  {name}: {value:.4f}")
    if args.out:
        write_json(args.out, {"task": kind, "data": str(path), "model": str(args.model), **counts,
                              "max_length": pipeline.max_length, "metrics": figures})
        print(f"figures written to {args.out}")


def _check_retrieval_flags(args: argparse.Namespace) -> None:
    """ConfigError for a retrieval flag that does not apply (checked before the data and model are read)."""
    from bertforge.errors import ConfigError

    if not args.retrieval:
        given = [flag for flag, used in (("--rerank-model", args.rerank_model), ("--sparse", args.sparse),
                                         ("--hybrid-model", args.hybrid_model)) if used]
        if given:
            raise ConfigError(f"{given[0]} evaluates retrieval; use it with --retrieval")
    if args.rerank_model and (args.sparse or args.hybrid_model):
        raise ConfigError("--rerank-model re-ranks dense retrieval; remove it for sparse or hybrid figures")


def _sparse_model(args: argparse.Namespace) -> bool:
    """Whether --model's sparse vectors are evaluated: --sparse, or a SparseEncoder directory."""
    from bertforge.checkpoint_format import SPARSE_ARCHITECTURES, read_config
    from bertforge.errors import ConfigError

    sparse = args.sparse or (args.retrieval is not None
                             and read_config(args.model)[1] in SPARSE_ARCHITECTURES.values())
    if args.rerank_model and sparse:
        raise ConfigError(f"{args.model} is a sparse model; --rerank-model re-ranks dense retrieval: remove it")
    if args.max_terms is not None and not (sparse or args.hybrid_model):
        raise ConfigError("--max-terms prunes sparse vectors; add --sparse or --hybrid-model, or remove it")
    return sparse


def _sparse_figures(args: argparse.Namespace, pipeline, sparse: bool, data, options: dict[str, Any]
                    ) -> dict[str, float]:
    """Sparse retrieval figures of --model, or with --hybrid-model those of both models and their fusion."""
    from bertforge.evaluation.embedding import evaluate_hybrid_retrieval, evaluate_sparse_retrieval
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.retrieval.sparse_vectors import encode_sparse

    pruning = {} if args.max_terms is None else {"max_terms": args.max_terms}
    other = None
    if args.hybrid_model:
        other = load_pipeline(args.hybrid_model, "embed" if sparse else "embed-sparse", max_length=args.max_length,
                              **options)
    dense, splade = (other, pipeline) if sparse else (pipeline, other)

    def encode_terms(texts: list[str]):
        return encode_sparse(splade, texts, **pruning)

    if dense is None:
        return evaluate_sparse_retrieval(encode_terms, data, with_title=not args.no_title)
    return evaluate_hybrid_retrieval(lambda texts: dense.encode(texts), encode_terms, data, rrf_k=args.rrf_k,
                                     fusion_depth=args.fusion_depth, with_title=not args.no_title)
