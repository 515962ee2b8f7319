"""`bertforge plot-embeddings`: a 2-D map of the vectors `bertforge embed` wrote, coloured by a column of the
embedded input, as a PNG and as TensorBoard projector files (`retrieval.embedding_map`, imported when the
command runs)."""

from __future__ import annotations

import argparse
import sys

# Spelled here so that building the parser imports nothing heavy; a test checks them against the module's.
METHOD_CHOICES = ("pca", "umap")
DEFAULT_MAX_POINTS = 10_000


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declare this module's subcommands on the `bertforge` parser."""
    p = sub.add_parser("plot-embeddings", help="a 2-D map of a corpus' vectors (PCA/UMAP): PNG + TensorBoard "
                       "projector files", description="Project the vectors `bertforge embed` wrote to two "
                       "dimensions and draw them, one dot per text, coloured by a column of the embedded input. "
                       "Writes map.png and TensorBoard projector files (tensors.tsv, projection.tsv, metadata.tsv, "
                       "projector_config.pbtxt: tensorboard --logdir OUT).")
    p.add_argument("--index", required=True, help="the --out folder of `bertforge embed`")
    p.add_argument("--label", help="column of the input to colour by: TSV/CSV header name (or 0-based index) or "
                   "JSON Lines field (default: one colour)")
    p.add_argument("--out", help="output folder (default: INDEX/map)")
    p.add_argument("--method", choices=METHOD_CHOICES, default="pca",
                   help="pca (default) or umap (needs the umap-learn package)")
    p.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS,
                   help=f"draw at most this many texts, chosen at random with --seed (default {DEFAULT_MAX_POINTS})")
    p.add_argument("--seed", type=int, default=0, help="which texts --max-points keeps, and UMAP's seed")
    p.add_argument("--input", help="the embedded input, if it moved since (default: the path in the manifest)")
    p.add_argument("--no-png", action="store_true", help="the projector files only (no matplotlib needed)")
    p.set_defaults(func=cmd_plot_embeddings)


def cmd_plot_embeddings(args: argparse.Namespace, extra: list[str]) -> None:
    from bertforge.retrieval.embedding_map import plot_embeddings

    written = plot_embeddings(args.index, args.out, label=args.label, method=args.method,
                              max_points=args.max_points, seed=args.seed, inputs=args.input, png=not args.no_png)
    for path in written.values():
        print(path)
    print(f"open the projector with: tensorboard --logdir {written['config'].parent}", file=sys.stderr)
