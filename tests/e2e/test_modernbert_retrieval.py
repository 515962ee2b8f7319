"""ColBERT and SPLADE from ModernBERT directories through the CLI: `finetune --format colbert-pairs` from a plain
ModernBERT encoder trains a ModernBERT ColBERT saved in PyLate's layout, which `embed --multi-vector` and
`search` run; a ModernBERT masked LM gives SPLADE vectors (max over tokens of log1p(relu(its MLM logits))), trains
with `finetune --format sparse-pairs` into a SparseEncoder directory, which `embed --sparse` and `search` run."""

from __future__ import annotations

import json

import pytest
import torch
from tests.e2e.test_finetune_embedding import PAIRS, write_pairs

from bertforge.cli import main
from bertforge.families.colbert import ModernBertForColBERT
from bertforge.families.registry import load_model
from bertforge.families.sparse import ModernBertForSparseEmbedding
from bertforge.inference.pipelines import load_pipeline
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertForMaskedLM, ModernBertModel
from bertforge.tokenization.tokenizer_json import JsonTokenizer, train_bpe

TEXTS = [text for pair in PAIRS for text in pair]


def tiny_modernbert(folder, cls, markers: bool = False):
    """A tiny random ModernBERT of class `cls` with a BPE vocabulary trained on the pairs (and, with `markers`,
    ColBERT's default marker tokens [unused0] and [unused1], which ModernBERT's own tokenizer holds)."""
    tokenizer = train_bpe(TEXTS * 5, vocab_size=400)
    if markers:
        tokenizer.backend.add_special_tokens(["[unused0]", "[unused1]"])
        tokenizer = JsonTokenizer(tokenizer.backend, tokenizer.config)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              local_attention=8, max_position_embeddings=512)
    torch.manual_seed(0)
    cls(config).save_pretrained(folder, tokenizer=tokenizer)
    return folder


def finetune(model, out, fmt, data, lr="1e-3") -> int:
    return main(["finetune", "--model", str(model), "--out", str(out), "--epochs", "3", "--batch-size", "4",
                 "--lr", lr, "--format", fmt, "--train", str(data), "--dev", str(data), "--device", "cpu",
                 "--progress=false"])


def searched(capsys, folder, query) -> list[str]:
    capsys.readouterr()
    assert main(["search", "--index", str(folder), "--query", query, "--top-k", "3", "--device", "cpu"]) == 0
    return [hit["id"] for hit in json.loads(capsys.readouterr().out)["hits"]]


def test_modernbert_colbert_finetunes_embeds_multi_vector_and_searches(tmp_path, capsys):
    base = tiny_modernbert(tmp_path / "base", ModernBertModel, markers=True)
    data = write_pairs(tmp_path / "train.tsv")
    assert finetune(base, tmp_path / "run", "colbert-pairs", data) == 0
    best = tmp_path / "run" / "best"
    config = json.loads((best / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("modernbert", ["ModernBertModel"])
    assert [m["type"] for m in json.loads((best / "modules.json").read_text())] == [
        "sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"]
    model, _ = load_model(best)
    assert isinstance(model, ModernBertForColBERT) and model.dimension == 128
    history = [entry["metrics"]["ndcg@10"] for entry in
               json.loads((tmp_path / "run" / "eval_results.json").read_text())["history"]]
    assert len(history) == 3 and history[-1] > history[0]  # it learns the training pairs (dev = train here)
    assert len(load_pipeline(best, "embed-multi-vector")(PAIRS[0][0], role="query")["embeddings"]) == 32
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(p for _, p in PAIRS) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(best), "--input", str(corpus), "--out", str(tmp_path / "mv"),
                 "--multi-vector", "--device", "cpu"]) == 0
    assert "8 texts as " in capsys.readouterr().err
    assert searched(capsys, tmp_path / "mv", PAIRS[6][1])[0] == "7"  # a document finds itself (lines from 1)


def test_modernbert_masked_lm_gives_splade_vectors_trains_embeds_sparse_and_searches(tmp_path, capsys):
    base = tiny_modernbert(tmp_path / "base", ModernBertForMaskedLM)
    pipeline = load_pipeline(base, "embed-sparse", device="cpu")
    assert isinstance(pipeline.model, ModernBertForSparseEmbedding)
    # The reference: the masked LM's own logits, log1p(relu(.)), max over the real tokens.
    mlm = ModernBertForMaskedLM.from_pretrained(base, fast_path=False)
    encoded = pipeline.tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = mlm(encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits
    weights = torch.log1p(torch.relu(logits.masked_fill(~encoded["attention_mask"].bool()[..., None], -1e9))).amax(1)
    for row, answer in zip(weights, pipeline(TEXTS[:3])):
        assert answer["indices"] == torch.nonzero(row).flatten().tolist()
        assert torch.allclose(torch.tensor(answer["values"]), row[row > 0], atol=1e-5)
    data = write_pairs(tmp_path / "train.tsv")
    assert finetune(base, tmp_path / "run", "sparse-pairs", data, lr="1e-4") == 0
    best = tmp_path / "run" / "best"
    config = json.loads((best / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("modernbert", ["ModernBertForMaskedLM"])
    assert [m["type"].rsplit(".", 1)[-1] for m in json.loads((best / "modules.json").read_text())] == [
        "MLMTransformer", "SpladePooling"]
    assert isinstance(load_model(best)[0], ModernBertForSparseEmbedding)
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ndcg@10", "query_terms", "document_terms"} <= set(results["best_metrics"])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(p for _, p in PAIRS) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(best), "--input", str(corpus), "--out", str(tmp_path / "sparse"),
                 "--sparse", "--device", "cpu"]) == 0
    assert "8 sparse vectors" in capsys.readouterr().err
    # The search ranks by the dot product of the trained model's own vectors (lines numbered from 1).
    trained = load_pipeline(best, "embed-sparse", device="cpu")
    dense = [dict(zip(v["indices"], v["values"])) for v in trained([PAIRS[6][1], *(p for _, p in PAIRS)])]
    scores = [sum(w * dense[0].get(t, 0.0) for t, w in row.items()) for row in dense[1:]]
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
    assert searched(capsys, tmp_path / "sparse", PAIRS[6][1]) == [str(i + 1) for i in ranked[:3]]


@pytest.mark.parametrize("markers", [False])
def test_modernbert_colbert_without_marker_tokens_is_refused_before_training(tmp_path, capsys, markers):
    base = tiny_modernbert(tmp_path / "base", ModernBertModel, markers=markers)
    assert finetune(base, tmp_path / "run", "colbert-pairs", write_pairs(tmp_path / "train.tsv")) == 2
    assert "the ColBERT query marker '[unused0]' is not in the vocabulary" in capsys.readouterr().err
    assert not (tmp_path / "run" / "best").exists()
