"""Where an index lives, as `--index` names it: vector folders (one, or folders of different kinds and the same
input, fused; `rerank=DIR` among them: a multi-vector folder that reranks their hits) or a Qdrant collection
(qdrant://HOST:PORT/COLLECTION, qdrant+path:DIR?collection=NAME). The one entry point that opens either for
`bertforge search` and `POST /search`.

Owns: `open_index` (locations -> a `searcher.Searcher` or a `qdrant_collection.QdrantSearcher`: the same
`kinds`, `query_models`, `count`, `where` and `search`; a collection's server that stops answering a search:
`QdrantUnavailable`) and the `rerank=` form (`RERANK_PREFIX`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bertforge.errors import ConfigError
from bertforge.retrieval.qdrant_collection import QdrantSearcher, QdrantUnavailable
from bertforge.retrieval.qdrant_locations import is_qdrant_location
from bertforge.retrieval.searcher import Searcher

# A location written `rerank=DIR`: the multi-vector folder that reranks the other folders' hits.
RERANK_PREFIX = "rerank="


def open_index(locations: Sequence[str | os.PathLike], *, exact: bool = False) -> Any:
    """The index at `locations`: a Qdrant collection (one location) or folders (`Searcher.of_folders`: one, or
    several kinds fused), with at most one `rerank=DIR` among them reranking their hits.

    Raises:
        ConfigError: a collection given with anything else, two rerank folders, or what opening the index refuses.
    """
    remote = [location for location in locations if is_qdrant_location(location)]
    if remote:
        if len(locations) != 1:
            raise ConfigError(f"{remote[0]} is a whole index (a collection holds dense and sparse vectors alike); "
                              "give it alone")
        return QdrantSearcher(str(remote[0]))
    rerank = [str(location)[len(RERANK_PREFIX):] for location in locations if str(location).startswith(RERANK_PREFIX)]
    folders = [location for location in locations if not str(location).startswith(RERANK_PREFIX)]
    if len(rerank) > 1 or (rerank and not folders):
        raise ConfigError(f"rerank={rerank[0]}: one multi-vector folder reranks the hits of the index's other folders "
                          "(e.g. docs=DENSE,SPARSE,rerank=MULTI_VECTOR); give one rerank= and at least one folder")
    return Searcher.of_folders(folders, rerank=rerank[0] if rerank else None, exact=exact)


__all__ = ["RERANK_PREFIX", "QdrantUnavailable", "is_qdrant_location", "open_index"]
