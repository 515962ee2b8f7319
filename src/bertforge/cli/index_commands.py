"""`bertforge index` (an approximate HNSW index beside the vectors `bertforge embed` wrote, which `bertforge
search` then uses): its flags and what it runs. The work is `retrieval.vector_ann`."""

from __future__ import annotations

import argparse
import sys


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare this module's subcommands on the `bertforge` parser."""
    p = sub.add_parser("index", help="build an approximate (HNSW) index of an embedding folder, which `bertforge "
                       "search` then uses (needs the search extra: faiss-cpu)",
                       description="Builds an HNSW graph of every vector of an embedding folder with the metric "
                       "exact search uses (inner product: the cosine of normalized vectors) and saves it beside the "
                       "shards (ann-hnsw.faiss, ann.json). `bertforge search` then searches through it; "
                       "`search --exact` scans every vector instead.")
    p.add_argument("--index", required=True, metavar="DIR", help="the --out folder of `bertforge embed` (float32, "
                   "float16 or int8)")
    p.add_argument("--m", type=int, default=32, help="neighbours per node of the graph (default 32)")
    p.add_argument("--ef-construction", type=int, default=200, help="candidates kept while building (default 200)")
    p.add_argument("--ef-search", type=int, default=128, help="candidates kept while searching, recorded as the "
                   "index's default (default 128; `search --ef-search` overrides it)")
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.retrieval.vector_ann import build_ann

    record = build_ann(args.index, m=args.m, ef_construction=args.ef_construction, ef_search=args.ef_search)
    print(f"HNSW index of {record['count']} vectors ({record['dim']} dims, inner product: {record['similarity']}) "
          f"built in {record['build_seconds']:.1f} s on {record['threads']} threads: {record['bytes'] / 2**20:.1f} "
          f"MiB in {args.index}/{record['file']}", file=sys.stderr)
