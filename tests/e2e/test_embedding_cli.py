"""`bertforge retrieval-set` and `bertforge evaluate-embeddings` end to end: a BEIR folder and training pairs
from a SQuAD-format file, then STS, retrieval and paraphrase figures of a small model, written as JSON; a
user mistake is exit status 2 with a one-line message."""

from __future__ import annotations

import json

import pytest

from bertforge.cli import main
from bertforge.data.retrieval import read_beir, read_train_pairs

ARTICLES = [
    ("Cats", ["Cats purr when they are content.", "A cat sleeps most of the day."]),
    ("Rivers", ["The Nile flows north into the sea.", "Rivers carry sand to their deltas."]),
    ("Music", ["A violin has four strings.", "Drums keep the beat of a song."]),
    ("Space", ["The Moon orbits the Earth.", "Mars is called the red planet."]),
]


@pytest.fixture
def squad_json(tmp_path):
    data = [{"title": title, "paragraphs": [{"context": context, "qas": [
        {"id": f"{title}-{p}-{q}", "question": f"question {q} about {context.split()[1]}?",
         "answers": [{"text": context.split()[0], "answer_start": 0}]} for q in range(2)]}
        for p, context in enumerate(contexts)]} for title, contexts in ARTICLES]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bertforge {command}: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_retrieval_set_cli_writes_beir_folder_and_train_pairs(squad_json, tmp_path, capsys):
    out, pairs = tmp_path / "beir", tmp_path / "train_pairs.tsv"
    assert main(["retrieval-set", "--squad", str(squad_json), "--out", str(out), "--eval-fraction", "0.5",
                 "--seed", "3", "--train-pairs", str(pairs)]) == 0
    printed = capsys.readouterr().out
    beir = read_beir(out)
    assert f"{len(beir.corpus_ids)} documents, {len(beir.query_ids)} queries" in printed
    assert len(beir.corpus_ids) == 8 and len(beir.query_ids) == 8  # two of four articles held out
    train = read_train_pairs(pairs)
    assert f"{len(train)} training pairs" in printed and len(train) == 8
    assert pairs.read_text(encoding="utf-8").startswith("anchor\tpositive\n")
    held = {text for doc_id, text in zip(beir.corpus_ids, beir.corpus_texts)
            if any(doc_id in docs for docs in beir.qrels.values())}
    assert not held & {positive for _, positive in train}


def test_retrieval_set_cli_user_mistakes_exit_2_with_one_line(squad_json, tmp_path, capsys):
    assert main(["retrieval-set", "--squad", str(squad_json), "--out", str(tmp_path / "b"), "--train-pairs",
                 str(tmp_path / "p.tsv")]) == 2
    assert "--train-pairs needs --eval-fraction" in one_line_error(capsys, "retrieval-set")
    assert main(["retrieval-set", "--squad", str(tmp_path / "missing.json"), "--out", str(tmp_path / "b")]) == 2
    assert "missing.json: file not found" in one_line_error(capsys, "retrieval-set")
    assert main(["retrieval-set", "--squad", str(squad_json), "--out", str(tmp_path / "b"), "--eval-fraction",
                 "2"]) == 2
    assert "eval_fraction must be in (0, 1]" in one_line_error(capsys, "retrieval-set")
    assert not (tmp_path / "b").exists()


@pytest.fixture
def pair_files(tmp_path):
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{a}\t{b}\t{s}\n" for a, b, s in [("A cat purrs.", "A cat is purring.", 4.8), ("A man runs.", "The sky.", 0.2),
                                           ("Drums play.", "A drum is played.", 4.0), ("Mars.", "A violin.", 1.0)]),
        encoding="utf-8")
    paraphrase = tmp_path / "pairs.csv"
    paraphrase.write_text("question1,question2,is_duplicate\n" + "".join(
        f"{a},{b},{y}\n" for a, b, y in [("how to cook rice?", "how do I cook rice?", 1),
                                         ("what is a cat?", "where is Mars?", 0),
                                         ("how to fix a bike?", "how do I repair a bike?", 1),
                                         ("who wrote it?", "how tall is it?", 0)]), encoding="utf-8")
    return sts, paraphrase


def test_evaluate_embeddings_cli_writes_figures_of_each_kind(tiny_minilm_model, squad_json, pair_files, tmp_path,
                                                             capsys):
    beir = tmp_path / "beir"
    assert main(["retrieval-set", "--squad", str(squad_json), "--out", str(beir)]) == 0
    sts, paraphrase = pair_files
    expected = {"--retrieval": ("retrieval", beir, {"ndcg@10", "mrr@10", "map@100", "recall@100", "accuracy@1"}),
                "--sts": ("sts", sts, {"pearson_cosine", "spearman_cosine"}),
                "--paraphrase": ("paraphrase", paraphrase, {"cosine_ap", "cosine_f1", "cosine_accuracy"})}
    for flag, (kind, path, names) in expected.items():
        out = tmp_path / f"{kind}.json"
        capsys.readouterr()
        assert main(["evaluate-embeddings", "--model", str(tiny_minilm_model), flag, str(path), "--out", str(out),
                     "--device", "cpu", "--batch-size", "4"]) == 0
        written = json.loads(out.read_text(encoding="utf-8"))
        assert written["task"] == kind and names <= set(written["metrics"])
        assert all(isinstance(v, float) for v in written["metrics"].values())
        printed = capsys.readouterr().out
        assert all(f"{name}: " in printed for name in names)
    assert json.loads((tmp_path / "retrieval.json").read_text())["queries"] == 16
    assert json.loads((tmp_path / "sts.json").read_text())["pairs"] == 4


