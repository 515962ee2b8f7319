"""`bertforge embed` (a corpus of any size -> vector shards, resumable, under torchrun) and `bertforge
search` (exact top-k over those shards, dense or sparse, or both fused): their flags and what they run.

The work is `retrieval.embed_corpus`, `vector_search`, `sparse_search` and `hybrid_search`, imported when a
command runs so that `bertforge --help` does not load them. Under torchrun every rank runs `embed`; only rank 0 prints.
"""

from __future__ import annotations

import argparse
import json
import sys

from bertforge.cli.flags import add_engine_flags, read_bool

# The choices of the flags, spelled here so that building the parser imports nothing heavy; the tests
# check them against `embed_corpus.DTYPES` / `INPUT_FORMATS`. A pooling name is checked by the family.
DTYPE_CHOICES = ("float32", "float16", "int8", "binary")
FORMAT_CHOICES = ("auto", "text", "tsv", "csv", "jsonl")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare this module's subcommands on the `bertforge` parser."""
    add_embed(sub)
    add_search(sub)


def precision_choices() -> tuple[str, ...]:
    from bertforge.runtime import PRECISIONS

    return PRECISIONS


def add_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="embed a corpus of any size into vector shards (resumable; runs under torchrun)",
                       description="Embed every line (text, TSV, JSONL) or row (CSV) of a file or a folder of files "
                       "into shards of vectors. Rerunning the same command resumes; under torchrun each process "
                       "takes every N-th shard, and the output is the same as one process's.")
    p.add_argument("--model", required=True, help="the model directory")
    p.add_argument("--input", required=True, help="a text/TSV/CSV/JSONL file, or a folder of them (recursive, "
                   "sorted; hidden files skipped)")
    p.add_argument("--out", required=True, help="output folder: vectors-NNNNN.npy, ids-NNNNN.jsonl, manifest.json")
    p.add_argument("--shard-size", type=int, default=10_000, help="texts per shard (default 10000)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32", help="vectors on disk (default float32); "
                   "int8: 4x smaller, calibrated per dimension on the first 1000 texts; binary: sign bits, 32x "
                   "smaller to scan, with int8 codes beside them to rescore the best candidates")
    p.add_argument("--batch-size", type=int, default=32, help="texts per model call (default 32)")
    p.add_argument("--max-length", type=int, help="tokens per text, longer ones cut to it (default: the model's)")
    p.add_argument("--truncate", type=read_bool, nargs="?", const=True, default=True, metavar="true|false",
                   help="a text longer than the model's window is cut to it, and the cut texts are counted (in the "
                   "progress, the summary and the manifest's \"truncated\"), as the server cuts them; false refuses "
                   "the run before any model work, naming the first such text's file and line (default true; "
                   "--chunk keeps whole texts)")
    add_engine_flags(p, device_help="auto, cpu, cuda or cuda:N (under torchrun: cuda:LOCAL_RANK)")
    p.add_argument("--pooling", help="cls, mean, max, ... or several joined by '+' (default: the model's, e.g. "
                   "a sentence-transformers directory's; else mean)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction,
                   help="unit-length vectors, so that search scores are cosines (default: the model's)")
    p.add_argument("--sparse", action="store_true", help="SPLADE vectors of a masked-LM model (a sentence-"
                   "transformers SparseEncoder or any BERT with its MLM head): each text's non-zero vocabulary terms "
                   "and weights, stored as compressed rows; --pooling is then max or sum")
    p.add_argument("--max-terms", type=int, help="--sparse: keep each text's largest N weights (default: all "
                   "non-zero ones)")
    p.add_argument("--multi-vector", action="store_true", help="a ColBERT model's unit vector per token of each text "
                   "(as a document: its marker, cut to the model's document length, punctuation dropped), for exact "
                   "MaxSim search and reranking; --dtype float32 or float16")
    p.add_argument("--chunk", type=int, metavar="TOKENS", help="long texts: cut each text into windows of this "
                   "many tokens, one vector each, with the characters each covers (search returns them as "
                   "\"span\"); default: one window per text, longer ones cut to it and counted")
    p.add_argument("--chunk-overlap", type=int, metavar="TOKENS", help="--chunk: tokens shared by consecutive "
                   "windows (default 0)")
    p.add_argument("--late-chunking", action="store_true", help="--chunk: run each whole text through the model "
                   "once (a window at a time) and average each chunk's own token vectors, so chunks see their "
                   "context (mean pooling)")
    add_prompt_flags(p, "every text")
    p.add_argument("--format", choices=FORMAT_CHOICES, default="auto",
                   help="input format (default auto: by file name; .txt and others: one text per line)")
    p.add_argument("--text-column", "--text-field", dest="text_column", default="text",
                   help="TSV/CSV header name (or 0-based index) or JSONL field of the text (default text)")
    p.add_argument("--id-column", "--id-field", dest="id_column",
                   help="column or field of each record's id (default: 'id' where present, else the line)")
    p.add_argument("--field", action="append", default=[], metavar="NAME[:TYPE]", help="store this JSONL key or "
                   "TSV/CSV column of every record as metadata that `search --filter` filters on (repeat for "
                   "several); TYPE: string (default), int, float, bool, date (2024-05-01) or datetime (ISO 8601); a "
                   "record without it holds none (needs pyarrow: the search extra)")
    p.set_defaults(func=cmd_embed)


