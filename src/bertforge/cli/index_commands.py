"""`bertforge index` (an approximate HNSW index beside the vectors `bertforge embed` wrote, or the compressed token
index of a multi-vector folder, which `bertforge search` then uses), the changes of a finished folder (`bertforge add`, `delete`, `compact`) and its export into a
vector database (`bertforge export-index`): their flags and what they run. The work is `retrieval.vector_ann`,
`retrieval.token_index`, `retrieval.folder_growth` and `retrieval.qdrant_collection`."""

from __future__ import annotations

import argparse
import sys


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare this module's subcommands on the `bertforge` parser."""
    p = sub.add_parser("index", help="build an approximate index of an embedding folder (HNSW; a multi-vector "
                       "folder: a compressed token index), which `bertforge search` then uses (needs the search "
                       "extra: faiss-cpu)",
                       description="Builds an HNSW graph of every vector of an embedding folder with the metric "
                       "exact search uses (inner product: the cosine of normalized vectors) and saves it beside the "
                       "shards (ann-hnsw.faiss, ann.json). Of a multi-vector folder (`embed --multi-vector`) it "
                       "builds a compressed token index instead (k-means centroids, each token's centroid and "
                       "quantized residual, inverted lists: token-index.json, token-index/), in parts that a rerun "
                       "resumes. `bertforge search` then searches through it; `search --exact` scans every vector "
                       "instead.")
    p.add_argument("--index", required=True, metavar="DIR", help="the --out folder of `bertforge embed` (float32, "
                   "float16 or int8; or --multi-vector)")
    p.add_argument("--m", type=int, help="HNSW: neighbours per node of the graph (default 32)")
    p.add_argument("--ef-construction", type=int, help="HNSW: candidates kept while building (default 200)")
    p.add_argument("--ef-search", type=int, help="HNSW: candidates kept while searching, recorded as the "
                   "index's default (default 128; `search --ef-search` overrides it)")
    p.add_argument("--centroids", type=int, help="token index: k-means centroids (default: the power of two at "
                   "most 4 x sqrt(token vectors))")
    p.add_argument("--residual", help="token index: how each token's residual is coded: SQ4 (4 bits a number, the "
                   "default), SQ8, or PQ<bytes> (a product quantizer, e.g. PQ32)")
    p.add_argument("--nprobe", type=int, help="token index: centroids probed per query token (default 16)")
    p.add_argument("--probe-tokens", type=int, help="token index: tokens kept per query token from the centroids "
                   "it probes; their documents are the candidates (default 1024)")
    p.add_argument("--candidates", type=int, help="token index: documents scored from their compressed tokens "
                   "per query (default 4096)")
    p.add_argument("--rescore", type=int, help="token index: documents rescored by exact MaxSim per query "
                   "(default 256)")
    p.set_defaults(func=cmd_index)
    add_growth_parsers(sub)
    add_export_parser(sub)


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-index", help="write an embedding folder (dense and/or sparse) into a vector database "
                       "(Qdrant), which `bertforge search` and `serve --index` then query",
                       description="Upserts every live row of the folders as a point of a Qdrant collection (created "
                       "when missing, with the folder's metric): named vectors dense and sparse, payload id, text "
                       "and span; rerunning writes the same points and removes those of rows deleted since. The "
                       "collection records the model that embeds its queries.")
    p.add_argument("--index", required=True, action="append", metavar="DIR", help="the --out folder of `bertforge "
                   "embed` (repeat with a sparse folder of the same input: both go into one collection)")
    p.add_argument("--to", required=True, nargs=2, metavar=("TARGET", "URL|PATH"), help="qdrant and where: "
                   "a server URL (http://localhost:6333; QDRANT_API_KEY: its key), qdrant://HOST:PORT/COLLECTION, "
                   "or a local folder (qdrant-client's local mode)")
    p.add_argument("--collection", help="the collection's name (default: the folder's name)")
    p.add_argument("--batch-size", type=int, default=256, help="points per upsert (default 256)")
    p.add_argument("--no-text", dest="text", action="store_false", help="leave the texts out of the payload (the "
                   "embedded input is then not read)")
    p.set_defaults(func=cmd_export_index)


