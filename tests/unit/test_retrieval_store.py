"""The vector folder's format (`retrieval.store`): `EmbedSettings` checked when made and stored resolved in the
manifest; a version 1 folder (its settings spread over "kind", "dtype", "chunking" and "embedding") still opens,
searches and resumes as the same run."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bertforge.errors import ConfigError
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import store
from bertforge.retrieval.hybrid_search import folder_hits

TEXTS = ["the river floods the market", "a quiet station at dawn", "warm bread and coffee", "rain on the window",
         "a long walk at night", "fish sold at the harbour", "music from a window", "an old book on a shelf"]


@pytest.mark.parametrize("settings, words", [
    ({"dtype": "int4"}, "dtype 'int4' is not supported"),
    ({"sparse": True, "dtype": "int8"}, "remove --dtype int8"),
    ({"sparse": True, "normalize": True}, "remove --normalize"),
    ({"max_terms": 8}, "--max-terms prunes sparse vectors"),
    ({"late_chunking": True}, "add --chunk TOKENS"),
    ({"chunk": 8, "late_chunking": True, "sparse": True}, "applies to dense vectors"),
    ({"chunk": 8, "chunk_overlap": 8}, "--chunk-overlap must be"),
    ({"chunk_overlap": 2}, "--chunk-overlap needs --chunk"),
])
def test_store_embed_settings_refuse_what_does_not_apply(settings, words):
    with pytest.raises(ConfigError, match=words):
        store.EmbedSettings(**settings)


def version_1(manifest: dict) -> dict:
    """The manifest a version 1 run wrote for the same settings: no "settings", chunking as its own dict."""
    old = {key: value for key, value in manifest.items() if key != "settings"}
    chunking = store.embed_settings(manifest).chunking
    return {**old, "version": 1, **({"chunking": chunking} if chunking is not None else {})}


def test_store_manifest_holds_the_resolved_settings_and_version_1_reads_the_same(tiny_minilm_model, tmp_path):
    (tmp_path / "c.txt").write_text("\n".join(TEXTS * 2) + "\n", encoding="utf-8")
    settings = store.EmbedSettings(normalize=True, chunk=6, chunk_overlap=2)
    manifest = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v", settings, device="cpu",
                              shard_size=5)
    resolved = dataclasses.replace(settings, pooling="mean", prompt="")  # the model's pooling, its empty prompt
    assert manifest["version"] == store.FORMAT_VERSION == 2 and manifest["settings"] == dataclasses.asdict(resolved)
    assert store.embed_settings(manifest) == resolved and store.VectorFolder(tmp_path / "v").chunked
    before = folder_hits(tmp_path / "v", TEXTS[:3], top_k=4, device="cpu", show_text=True)

    old = version_1(manifest)
    (tmp_path / "v" / store.MANIFEST_NAME).write_text(json.dumps(old), encoding="utf-8")
    assert store.embed_settings(old) == resolved and store.identity(old) == store.identity(manifest)
    assert folder_hits(tmp_path / "v", TEXTS[:3], top_k=4, device="cpu", show_text=True) == before
    again = E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v", settings, device="cpu",
                           shard_size=5)
    assert again == old  # the same run: the complete version 1 folder is kept as it is, nothing re-embedded
    with pytest.raises(ConfigError, match="chunk_overlap 2 -> 3"):
        E.embed_corpus(tiny_minilm_model, tmp_path / "c.txt", tmp_path / "v",
                       dataclasses.replace(settings, chunk_overlap=3), device="cpu", shard_size=5)


def test_store_refuses_a_manifest_of_another_format(tmp_path):
    (tmp_path / store.MANIFEST_NAME).write_text(json.dumps({"format": "bertforge-embeddings", "version": 3}))
    with pytest.raises(ConfigError, match="not a bertforge embedding manifest"):
        store.read_manifest(tmp_path)
