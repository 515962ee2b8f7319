"""Where a Qdrant collection is, as `--index` and `export-index --to qdrant` name it: a server
(`qdrant://HOST[:PORT]/COLLECTION`, `qdrants://` for HTTPS, or an http(s) URL and a collection name) or a local
folder of qdrant-client's local mode (`qdrant+path:DIR?collection=NAME`, or a plain folder to export into).

Owns: `QdrantLocation`, reading it (`parse_location`, `export_location`) and telling it from a folder
(`is_qdrant_location`). Imports no client: `qdrant_collection` connects.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from bertforge.errors import ConfigError
from bertforge.retrieval.searcher import KINDS

SCHEMES = ("qdrant", "qdrants", "qdrant+path")
DEFAULT_PORT = 6333
COLLECTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")


@dataclass(frozen=True)
class QdrantLocation:
    """A collection: on a server (`url`) or in a local folder (`path`, qdrant-client's local mode); `vectors`:
    the one kind of a dense-and-sparse collection to search (None: every kind it holds, hybrid)."""

    collection: str
    url: str | None = None
    path: str | None = None
    vectors: str | None = None

    def __str__(self) -> str:
        return f"collection {self.collection} at {self.url or self.path}"


def is_qdrant_location(text: str | os.PathLike) -> bool:
    """Whether an --index value names a Qdrant collection (qdrant://, qdrants://, qdrant+path:)."""
    return str(text).split(":", 1)[0] in SCHEMES and ":" in str(text)


def check_collection_name(name: str, given: str) -> str:
    if not COLLECTION_NAME.fullmatch(name or ""):
        raise ConfigError(f"{given}: {name!r} is not a collection name (letters, digits, '_', '.', '-')")
    return name


def parse_location(text: str) -> QdrantLocation:
    """`qdrant://HOST[:PORT]/COLLECTION` (qdrants://: HTTPS; port 6333 by default) or
    `qdrant+path:DIR?collection=NAME` (a local folder); either may end in `?vectors=dense` or `sparse` to search
    one kind of a collection that holds both."""
    parts = urlsplit(str(text))
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    vectors = query.pop("vectors", None)
    if vectors is not None and vectors not in KINDS:
        raise ConfigError(f"{text}: vectors={vectors} is not a kind; use vectors=dense or vectors=sparse")
    if parts.scheme == "qdrant+path":
        path = parts.netloc + parts.path if parts.netloc else parts.path
        if not path or "collection" not in query:
            raise ConfigError(f"{text}: give the folder and the collection, e.g. qdrant+path:/data/qdrant?collection=docs")
        return QdrantLocation(check_collection_name(query["collection"], text), path=path, vectors=vectors)
    if parts.scheme not in ("qdrant", "qdrants") or not parts.hostname:
        raise ConfigError(f"{text}: a Qdrant collection is qdrant://HOST:PORT/COLLECTION or "
                          "qdrant+path:DIR?collection=NAME")
    scheme = "https" if parts.scheme == "qdrants" else "http"
    url = f"{scheme}://{parts.hostname}:{parts.port or DEFAULT_PORT}"
    return QdrantLocation(check_collection_name(parts.path.strip("/"), text), url=url, vectors=vectors)


def export_location(target: str, collection: str | None, default: str) -> QdrantLocation:
    """Where `export-index --to qdrant TARGET` writes: a qdrant:// location, a server URL (http, https) or a
    local folder, with `collection` (default: `default`, the folder's name)."""
    if is_qdrant_location(target):
        location = parse_location(target)
        if collection is not None and collection != location.collection:
            raise ConfigError(f"{target} names collection {location.collection}; remove --collection {collection}")
        return location
    name = check_collection_name(collection or re.sub(r"[^A-Za-z0-9_.-]", "_", default), "--collection")
    if urlsplit(target).scheme in ("http", "https"):
        return QdrantLocation(name, url=target.rstrip("/"))
    return QdrantLocation(name, path=target)


__all__ = ["DEFAULT_PORT", "QdrantLocation", "check_collection_name", "export_location", "is_qdrant_location",
           "parse_location"]