def add_search(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="top-k search of query texts over the vectors `bertforge embed` wrote "
                       "(dense, sparse, multi-vector, or several kinds fused; dense: exact, or through the folder's approximate "
                       "index)",
                       description="Prints one JSON line per query: {\"query\": ..., \"hits\": [{\"id\": ..., "
                       "\"score\": ...}]}. The score is the cosine when the corpus was embedded with --normalize, "
                       "else the dot product (sparse folders: the dot product of term weights, through an inverted "
                       "index saved beside the shards; multi-vector folders: the MaxSim). With --hybrid, the reciprocal rank "
                       "fusion score of two or three folders of different kinds and the same input, and each hit's "
                       "rank in each (dense_rank, sparse_rank, multi_vector_rank).")
    p.add_argument("--index", required=True, help="the --out folder of `bertforge embed` (dense, --sparse or "
                   "--multi-vector), or a "
                   "Qdrant collection `bertforge export-index` wrote: qdrant://HOST:PORT/COLLECTION or "
                   "qdrant+path:DIR?collection=NAME (dense and sparse in it: hybrid through Qdrant's fusion; "
                   "?vectors=dense or sparse: one kind)")
    p.add_argument("--hybrid", metavar="DIR", action="append", help="also search this folder (sparse, dense or "
                   "multi-vector: `bertforge embed` of the same input, a kind --index is not) and fuse the rankings by "
                   "reciprocal rank fusion; repeat to fuse all three kinds")
    p.add_argument("--rrf-k", type=float, default=60, help="--hybrid: the fusion constant k in 1 / (k + rank) "
                   "(default 60)")
    p.add_argument("--fusion-depth", type=int, default=100, help="--hybrid: rows each folder ranks per query "
                   "before fusion (default 100)")
    p.add_argument("--sparse-model", help="--hybrid: the sparse folder's model directory when --index is not the sparse one (default: the one its "
                   "manifest names)")
    p.add_argument("--rerank", metavar="MULTI_VECTOR_DIR", help="rerank the best --rerank-depth hits of --index (and "
                   "--hybrid) by their MaxSim in this folder (`bertforge embed --multi-vector` of the same input); "
                   "each hit then has its \"first_rank\"")
    p.add_argument("--rerank-depth", type=int, default=100, help="--rerank: hits of the first search reranked per "
                   "query (default 100)")
    queries = p.add_mutually_exclusive_group(required=True)
    queries.add_argument("--query", action="append", help="a query text (repeat for several)")
    queries.add_argument("--queries", help="a file of query texts, one a line (blank lines skipped)")
    p.add_argument("--top-k", type=int, default=10, help="hits per query (default 10)")
    p.add_argument("--model", help="the model directory (default: the one the manifest names; must be the same "
                   "model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rescore-multiplier", type=int, help="binary folders: candidates rescored with their int8 "
                   "codes per hit wanted (default 4)")
    p.add_argument("--precision", choices=precision_choices(), help="the queries' precision (default: the one the "
                   "corpus was embedded with; int8: CPU only)")
    p.add_argument("--exact", action="store_true", help="scan every vector even where the folder has an "
                   "approximate index (`bertforge index`), which search otherwise uses")
    p.add_argument("--ef-search", type=int, help="approximate index: candidates kept while walking the graph "
                   "(more: higher recall, slower; default: the index's, 128)")
    p.add_argument("--filter", action="append", metavar="CONDITION", help="search only the records whose metadata "
                   "(`embed --field`) meets this: FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE (also >, <, <=), FIELD in "
                   "A,B, FIELD not in A,B, or a JSON object {\"FIELD\": VALUE, \"FIELD\": {\"gte\": VALUE}}; repeat "
                   "to require several; the hits are the top-k of the matching records")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--show-text", action="store_true", help="add each hit's text, read back from the input "
                       "that was embedded (refused if it changed since)")
    shown.add_argument("--field", help="add this TSV/CSV column or JSONL field of each hit's record (e.g. title)")
    add_prompt_flags(p, "every query")
    p.set_defaults(func=cmd_search)


