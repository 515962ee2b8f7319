"""ColBERT distillation from a cross-encoder's scores (`finetune --format colbert-distill`): PyLate's KL loss
(softmax of the teacher's scores against the softmax of the student's min-max normalised MaxSim scores per
query) through the one training loop; the lists file `score-margins --output-format lists` writes with a
bertforge cross-encoder; bad lines refused naming file, line and field."""

from __future__ import annotations

import json
import re

import pytest
import torch
from tests.e2e.test_finetune_embedding import PAIRS

from bertforge.cli import main
from bertforge.families.colbert import BertForColBERT, ColbertObjective, GroupVectors, distillation_loss
from bertforge.families.registry import load_model
from conftest import make_tiny_config


def pylate_distillation(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """PyLate's `Distillation` loss as its source defines it (normalize_scores=True, size_average=True)."""
    low, high = student.min(1, keepdim=True).values, student.max(1, keepdim=True).values
    student = (student - low) / (high - low + 1e-8)
    kl = torch.nn.KLDivLoss(reduction="batchmean", log_target=True)
    return kl(torch.log_softmax(student, -1), torch.log_softmax(teacher, -1))


def group(batch: int = 3, documents: int = 4, seed: int = 0) -> GroupVectors:
    torch.manual_seed(seed)
    queries = torch.nn.functional.normalize(torch.randn(batch, 5, 8), dim=-1)
    docs = torch.nn.functional.normalize(torch.randn(batch * documents, 6, 8), dim=-1)
    scored = torch.rand(batch * documents, 6) > 0.3
    scored[:, 0] = True
    return GroupVectors(queries, torch.ones(batch, 5, dtype=torch.bool), docs, scored)


def test_colbert_own_scores_are_each_querys_block_of_the_batch_scores():
    output = group()
    full = output.scores()  # [3, 12]
    expected = torch.stack([full[b, 4 * b:4 * b + 4] for b in range(3)])
    assert torch.allclose(output.own_scores(), expected, atol=1e-5)


def test_colbert_distillation_is_pylates_kl_over_normalised_maxsim():
    output = group()
    teacher = torch.tensor([[3.0, -1.0, 0.5, 2.0], [0.1, 0.2, 0.3, 0.4], [-5.0, 4.0, 1.0, 0.0]])

    class Batch:
        input_ids = torch.zeros(3, 5, 7, dtype=torch.long)
        labels = teacher

    objective = ColbertObjective()
    loss, count = objective.loss_terms(output, Batch())["contrastive"]
    expected = pylate_distillation(output.own_scores(), teacher)
    assert (loss / count).item() == pytest.approx(expected.item(), abs=1e-6) and count.item() == 3
    correct, total = objective.metrics(output, Batch())["accuracy"]
    student = output.own_scores().argmax(-1)
    assert correct.item() == (student == teacher.argmax(-1)).sum().item() and total.item() == 3


def test_colbert_distillation_leaves_a_shorter_lists_padding_out():
    student = torch.tensor([[1.0, 3.0, 2.0], [0.5, 1.5, 9.0]])
    teacher = torch.tensor([[2.0, 1.0, 0.0], [1.0, 4.0, float("nan")]])  # the second list has two documents
    loss, correct = distillation_loss(student, teacher)
    expected = pylate_distillation(student[:1], teacher[:1]) + pylate_distillation(student[1:, :2], teacher[1:, :2])
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert correct.item() == 1  # the first query's best student document (1) is not the teacher's (0)


def write_lists(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def lists_of_pairs() -> list[dict]:
    positives = [p for _, p in PAIRS]
    return [{"query": q, "documents": [p, positives[(i + 1) % len(PAIRS)], positives[(i + 2) % len(PAIRS)]],
             "scores": [4.0, -1.0 + 0.5 * i, -2.0]} for i, (q, p) in enumerate(PAIRS)]


def test_finetune_colbert_distill_from_a_plain_bert_learns_the_teachers_order(tmp_path, tiny_minilm_model):
    data = write_lists(tmp_path / "distill.jsonl", lists_of_pairs())
    assert main(["finetune", "--model", str(tiny_minilm_model), "--out", str(tmp_path / "run"), "--epochs", "4",
                 "--batch-size", "2", "--lr", "1e-3", "--format", "colbert-distill", "--train", data,
                 "--dev", data]) == 0
    best = tmp_path / "run" / "best"
    model, _ = load_model(best)
    assert isinstance(model, BertForColBERT)
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    history = [entry["metrics"]["mrr@10"] for entry in results["history"]]
    assert len(history) == 4 and max(history) > history[0]  # the teacher's best document rises (dev = train)
    assert results["config"]["data"]["format"] == "colbert-distill"


@pytest.mark.parametrize("row, message", [
    ({"query": "q?", "documents": ["a", "b"], "scores": [1.0]}, r"distill.jsonl:2.*1 scores for 2 documents"),
    ({"query": "q?", "documents": ["a", "b"], "scores": [1.0, "high"]}, r"distill.jsonl:2.*scores\[1\] = 'high'"),
    ({"query": "q?", "documents": ["a"], "scores": [1.0]}, r"distill.jsonl:2.*at least two documents"),
    ({"query": "", "documents": ["a", "b"], "scores": [1.0, 0.0]}, r"distill.jsonl:2.*'query' must be a non-empty"),
    ({"query": "q?", "documents": ["a", ""], "scores": [1.0, 0.0]}, r"distill.jsonl:2.*documents\[1\]"),
])
def test_finetune_colbert_distill_names_the_bad_line_and_field(tmp_path, tiny_minilm_model, row, message, capsys):
    good = {"query": "who?", "documents": ["he", "she"], "scores": [-3.5, -4.0]}  # logits may all be negative
    data = write_lists(tmp_path / "distill.jsonl", [good, row])
    assert main(["finetune", "--model", str(tiny_minilm_model), "--out", str(tmp_path / "run"), "--format",
                 "colbert-distill", "--train", data, "--no-dev"]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run" / "final").exists()  # refused before training


def test_finetune_colbert_distill_needs_json_lines(tmp_path, tiny_minilm_model, capsys):
    data = tmp_path / "distill.tsv"
    data.write_text("query\tdocuments\tscores\nq\ta\t1\n", encoding="utf-8")
    assert main(["finetune", "--model", str(tiny_minilm_model), "--out", str(tmp_path / "run"), "--format",
                 "colbert-distill", "--train", str(data), "--no-dev"]) == 2
    assert "JSON Lines" in capsys.readouterr().err


def test_score_margins_writes_the_lists_colbert_distill_trains_on(tmp_path, tiny_minilm_model, capsys):
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.tokenization import Tokenizer

    triplets = tmp_path / "triplets.tsv"  # two negatives per pair, one row each (as mine-negatives writes them)
    positives = [p for _, p in PAIRS]
    rows = [(q, p, positives[(i + k) % len(PAIRS)]) for i, (q, p) in enumerate(PAIRS) for k in (1, 2)]
    triplets.write_text("anchor\tpositive\tnegative\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    tokenizer = Tokenizer.from_pretrained(tiny_minilm_model)
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=tokenizer.vocab_size, max_position_embeddings=128)
    BertForSequenceClassification(config.with_labels(["LABEL_0"])).save_pretrained(tmp_path / "ce",
                                                                                    tokenizer=tokenizer)
    lists = tmp_path / "distill.jsonl"
    assert main(["score-margins", "--model", str(tmp_path / "ce"), "--triplets", str(triplets), "--out", str(lists),
                 "--output-format", "lists", "--device", "cpu"]) == 0
    written = [json.loads(line) for line in lists.read_text(encoding="utf-8").splitlines()]
    assert [(w["query"], w["documents"]) for w in written] == [
        (q, [p, positives[(i + 1) % len(PAIRS)], positives[(i + 2) % len(PAIRS)]]) for i, (q, p) in enumerate(PAIRS)]
    from bertforge.inference.pipelines import load_pipeline

    reranker = load_pipeline(tmp_path / "ce", "rerank", device="cpu")
    first = reranker({"query": written[0]["query"], "texts": written[0]["documents"]})["results"]
    logits = {item["index"]: item["logit"] for item in first}
    assert written[0]["scores"] == pytest.approx([logits[i] for i in range(3)], abs=1e-5)  # the teacher's logits
    assert "train a ColBERT model with --format colbert-distill" in capsys.readouterr().err
    assert main(["finetune", "--model", str(tiny_minilm_model), "--out", str(tmp_path / "run"), "--epochs", "1",
                 "--batch-size", "2", "--format", "colbert-distill", "--train", str(lists), "--no-dev"]) == 0
    assert main(["score-margins", "--model", str(tmp_path / "ce"), "--triplets", str(triplets), "--out",
                 str(tmp_path / "lists.tsv"), "--output-format", "lists"]) == 2
    assert "name the file .jsonl" in capsys.readouterr().err