def add_growth_parsers(sub: argparse._SubParsersAction) -> None:
    from bertforge.cli.corpus_commands import FORMAT_CHOICES, add_prompt_flags
    from bertforge.engine.build import DEFAULT_KIND, KINDS

    p = sub.add_parser("add", help="embed more records into a folder of `bertforge embed` (a record whose id it holds "
                       "replaces it); nothing else is embedded again",
                       description="Embeds the records of --input with the folder's model and settings into new "
                       "shards, marks the rows of records it replaces (same id) as deleted, then commits the new "
                       "manifest; the approximate index gets the new vectors. A flag that differs from the folder's "
                       "settings is refused, naming it.")
    p.add_argument("--index", required=True, metavar="DIR", help="the --out folder of `bertforge embed`")
    p.add_argument("--input", required=True, help="a text/TSV/CSV/JSONL file, or a folder of them")
    p.add_argument("--model", help="a copy of the folder's model (default: the one its manifest names)")
    p.add_argument("--batch-size", type=int, default=32, help="texts per model call (default 32)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--engine", default=DEFAULT_KIND, choices=KINDS, help=f"what runs the model (default "
                   f"{DEFAULT_KIND}); the precision and window are the folder's")
    p.add_argument("--threads", type=int, help="intra-op threads (default: the engine's)")
    p.add_argument("--pooling", help="must be the folder's (default: the folder's)")
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, help="must be the folder's")
    p.add_argument("--dtype", help="must be the folder's")
    add_prompt_flags(p, "every text (must be the folder's; default: the folder's)")
    p.add_argument("--format", choices=FORMAT_CHOICES, help="input format (default: the folder's input's)")
    p.add_argument("--text-column", "--text-field", dest="text_column", help="column or field of the text "
                   "(default: the folder's input's)")
    p.add_argument("--id-column", "--id-field", dest="id_column", help="column or field of each record's id "
                   "(default: the folder's input's)")
    p.add_argument("--field", action="append", metavar="NAME[:TYPE]", help="the metadata fields, read from the new "
                   "records: must be the folder's (default: the folder's)")
    p.set_defaults(func=cmd_add)

    p = sub.add_parser("delete", help="delete records of a folder of `bertforge embed` by id (searches skip them; "
                       "`bertforge compact` drops their rows)")
    p.add_argument("--index", required=True, metavar="DIR", help="the --out folder of `bertforge embed`")
    p.add_argument("--id", action="append", default=[], help="an id to delete (repeat for several)")
    p.add_argument("--ids-file", help="a file of ids to delete, one a line")
    p.add_argument("--missing-ok", action="store_true", help="delete the ids present, ignore the others")
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser("compact", help="rewrite a folder's shards without its deleted rows, and rebuild its indexes")
    p.add_argument("--index", required=True, metavar="DIR", help="the --out folder of `bertforge embed`")
    p.set_defaults(func=cmd_compact)


HNSW_FLAGS = {"m": 32, "ef_construction": 200, "ef_search": 128}
TOKEN_FLAGS = ("centroids", "residual", "nprobe", "probe_tokens", "candidates", "rescore")


def cmd_index(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.errors import ConfigError
    from bertforge.retrieval.store import VectorFolder

    multi_vector = VectorFolder(args.index).kind == "multi-vector"
    mine, theirs = (TOKEN_FLAGS, HNSW_FLAGS) if multi_vector else (HNSW_FLAGS, TOKEN_FLAGS)
    given = [name for name in theirs if getattr(args, name) is not None]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} applies to the {'HNSW' if multi_vector else 'token'} "
                          f"index of a {'dense' if multi_vector else 'multi-vector'} folder; {args.index} holds "
                          f"{'multi-vector' if multi_vector else 'dense'} vectors")
    if multi_vector:
        from bertforge.retrieval.token_index import TokenIndexSettings, build_token_index

        settings = TokenIndexSettings(**{name: getattr(args, name) for name in mine if getattr(args, name) is not None})
        record = build_token_index(args.index, settings)
        print(f"token index of {record['tokens']} token vectors ({record['count']} texts): {record['centroids']} "
              f"centroids, {settings.residual} residuals, {record['bytes_per_token']:.1f} bytes a token, "
              f"{record['bytes'] / 2**20:.1f} MiB in {args.index}", file=sys.stderr)
        return
    from bertforge.retrieval.vector_ann import build_ann

    record = build_ann(args.index, **{name: getattr(args, name) if getattr(args, name) is not None else default
                                      for name, default in HNSW_FLAGS.items()})
    print(f"HNSW index of {record['count']} vectors ({record['dim']} dims, inner product: {record['similarity']}) "
          f"built in {record['build_seconds']:.1f} s on {record['threads']} threads: {record['bytes'] / 2**20:.1f} "
          f"MiB in {args.index}/{record['file']}", file=sys.stderr)


def cmd_add(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.retrieval.folder_growth import add_records

    embedding = {"pooling": args.pooling, "normalize": args.normalize, "dtype": args.dtype,
                 "prompt_name": args.prompt_name, "prompt": args.prompt}
    reading = {name: value for name, value in (("file_format", args.format), ("text_column", args.text_column),
                                                ("id_column", args.id_column)) if value is not None}
    done = add_records(args.index, args.input, model=args.model, embedding=embedding, settings=reading,
                       batch_size=args.batch_size, device=args.device, engine=args.engine, threads=args.threads,
                       fields=args.field)
    print(f"added {done['added']} records ({done['replaced']} replacing records of the same id) in {done['shards']} "
          f"shards in {done['seconds']:.1f} s: {done['live']} live rows of {done['count']} in {args.index}",
          file=sys.stderr)


def cmd_delete(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.data.text_files import iter_lines
    from bertforge.retrieval.folder_growth import delete_records

    ids = list(args.id) + ([line.strip() for line in iter_lines(args.ids_file) if line.strip()]
                           if args.ids_file else [])
    done = delete_records(args.index, ids, missing_ok=args.missing_ok)
    print(f"deleted {done['deleted']} records ({done['rows']} rows): {done['live']} live rows of {done['count']} in "
          f"{args.index}", file=sys.stderr)


def cmd_compact(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.retrieval.folder_growth import compact_folder

    done = compact_folder(args.index)
    print(f"dropped {done['dropped']} deleted rows: {done['count']} rows in {done['shards']} shards in {args.index} "
          f"({done['seconds']:.1f} s)", file=sys.stderr)


def cmd_export_index(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.errors import ConfigError
    from bertforge.retrieval.qdrant_collection import export_folders

    target, where = args.to
    if target != "qdrant":
        raise ConfigError(f"--to {target}: the vector database to write is qdrant (--to qdrant URL|PATH)")
    done = export_folders(args.index, where, collection=args.collection, with_text=args.text,
                          batch_size=args.batch_size)
    print(f"{done['points']} points written to collection {done['collection']} at {done['where']} "
          f"({done['removed']} points of rows no longer live removed)", file=sys.stderr)
