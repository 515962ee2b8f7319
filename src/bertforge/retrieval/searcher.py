"""Search of one index, opened once and searched with query vectors: a dense folder (exact, or through its
approximate index), a sparse one, a multi-vector one (a ColBERT model's token vectors, exact MaxSim or through its token index), or any two
or all three kinds of folders of the same input fused by reciprocal rank fusion (hybrid); and any of those with a
multi-vector folder reranking their best `depth` rows. The one search path of `bertforge search` (which embeds
the queries with pipelines of its own, `query_embedding`) and of the server's `POST /search` (which embeds them
through the served models' schedulers).

Owns: `Searcher` (the folders opened, the ANN graph and the inverted index loaded; `search` from query vectors to
hits; `query_models`: how each side's queries are embedded, a `query_embedding.QueryModel` each), turning rows
into hits (`hits_of`: ids, scores, spans of chunks, texts or fields read back from the input) and the rule that
folders can be fused or rerank each other (`check_aligned`: the same records in the same rows).

Hybrid: each query is searched exactly in every folder for its best `depth` rows (the filter applied in each);
a row's fused score is the sum over the folders of 1 / (rrf_k + its rank there), a rank it does not have adding
nothing. The hits are the best `top_k` fused rows, with the rank each folder gave them ("dense_rank",
"sparse_rank", "multi_vector_rank"; None: not in that folder's first `depth`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertforge.errors import ConfigError, InputError
from bertforge.metrics.fusion import DEFAULT_RRF_K, check_rrf_k, reciprocal_rank_fusion
from bertforge.metrics.sparse import SparseRows
from bertforge.retrieval.fields import FieldSpec
from bertforge.retrieval.filters import Filter, parse_filter
from bertforge.retrieval.multi_vector_search import MultiVectorIndex
from bertforge.retrieval.query_embedding import QueryModel, query_model
from bertforge.retrieval.sparse_search import SparseIndex
from bertforge.retrieval.store import VectorFolder
from bertforge.retrieval.token_index import TokenIndex, open_token_index
from bertforge.retrieval.vector_ann import AnnIndex, open_ann
from bertforge.retrieval.vector_index import DEFAULT_TOP_K, VectorIndex, check_top_k
from bertforge.retrieval.vector_quantization import DEFAULT_RESCORE_MULTIPLIER
from bertforge.retrieval.vector_texts import record_texts

# Rows each folder contributes per query before fusion.
DEFAULT_FUSION_DEPTH = 100
KINDS = ("dense", "sparse", "multi-vector")


def check_same_input(dense: VectorFolder, sparse: VectorFolder) -> None:
    """ConfigError unless a dense and a sparse folder embedded the same records in the same order."""
    if dense.kind != "dense" or sparse.kind != "sparse":
        raise ConfigError(f"hybrid search fuses a dense folder ({dense.directory}: {dense.kind}) with a sparse one "
                          f"({sparse.directory}: {sparse.kind}); give --index the dense folder (`bertforge embed`) "
                          "and --hybrid the sparse one (`bertforge embed --sparse`)")
    check_aligned(dense, sparse)


def check_aligned(dense: VectorFolder, sparse: VectorFolder) -> None:
    """ConfigError unless two folders embedded the same records in the same order (row i is the same record in
    both: fused, or one reranking the other's rows), with the same rows deleted and the same chunking."""
    first, second = dense.manifest["input"], sparse.manifest["input"]
    added = [[(addition["files"], addition["settings"]) for addition in folder.manifest.get("additions", [])]
             for folder in (dense, sparse)]
    chunking = [tuple((folder.manifest.get("settings") or {}).get(name) for name in ("chunk", "chunk_overlap"))
                for folder in (dense, sparse)]
    same = (first["files"] == second["files"] and first["settings"] == second["settings"]
            and dense.count == sparse.count and added[0] == added[1])
    if same and chunking[0] != chunking[1]:
        raise ConfigError(f"{dense.directory} and {sparse.directory} cut the records into different chunks (--chunk "
                          f"{chunking[0][0]} and {chunking[1][0]}): embed both with the same --chunk and "
                          "--chunk-overlap")
    if same and not np.array_equal(dense.deleted, sparse.deleted):
        raise ConfigError(f"{dense.directory} and {sparse.directory} have different rows deleted ({len(dense.deleted)} "
                          f"and {len(sparse.deleted)}): give `bertforge add` / `delete` / `compact` the same records "
                          "and ids for both folders")
    if not same:
        raise ConfigError(f"{dense.directory} and {sparse.directory} embedded different input ({first['path']}, "
                          f"{dense.count} records; {second['path']}, {sparse.count} records): embed the same input "
                          "files with the same --format and columns into both")


def hits_of(index: VectorFolder, scores: np.ndarray, rows: np.ndarray, show_text: bool = False,
            field: str | None = None) -> list[list[dict[str, Any]]]:
    """Each query's hits {"id", "score"} from its best rows [Q, k] and their scores, best first (plus "span" of
    a chunked folder's rows, "text" with `show_text`, or the record's `field`: read back from the input the
    row's record came from, `VectorFolder.records_at` and `vector_texts.record_texts`)."""
    ids = index.ids_at(rows)
    hits = [[{"id": ident, "score": float(score)} for ident, score in zip(query_ids, query_scores)]
            for query_ids, query_scores in zip(ids, scores)]
    spans = index.spans_at(rows) if index.chunked else [[[None, None, None] for _ in query] for query in rows]
    if index.chunked:
        for query_hits, query_spans in zip(hits, spans):
            for hit, (_, start, end) in zip(query_hits, query_spans):
                hit["span"] = [start, end]  # the chunk's characters of its record's text
    if show_text or field is not None:
        sources, records = index.records_at(rows)
        texts = {source: record_texts(index.input_of(source), set(records[sources == source].tolist()), field)
                 for source in np.unique(sources).tolist()}
        for query_hits, query_spans, query_sources, query_records in zip(hits, spans, sources.tolist(),
                                                                          records.tolist()):
            for hit, (_, start, end), source, record in zip(query_hits, query_spans, query_sources, query_records):
                text = texts[source][record]
                # --show-text of a chunk: its own text; --field: the whole record's value
                hit[field if field is not None else "text"] = text[start:end] if field is None else text
    return hits


def rank_key(kind: str) -> str:
    """A fused hit's key for its rank in one kind's ranking: "dense_rank", "sparse_rank", "multi_vector_rank"."""
    return kind.replace("-", "_") + "_rank"


def fuse(rankings: dict[str, np.ndarray], k: int, rrf_k: float,
         ) -> tuple[np.ndarray, np.ndarray, list[list[dict[str, int | None]]]]:
    """([Q, k] fused scores, [Q, k] rows, each hit's {"<kind>_rank": its rank there, or None}) of several
    kinds' rankings (kind -> [Q, depth] rows, best first), by reciprocal rank fusion (`metrics.fusion`)."""
    kinds = list(rankings)
    count = len(rankings[kinds[0]])
    fused_rows = np.zeros((count, k), dtype=np.int64)
    fused_scores = np.zeros((count, k), dtype=np.float64)
    ranks = []
    for q in range(count):
        lists = [rankings[kind][q].tolist() for kind in kinds]
        fused = reciprocal_rank_fusion(lists, rrf_k, top=k)
        fused_rows[q, :len(fused)] = [row for row, _ in fused]
        fused_scores[q, :len(fused)] = [score for _, score in fused]
        places = [{row: rank for rank, row in enumerate(ranking, start=1)} for ranking in lists]
        ranks.append([{rank_key(kind): place.get(row) for kind, place in zip(kinds, places)} for row, _ in fused])
    return fused_scores, fused_rows, ranks


class Searcher:
    """An index opened for search: one folder (dense, sparse or multi-vector), or any two or all three kinds of
    folders of the same input fused by reciprocal rank fusion (hybrid), optionally with a multi-vector folder of
    that input reranking the hits (`rerank`). Everything a search reads more than once is loaded here: the
    manifests, a dense folder's approximate index (unless `exact`, or fused: the fused dense ranking is exact),
    a sparse folder's inverted index.

    Args:
        dense, sparse, multi_vector: the folders (`bertforge embed`, `--sparse`, `--multi-vector`); at least one.
        rerank: a multi-vector folder of the same input whose MaxSim reranks the best `depth` hits of the others.
        exact: score every dense vector even where the folder has an approximate index.

    Raises:
        ConfigError: no folder, a folder of the wrong kind, folders of different input, a stale approximate index.
    """

    def __init__(self, dense: str | os.PathLike | None = None, sparse: str | os.PathLike | None = None, *,
                 multi_vector: str | os.PathLike | None = None, rerank: str | os.PathLike | None = None,
                 exact: bool = False):
        if dense is None and sparse is None and multi_vector is None:
            raise ConfigError("a search needs a dense, a sparse or a multi-vector folder (or several of them, of the "
                              "same input, for hybrid search)" + (" to rerank" if rerank is not None else ""))
        if rerank is not None and multi_vector is not None:
            raise ConfigError(f"two multi-vector folders ({multi_vector}, {rerank}): a multi-vector folder is fused "
                              "or reranks, not both; rerank the hits of the dense or sparse folder, or fuse it")
        self.multi = MultiVectorIndex(multi_vector) if multi_vector is not None else None
        self.reranker = MultiVectorIndex(rerank) if rerank is not None else None
        self.dense = VectorIndex(dense) if dense is not None else None
        if self.dense is not None and self.dense.kind != "dense":
            raise ConfigError(f"{dense} holds {self.dense.kind} vectors: open it as the {self.dense.kind} folder")
        self.sparse = SparseIndex(sparse) if sparse is not None else None
        fused = [folder for folder in (self.dense, self.sparse, self.multi) if folder is not None]
        for other in fused[1:] + ([self.reranker] if self.reranker is not None else []):
            check_aligned(fused[0], other)  # row i is the same record in every folder
        self.ann: AnnIndex | None = None
        if self.dense is not None and len(fused) == 1 and not exact:
            self.ann = open_ann(self.dense)  # before any model loads: a stale index fails fast
        self.tokens: TokenIndex | None = None  # a multi-vector folder's compressed token index
        if self.multi is not None and len(fused) == 1 and not exact:
            self.tokens = open_token_index(self.multi)  # before any model loads, as the graph
        if self.sparse is not None:
            self.sparse.inverted()

    @classmethod
    def of_folders(cls, directories: Sequence[str | os.PathLike], *, rerank: str | os.PathLike | None = None,
                   exact: bool = False) -> Searcher:
        """The searcher of one folder, dense, sparse or multi-vector as its manifest says, or of several folders
        of different kinds and the same input (hybrid), in any order, with `rerank` reranking their hits.

        Raises:
            ConfigError: no folder, or more than one of a kind.
        """
        kinds: dict[str, str | os.PathLike] = {}
        for directory in directories:
            kind = VectorFolder(directory).kind
            if kind in kinds:
                raise ConfigError(f"two {kind} folders ({kinds[kind]}, {directory}); an index is one folder, or "
                                  "folders of different kinds (dense, sparse, multi-vector) of the same input")
            kinds[kind] = directory
        return cls(kinds.get("dense"), kinds.get("sparse"), multi_vector=kinds.get("multi-vector"), rerank=rerank,
                   exact=exact)

    @property
    def fused_kinds(self) -> tuple[str, ...]:
        """The kinds of the folders searched (more than one: fused), in `KINDS` order."""
        return tuple(kind for kind in KINDS if self.folder(kind) is not None)

    @property
    def hybrid(self) -> bool:
        return len(self.fused_kinds) > 1

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of query vectors a search takes: the folders' (`fused_kinds`), with "multi-vector" when
        a multi-vector folder reranks."""
        return self.fused_kinds + (("multi-vector",) if self.reranker is not None else ())

    def folder(self, kind: str) -> VectorFolder | None:
        """The folder searched for that kind (None: none)."""
        return {"dense": self.dense, "sparse": self.sparse, "multi-vector": self.multi}[kind]

    def query_folder(self, kind: str) -> VectorFolder:
        """The folder whose model embeds that kind of query vectors (the reranker's for a reranking one)."""
        folder = self.folder(kind)
        return folder if folder is not None else self.reranker

    @property
    def described(self) -> VectorFolder:
        """The folder whose metadata fields filters read: the first searched (`fused_kinds`) that stores fields,
        else the first (every folder holds the same records in the same rows, `check_aligned`)."""
        folders = [self.folder(kind) for kind in self.fused_kinds]
        return next((folder for folder in folders if folder.fields), folders[0])

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        """The metadata fields a filter may name (`fields.FieldSpec`)."""
        return self.described.fields

    def check_filter(self, given: Any) -> Filter | None:
        """A filter (the JSON form, `--filter` clauses or a `Filter`) checked against the index's fields, before
        any query is embedded; None: no filter.

        Raises:
            InputError: a field the index does not store (naming those it does), a malformed condition, a value
                of another type (`filters.parse_filter`).
        """
        return parse_filter(given, self.fields)

    def query_models(self) -> dict[str, QueryModel]:
        """kind -> how that side's queries are embedded."""
        return {kind: query_model(self.query_folder(kind)) for kind in self.kinds}

    @property
    def count(self) -> int:
        """The rows searched (deleted ones included: the folders' rows)."""
        return self.folder(self.fused_kinds[0]).count

    def where(self, kind: str) -> str:
        """Where that side's vectors are: its folder."""
        return str(self.query_folder(kind).directory)

    def search(self, vectors: dict[str, np.ndarray | SparseRows], top_k: int = DEFAULT_TOP_K, *,
               show_text: bool = False, field: str | None = None, rescore_multiplier: int | None = None,
               ef_search: int | None = None, exact: bool = False, rrf_k: float = DEFAULT_RRF_K,
               depth: int = DEFAULT_FUSION_DEPTH, filter: Any = None) -> list[list[dict[str, Any]]]:
        """The top-k hits of each query, best first: {"id", "score"} (plus "span", "text" or `field`, `hits_of`;
        hybrid: the fused score and each kind's rank, "dense_rank", "sparse_rank", "multi_vector_rank" (None: not
        in that kind's best `depth`); reranked by a multi-vector folder: the MaxSim score and "first_rank", the
        row's rank in the first stage's best `depth`, beside the first stage's ranks).

        Args:
            vectors: per kind of `kinds`, the queries' vectors ([Q, D] float32 dense, `SparseRows` sparse, a
                [q, D] float32 array per query multi-vector), embedded as `query_models` says.
            rescore_multiplier: binary dense folders (`VectorIndex.search_vectors`); ef_search: candidates of the
                approximate index (`AnnIndex.search_vectors`); exact: score every vector even where the approximate
                index is loaded; rrf_k, depth: hybrid fusion (depth: also the rows a multi-vector folder reranks).
            filter: conditions on the metadata fields (`check_filter`); the rows that meet them are the only
                ones any search ranks (a mask applied before the top-k, hybrid: in each kind's ranking), so the
                hits are the top-k of the matching rows.

        Raises:
            InputError: a setting that is invalid or does not apply to this index (names it).
        """
        check_top_k(top_k)
        missing = [kind for kind in self.kinds if kind not in vectors]
        if missing:
            raise InputError(f"the {missing[0]} query vectors are missing")
        checked = self.check_filter(filter)
        rows = None if checked is None else checked.mask(self.described.metadata())  # [count] bool
        first = {"rescore_multiplier": rescore_multiplier, "ef_search": ef_search, "exact": exact, "rrf_k": rrf_k,
                 "depth": depth, "rows": rows}
        if self.reranker is None:
            scores, found, ranks = self.ranked(vectors, top_k, **first)
            hits = hits_of(self.folder(self.fused_kinds[0]), scores, found, show_text, field)
        else:  # the first stage's best `depth` rows, reranked by their MaxSim
            check_top_k(depth, "depth")
            _, first_rows, first_ranks = self.ranked(vectors, max(depth, top_k), **first)
            first_scores = self.reranker.rescore(vectors["multi-vector"], first_rows)
            order = np.lexsort((first_rows, -first_scores), axis=1)[:, :top_k]  # equal scores: lower row first
            found, scores = np.take_along_axis(first_rows, order, 1), np.take_along_axis(first_scores, order, 1)
            hits = hits_of(self.reranker, scores, found, show_text, field)
            ranks = [[{"first_rank": place + 1, **(first_ranks[q][place] if first_ranks is not None else {})}
                      for place in query_order] for q, query_order in enumerate(order.tolist())]
        if ranks is not None:
            for query_hits, query_ranks in zip(hits, ranks):
                for hit, rank in zip(query_hits, query_ranks):
                    hit.update(rank)
        return hits

    def ranked(self, vectors: dict[str, Any], top_k: int, *, rescore_multiplier: int | None, ef_search: int | None,
               exact: bool, rrf_k: float, depth: int, rows: np.ndarray | None,
               ) -> tuple[np.ndarray, np.ndarray, list[list[dict]] | None]:
        """([Q, k] scores, [Q, k] rows, each hit's ranks in the fused rankings or None) of the search of the
        folders (`search`'s arguments; `rows`: the rows the filter allows, [count] bool, or None)."""
        if rescore_multiplier is not None and (self.hybrid or self.dense is None):
            raise InputError("rescore_multiplier applies to a binary dense folder searched alone")
        approximate = self.ann is not None and not exact
        if ef_search is not None and not approximate:
            raise InputError("ef_search applies to a dense folder's approximate index, which this search does not use")
        if self.hybrid:
            check_top_k(depth, "depth")
            check_rrf_k(rrf_k)
            wide = max(depth, top_k)
            rankings = {kind: self.ranking(kind, vectors[kind], wide, rows) for kind in self.fused_kinds}
            allowed = self.described.allowed(rows)
            count = self.count if allowed is None else int(allowed.sum())
            return fuse(rankings, min(top_k, count), rrf_k)
        if self.multi is not None:
            searched = self.tokens if self.tokens is not None and not exact else self.multi
            return (*searched.search_tokens(vectors["multi-vector"], top_k, rows=rows), None)
        if self.sparse is not None:
            return (*self.sparse.search_sparse(vectors["sparse"], top_k, rows=rows), None)
        if approximate:
            return (*self.ann.search_vectors(vectors["dense"], top_k, ef_search, rows=rows), None)
        return (*self.dense.search_vectors(vectors["dense"], top_k, rescore_multiplier or DEFAULT_RESCORE_MULTIPLIER,
                                           rows=rows), None)

    def ranking(self, kind: str, queries: Any, depth: int, rows: np.ndarray | None) -> np.ndarray:
        """[Q, depth] rows of one kind's exact search, best first (what fusion ranks)."""
        if kind == "dense":
            return self.dense.search_vectors(queries, depth, rows=rows)[1]
        if kind == "sparse":
            return self.sparse.search_sparse(queries, depth, rows=rows)[1]
        return self.multi.search_tokens(queries, depth, rows=rows)[1]


__all__ = ["DEFAULT_FUSION_DEPTH", "DEFAULT_RRF_K", "QueryModel", "Searcher", "check_aligned", "check_same_input",
           "hits_of", "rank_key"]