def test_evaluate_embeddings_cli_reranks_with_a_cross_encoder(tiny_minilm_model, squad_json, tmp_path, capsys):
    import torch

    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.tokenization import Tokenizer
    from conftest import make_tiny_config

    tokenizer = Tokenizer.from_pretrained(tiny_minilm_model)
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=128).with_labels(["LABEL_0"])
    BertForSequenceClassification(config).save_pretrained(tmp_path / "ce", tokenizer=tokenizer)
    assert main(["retrieval-set", "--squad", str(squad_json), "--out", str(tmp_path / "beir")]) == 0
    out = tmp_path / "figures.json"
    assert main(["evaluate-embeddings", "--model", str(tiny_minilm_model), "--retrieval", str(tmp_path / "beir"),
                 "--rerank-model", str(tmp_path / "ce"), "--rerank-depth", "5", "--device", "cpu",
                 "--out", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["metrics"]
    assert {"ndcg@10", "rerank_ndcg@10", "rerank_recall@100"} <= set(figures)
    # Re-ranking reorders documents, it finds no new ones: all 8 are within the first 100 either way.
    assert figures["rerank_recall@100"] == figures["recall@100"]
    capsys.readouterr()
    assert main(["evaluate-embeddings", "--model", str(tiny_minilm_model), "--sts", str(out),
                 "--rerank-model", str(tmp_path / "ce")]) == 2
    assert "use it with --retrieval" in one_line_error(capsys, "evaluate-embeddings")


def test_evaluate_embeddings_cli_sparse_and_hybrid_figures(tiny_sparse_model, tiny_minilm_model, squad_json,
                                                             tmp_path, capsys):
    beir = tmp_path / "beir"
    assert main(["retrieval-set", "--squad", str(squad_json), "--out", str(beir)]) == 0
    out = tmp_path / "sparse.json"
    assert main(["evaluate-embeddings", "--model", str(tiny_sparse_model), "--retrieval", str(beir), "--max-terms",
                 "32", "--device", "cpu", "--out", str(out)]) == 0  # a SparseEncoder directory: sparse figures
    figures = json.loads(out.read_text(encoding="utf-8"))["metrics"]
    assert {"ndcg@10", "mrr@10"} <= set(figures) and figures["query_terms"] == figures["document_terms"] == 32
    assert main(["evaluate-embeddings", "--model", str(tiny_minilm_model), "--retrieval", str(beir),
                 "--hybrid-model", str(tiny_sparse_model), "--rrf-k", "30", "--device", "cpu", "--out", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["metrics"]
    assert {f"{kind}_ndcg@10" for kind in ("dense", "sparse", "hybrid")} <= set(figures)
    assert figures["sparse_query_terms"] > 32  # unpruned
    capsys.readouterr()
    assert main(["evaluate-embeddings", "--model", str(tiny_sparse_model), "--retrieval", str(beir),
                 "--rerank-model", str(tiny_minilm_model), "--device", "cpu"]) == 2
    assert "is a sparse model; --rerank-model" in one_line_error(capsys, "evaluate-embeddings")
    assert main(["evaluate-embeddings", "--model", str(tiny_minilm_model), "--sts", str(out), "--sparse"]) == 2
    assert "--sparse evaluates retrieval" in one_line_error(capsys, "evaluate-embeddings")


def test_evaluate_embeddings_cli_user_mistakes_exit_2_with_one_line(tiny_minilm_model, tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\thigh\n", encoding="utf-8")
    # The data is read first: a bad file is reported before (and without) loading the model.
    assert main(["evaluate-embeddings", "--model", str(tmp_path / "no_model"), "--sts", str(bad)]) == 2
    assert "bad.tsv:3: label 'high' is not a number" in one_line_error(capsys, "evaluate-embeddings")
    assert main(["evaluate-embeddings", "--model", str(tmp_path / "no_model"), "--retrieval", str(tmp_path)]) == 2
    assert "corpus.jsonl: not found" in one_line_error(capsys, "evaluate-embeddings")
    good = tmp_path / "good.tsv"
    good.write_text("sentence1\tsentence2\tscore\na\tb\t1\nc\td\t2\n", encoding="utf-8")
    assert main(["evaluate-embeddings", "--model", str(tmp_path / "no_model"), "--sts", str(good)]) == 2
    one_line_error(capsys, "evaluate-embeddings")
    assert main(["evaluate-embeddings", "--model", str(tiny_minilm_model), "--paraphrase", str(good),
                 "--device", "cpu"]) == 2
    assert "is not a 0/1 pair label" in one_line_error(capsys, "evaluate-embeddings")


def test_evaluate_embeddings_cli_needs_exactly_one_data_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate-embeddings", "--model", "m", "--sts", "a.tsv", "--paraphrase", "b.tsv"])
    assert exit_info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate-embeddings", "--model", "m"])
    assert "one of the arguments --retrieval --sts --paraphrase is required" in capsys.readouterr().err
