"""`bertforge finetune` with the embedding formats, as a user runs it: pairs, triplets and the official STS-B
TSV as shipped; the saved model is a sentence-transformers directory that `evaluate` and `predict` read back;
a loss that does not fit the data, or an embedding loss on another family, is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main

STSB = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue" / "STS-B"
PAIRS = [("How old is the universe?", "The universe is about 13.8 billion years old."),
         ("Where do pandas live?", "Giant pandas live in the mountains of central China."),
         ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."),
         ("What is the boiling point of water?", "Water boils at 100 degrees Celsius at sea level."),
         ("How fast is light?", "Light travels at about 300,000 kilometres per second."),
         ("What do bees make?", "Bees make honey from the nectar of flowers."),
         ("Where is the Eiffel Tower?", "The Eiffel Tower stands in Paris, France."),
         ("What is photosynthesis?", "Plants turn light, water and carbon dioxide into sugar.")]


def write_pairs(path: Path, negatives: bool = False) -> Path:
    header = "anchor\tpositive" + ("\tnegative" if negatives else "")
    rows = [f"{a}\t{p}" + (f"\t{PAIRS[(i + 3) % len(PAIRS)][1]}" if negatives else "") for i, (a, p) in enumerate(PAIRS)]
    path.write_text("\n".join([header, *rows * 2]) + "\n", encoding="utf-8")
    return path


def finetune(model: Path, out: Path, *flags: str) -> int:
    return main(["finetune", "--model", str(model), "--out", str(out), "--epochs", "1", "--batch-size", "4",
                 "--lr", "1e-4", *flags])


@pytest.mark.parametrize("fmt, negatives, loss", [("embedding-pairs", False, "mnrl"),
                                                  ("embedding-triplets", True, "cached_mnrl")])
def test_finetune_embedding_pairs_save_a_sentence_transformers_directory(tmp_path, tiny_minilm_model, fmt, negatives,
                                                                         loss):
    data = write_pairs(tmp_path / "train.tsv", negatives)
    flags = ["--format", fmt, "--train", str(data), "--dev", str(data), "--loss", loss, "--pooling", "cls",
             "--normalize", "true"]
    if loss == "cached_mnrl":
        flags += ["--mini-batch-size", "3"]
    assert finetune(tiny_minilm_model, tmp_path / "run", *flags) == 0
    best = tmp_path / "run" / "best"
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "tokenizer.json",
                 "config_sentence_transformers.json", "finetuning.json"):
        assert (best / name).is_file(), name
    pooling = json.loads((best / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    assert [m["type"].rsplit(".", 1)[-1] for m in json.loads((best / "modules.json").read_text())] == \
        ["Transformer", "Pooling", "Normalize"]
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ndcg@10", "mrr@10", "accuracy@1", "recall@10"} <= set(results["best_metrics"])
    # predict reads the directory's own pooling and normalization back.
    source = tmp_path / "texts.txt"
    source.write_text("How old is the universe?\n", encoding="utf-8")
    assert main(["predict", "--model", str(best), "--task", "embed", "--input", str(source),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    vector = json.loads((tmp_path / "out.jsonl").read_text())["embedding"]
    assert sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)


def test_finetune_embedding_reads_the_official_stsb_tsv(tmp_path, tiny_minilm_model):
    if not (STSB / "train.tsv").is_file():
        pytest.skip(f"{STSB} is absent (the shared data is not in a user's clone)")
    assert finetune(tiny_minilm_model, tmp_path / "run", "--format", "embedding-scored", "--train",
                    str(STSB / "train.tsv"), "--dev", str(STSB / "dev.tsv"), "--train-limit", "64",
                    "--dev-limit", "64") == 0
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert set(results["best_metrics"]) == {"spearman_cosine", "pearson_cosine"}
    assert main(["evaluate", "--model", str(tmp_path / "run" / "best"), "--data", str(STSB / "dev.tsv"),
                 "--out", str(tmp_path / "eval")]) == 0


@pytest.mark.parametrize("flags, message", [
    (["--format", "embedding-pairs", "--loss", "cosent"], "loss=cosent needs scored pairs"),
    (["--format", "pair", "--loss", "mnrl"], "--loss (finetune.head.loss) applies to sparse_embedding and embedding"),
])
def test_finetune_embedding_refuses_a_loss_that_cannot_apply(tmp_path, tiny_minilm_model, capsys, flags, message):
    data = write_pairs(tmp_path / "train.tsv")
    if "pair" in flags:
        data.write_text("text_a\ttext_b\tlabel\n" + "a b\tc d\t1\ne f\tg h\t0\n" * 4, encoding="utf-8")
    assert finetune(tiny_minilm_model, tmp_path / "run", *flags, "--train", str(data), "--dev", str(data)) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0]


def test_finetune_embedding_records_matryoshka_dims_for_the_served_dimensions(tmp_path, tiny_minilm_model):
    from bertforge.inference.pipelines import load_pipelines

    data = write_pairs(tmp_path / "train.tsv")
    assert finetune(tiny_minilm_model, tmp_path / "run", "--format", "embedding-pairs", "--train", str(data),
                    "--dev", str(data), "--matryoshka-dims", "16,8") == 0
    best = tmp_path / "run" / "best"
    assert json.loads((best / "finetuning.json").read_text())["matryoshka_dims"] == [16, 8]
    # The embed pipeline (behind OpenAI's and TEI's `dimensions`) reads the widths it may cut to.
    assert load_pipelines(best, ["embed"])["embed"].matryoshka_dims == (16, 8)


def test_finetune_sparse_pairs_with_separate_flops_weights(tmp_path, tiny_sparse_model):
    data = write_pairs(tmp_path / "train.tsv", negatives=True)
    losses = {}
    for name, weights in (("off", ("0", "0")), ("on", ("0.002", "0.001"))):
        assert finetune(tiny_sparse_model, tmp_path / name, "--format", "sparse-triplets", "--train", str(data),
                        "--dev", str(data), "--query-regularizer", weights[0], "--document-regularizer",
                        weights[1]) == 0
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = next(r["values"] for r in rows if r["split"] == "train")
    assert losses["off"]["loss_flops"] == 0.0 and losses["on"]["loss_flops"] > 0.0
    best = tmp_path / "on" / "best"
    results = json.loads((tmp_path / "on" / "eval_results.json").read_text())
    assert {"ndcg@10", "mrr@10", "query_terms", "document_terms"} <= set(results["best_metrics"])
    modules = json.loads((best / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules][-1] == "SpladePooling"


def test_finetune_embedding_margins_train_margin_mse_and_report_retrieval(tmp_path, tiny_minilm_model, capsys):
    rows = [f"{a}\t{p}\t{PAIRS[(i + 3) % len(PAIRS)][1]}\t{0.5 + 0.05 * i}" for i, (a, p) in enumerate(PAIRS)]
    data = tmp_path / "margins.tsv"
    data.write_text("anchor\tpositive\tnegative\tmargin\n" + "\n".join(rows * 2) + "\n", encoding="utf-8")
    assert finetune(tiny_minilm_model, tmp_path / "run", "--format", "embedding-margins", "--train", str(data),
                    "--dev", str(data)) == 0
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ndcg@10", "mrr@10", "accuracy@1", "recall@10"} == set(results["best_metrics"])
    assert finetune(tiny_minilm_model, tmp_path / "run2", "--format", "embedding-margins", "--train", str(data),
                    "--dev", str(data), "--loss", "mnrl") == 2
    assert "loss=mnrl needs pairs or triplets, but the data has scored triplets; use margin_mse" in \
        capsys.readouterr().err


def test_finetune_embedding_scores_train_kl_on_several_negatives(tmp_path, tiny_minilm_model, capsys):
    n = len(PAIRS)
    rows = [f"{a}\t{p}\t{PAIRS[(i + 3) % n][1]}\t{PAIRS[(i + 5) % n][1]}\t{2.0 + 0.1 * i}\t-1.0\t0.5"
            for i, (a, p) in enumerate(PAIRS)]
    data = tmp_path / "scores.tsv"
    data.write_text("anchor\tpositive\tnegative\tnegative_2\tpositive_score\tnegative_score\tnegative_2_score\n"
                    + "\n".join(rows * 2) + "\n", encoding="utf-8")
    flags = ["--format", "embedding-scores", "--train", str(data), "--dev", str(data),
             "--data.negative_column=negative,negative_2"]
    assert finetune(tiny_minilm_model, tmp_path / "run", *flags, "--label",
                    "positive_score,negative_score,negative_2_score", "--head.teacher_temperature=2") == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["values"] for r in metrics if r["split"] == "train"]
    assert train and all(v["loss"] >= 0 for v in train)  # a KL divergence
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert {"ndcg@10", "mrr@10", "accuracy@1", "recall@10"} == set(results["best_metrics"])
    assert finetune(tiny_minilm_model, tmp_path / "run2", *flags) == 2  # two score columns for three candidates
    assert "2 score columns ['positive_score', 'negative_score'] for 3 candidates" in capsys.readouterr().err
    assert finetune(tiny_minilm_model, tmp_path / "run3", *flags, "--label",
                    "positive_score,negative_score,negative_2_score", "--loss", "margin_mse") == 2
    assert "use kl" in capsys.readouterr().err