def add_prompt_flags(p: argparse.ArgumentParser, what: str) -> None:
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument("--prompt-name", help=f"the model's prompt of that name before {what} (e.g. query, "
                         "document; default: the model's default prompt, if any)")
    prompts.add_argument("--prompt", help=f"this text before {what}")


class EmbedBar:
    """`bertforge embed`'s progress: texts embedded, with rate and ETA, updated after every model batch (a
    bar on a terminal, a log line every tenth otherwise: `training.logging.Progress`)."""

    def __init__(self) -> None:
        self.progress = None
        self.cut = 0  # texts cut to the model's window so far (shown once there is one)

    def start(self, total: int, done: int) -> None:
        from bertforge.training.logging import Progress

        self.progress = Progress(total, done, enabled=True, unit="text")

    def advance(self, texts: int) -> None:
        if self.progress is not None:
            self.progress.update(texts, **({"truncated": self.cut} if self.cut else {}))

    def truncated(self, texts: int) -> None:
        self.cut += texts

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


def cmd_embed(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.processes import Ranks
    from bertforge.retrieval.embed_corpus import CorpusSettings, EmbedSettings, embed_corpus

    settings = CorpusSettings(file_format=args.format, text_column=args.text_column, id_column=args.id_column)
    bar = EmbedBar()
    try:
        embedding = EmbedSettings(pooling=args.pooling, normalize=args.normalize, prompt_name=args.prompt_name,
                                  prompt=args.prompt, dtype=args.dtype, sparse=args.sparse, max_terms=args.max_terms,
                                  chunk=args.chunk, chunk_overlap=args.chunk_overlap, late_chunking=args.late_chunking,
                                  truncate=args.truncate, multi_vector=args.multi_vector)
        manifest = embed_corpus(args.model, args.input, args.out, embedding, settings=settings,
                                shard_size=args.shard_size, batch_size=args.batch_size, max_length=args.max_length,
                                device=args.device, precision=args.precision, engine=args.engine,
                                threads=args.threads, progress=bar, fields=args.field)
    finally:
        bar.close()
    if Ranks.from_env().rank == 0 and manifest["kind"] == "sparse":
        from bertforge.retrieval.sparse_search import SparseIndex

        SparseIndex(args.out).inverted()  # built once here, saved beside the shards for every search
        terms = sum(shard["nonzero"] for shard in manifest["shards"])
        print(f"{manifest['count']} sparse vectors ({terms / manifest['count']:.1f} terms per text of "
              f"{manifest['dim']}) in {len(manifest['shards'])} shards in {args.out}", file=sys.stderr)
    elif Ranks.from_env().rank == 0 and manifest["kind"] == "multi-vector":
        vectors = sum(shard["vector_count"] for shard in manifest["shards"])
        print(f"{manifest['count']} texts as {vectors} token vectors ({vectors / manifest['count']:.1f} per text, "
              f"{manifest['dim']} dims, {manifest['dtype']}) in {len(manifest['shards'])} shards in {args.out}",
              file=sys.stderr)
    elif Ranks.from_env().rank == 0:
        print(f"{manifest['count']} vectors ({manifest['dim']} dims, {manifest['dtype']}, "
              f"{manifest['similarity']} similarity) in {len(manifest['shards'])} shards in {args.out}",
              file=sys.stderr)
    if Ranks.from_env().rank == 0 and manifest.get("truncated"):
        window = manifest["embedding"]["max_length"]
        print(f"{manifest['truncated']} of {manifest['count']} texts were longer than the model's window of {window} "
              "tokens and were cut to it (the manifest's \"truncated\"); --chunk TOKENS embeds whole texts as "
              "several vectors, --truncate false refuses them", file=sys.stderr)


def cmd_search(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.text_files import iter_lines
    from bertforge.errors import ConfigError, DataError
    from bertforge.retrieval.hybrid_search import (
        collection_hits,
        folder_hits,
        fused_hits,
        reranked_hits,
    )
    from bertforge.retrieval.index_locations import is_qdrant_location

    if args.queries is not None:
        queries = [line for line in iter_lines(args.queries) if line.strip()]
        if not queries:
            raise DataError("holds no query (only blank lines); write one query a line", args.queries)
    else:
        queries = list(args.query)
    common = {"top_k": args.top_k, "model": args.model, "device": args.device, "batch_size": args.batch_size,
              "prompt_name": args.prompt_name, "prompt": args.prompt, "precision": args.precision,
              "show_text": args.show_text, "field": args.field, "filter": args.filter}
    if is_qdrant_location(args.index):
        if args.hybrid:
            raise ConfigError(f"{args.index} holds the dense and the sparse vectors of its export: remove --hybrid "
                              "(?vectors=dense or sparse searches one kind)")
        if args.rerank:
            raise ConfigError(f"--rerank reranks the hits of a vector folder; {args.index} is a Qdrant collection")
        results = collection_hits(args.index, queries, exact=args.exact, ef_search=args.ef_search,
                                  rescore_multiplier=args.rescore_multiplier, rrf_k=args.rrf_k,
                                  depth=args.fusion_depth, sparse_model=args.sparse_model, **common)
    elif args.rerank:
        folders = [args.index, *(args.hybrid or [])]
        results = reranked_hits(folders, args.rerank, queries, depth=args.rerank_depth, sparse_model=args.sparse_model,
                                rrf_k=args.rrf_k, exact=args.exact, ef_search=args.ef_search,
                                rescore_multiplier=args.rescore_multiplier, **common)
    elif args.hybrid:
        if args.rescore_multiplier is not None:
            raise ConfigError("--rescore-multiplier applies to binary folders searched alone; remove it with --hybrid")
        if args.ef_search is not None:  # the fused dense ranking is exact (depth rows, not an approximate top k)
            raise ConfigError("--ef-search applies to a dense folder searched alone; remove it with --hybrid")
        results = fused_hits([args.index, *args.hybrid], queries, rrf_k=args.rrf_k, depth=args.fusion_depth,
                             sparse_model=args.sparse_model, **common)
    else:
        given = [flag for flag, value in (("--sparse-model", args.sparse_model),) if value is not None]
        if given:
            raise ConfigError(f"{given[0]} applies to --hybrid searches; remove it or add --hybrid SPARSE_DIR")
        results = folder_hits(args.index, queries, rescore_multiplier=args.rescore_multiplier, exact=args.exact,
                              ef_search=args.ef_search, **common)
    for query, hits in zip(queries, results):
        print(json.dumps({"query": query, "hits": hits}, ensure_ascii=False))
