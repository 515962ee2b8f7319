"""Where an index lives, as `--index` names it: vector folders (one, or a dense and a sparse one of the same
input) or a Qdrant collection (qdrant://HOST:PORT/COLLECTION, qdrant+path:DIR?collection=NAME). The one entry
point that opens either for `bertforge search` and `POST /search`.

Owns: `open_index` (locations -> a `searcher.Searcher` or a `qdrant_collection.QdrantSearcher`: the same
`kinds`, `query_models`, `count`, `where` and `search`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bertforge.errors import ConfigError
from bertforge.retrieval.qdrant_collection import QdrantSearcher
from bertforge.retrieval.qdrant_locations import is_qdrant_location
from bertforge.retrieval.searcher import Searcher


def open_index(locations: Sequence[str | os.PathLike], *, exact: bool = False) -> Any:
    """The index at `locations`: a Qdrant collection (one location) or folders (`Searcher.of_folders`).

    Raises:
        ConfigError: a collection given with anything else, or what opening the index refuses.
    """
    remote = [location for location in locations if is_qdrant_location(location)]
    if remote:
        if len(locations) != 1:
            raise ConfigError(f"{remote[0]} is a whole index (a collection holds dense and sparse vectors alike); "
                              "give it alone")
        return QdrantSearcher(str(remote[0]))
    return Searcher.of_folders(locations, exact=exact)


__all__ = ["is_qdrant_location", "open_index"]
