"""A ModernBERT directory (config.json with model_type modernbert, model.safetensors, a byte-level BPE
tokenizer.json trained here) served end to end: the embed pipeline loads it through the family registry,
tokenizes it with the tokenizers library and runs it on the torch fp32 engine (`build_engine`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge.checkpoint_format import load_tokenizer
from bertforge.engine.engine import TorchEngine
from bertforge.inference.pipelines import load_pipeline
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertModel
from bertforge.tokenization.tokenizer_json import train_bpe

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Naive cafe owners serve creme brulee daily!"] * 30


def test_modernbert_directory_embeds_through_the_pipeline_and_engine(tmp_path):
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              local_attention=8, max_position_embeddings=512)
    torch.manual_seed(0)
    ModernBertModel(config).save_pretrained(tmp_path, tokenizer=tokenizer)
    pipeline = load_pipeline(tmp_path, "embed")
    assert isinstance(pipeline.engine, TorchEngine) and pipeline.engine.precision == "fp32"
    texts = ["The quick brown fox", "daily creme brulee " * 20]  # the second is longer than the local window
    vectors = np.asarray([answer["embedding"] for answer in pipeline(texts)])
    # The reference: the plain padded model, mean over the real tokens.
    model = ModernBertModel.from_pretrained(tmp_path, fast_path=False)
    inputs = load_tokenizer(tmp_path)(texts, padding=True, return_tensors="pt")
    assert inputs["input_ids"].shape[1] > config.local_attention
    with torch.no_grad():
        hidden = model(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    mask = inputs["attention_mask"][..., None].float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


def test_modernbert_directory_finetunes_predicts_and_embeds_through_the_cli(tmp_path):
    from bertforge.cli import main
    from bertforge.model.modernbert import ModernBertForMaskedLM, ModernBertForSequenceClassification

    rows = ["text_a\tlabel"] + [f"{'good' if i % 2 else 'bad'} day number {i}\t{'pos' if i % 2 else 'neg'}"
                                for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\n".join(rows[:11]) + "\n", encoding="utf-8")
    tokenizer = train_bpe([row.split("\t")[0] for row in rows] * 5, vocab_size=300)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              local_attention=8, max_position_embeddings=512)
    torch.manual_seed(0)
    ModernBertForMaskedLM(config).save_pretrained(tmp_path / "base", tokenizer=tokenizer)
    assert main(["finetune", "--format", "classification", "--train", str(tmp_path / "train.tsv"), "--dev",
                 str(tmp_path / "dev.tsv"), "--text-a", "text_a", "--label", "label", "--model",
                 str(tmp_path / "base"), "--out", str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "8",
                 "--device", "cpu", "--max-seq-length", "16", "--progress=false"]) == 0
    best = tmp_path / "ft" / "best"
    saved = json.loads((best / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForSequenceClassification"]
    texts = ["good day number 3", "bad day"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    for task in ("classify", "embed"):
        assert main(["predict", "--model", str(best), "--task", task, "--input", str(tmp_path / "in.txt"),
                     "--output", str(tmp_path / f"{task}.jsonl"), "--device", "cpu", "--precision", "fp32"]) == 0
    answers = [json.loads(line) for line in (tmp_path / "classify.jsonl").read_text().splitlines()]
    # The CLI's scores are the saved model's own: [CLS] text [SEP], softmax over its logits.
    model = ModernBertForSequenceClassification.from_pretrained(best, fast_path=False)
    for text, answer in zip(texts, answers):
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            probabilities = model(ids).logits.softmax(-1)[0]
        np.testing.assert_allclose([answer["scores"][name] for name in model.config.label_names], probabilities.numpy(),
                                   atol=1e-5)
    vectors = [json.loads(line)["embedding"] for line in (tmp_path / "embed.jsonl").read_text().splitlines()]
    assert np.asarray(vectors).shape == (2, config.hidden_size)
    # The masked-LM directory it started from fills masks (its own task), scored by its MLM head.
    answer = load_pipeline(tmp_path / "base")(["good day [MASK] 3"])[0]
    mask = answer["masks"][0]
    assert (mask["start"], mask["end"]) == (9, 15) and len(mask["predictions"]) == 5
    base = ModernBertForMaskedLM.from_pretrained(tmp_path / "base", fast_path=False)
    ids = [tokenizer.cls_token_id, *tokenizer.encode("good day ", add_special_tokens=False).ids]
    position = len(ids)
    ids += [tokenizer.mask_token_id, *tokenizer.encode(" 3", add_special_tokens=False).ids, tokenizer.sep_token_id]
    with torch.no_grad():
        logits = base(torch.tensor([ids])).logits[0, position]
    logits[tokenizer.all_special_ids] = float("-inf")
    best = logits.softmax(-1).topk(5)
    assert [p["id"] for p in mask["predictions"]] == best.indices.tolist()
    np.testing.assert_allclose([p["score"] for p in mask["predictions"]], best.values.numpy(), atol=1e-5)


def test_modernbert_directory_finetunes_a_tagger_whose_entities_have_character_offsets(tmp_path):
    from bertforge.cli import main
    from bertforge.model.modernbert import ModernBertForMaskedLM

    names = ["Ana", "Rui", "Marta", "Paris", "Lisbon"]
    blocks = [f"{names[i % 5]} B-PER\nvisited O\n{names[(i + 2) % 5]} B-LOC\ntoday O" for i in range(40)]
    (tmp_path / "train.txt").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("\n\n".join(blocks[:8]) + "\n", encoding="utf-8")
    tokenizer = train_bpe([block.replace("\n", " ") for block in blocks], vocab_size=300)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              local_attention=8, max_position_embeddings=512)
    torch.manual_seed(0)
    ModernBertForMaskedLM(config).save_pretrained(tmp_path / "base", tokenizer=tokenizer)
    assert main(["finetune", "--format", "ner", "--train", str(tmp_path / "train.txt"), "--dev",
                 str(tmp_path / "dev.txt"), "--model", str(tmp_path / "base"), "--out", str(tmp_path / "ft"),
                 "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--max-seq-length", "16",
                 "--progress=false"]) == 0
    saved = json.loads((tmp_path / "ft" / "best" / "config.json").read_text())
    assert saved["architectures"] == ["ModernBertForTokenClassification"]
    text = "Ana visited Lisbon today"
    (tmp_path / "in.txt").write_text(text + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(tmp_path / "ft" / "best"), "--task", "tag", "--input",
                 str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.jsonl"), "--device", "cpu"]) == 0
    answer = json.loads((tmp_path / "out.jsonl").read_text())
    assert len(answer["tags"]) == 4  # one tag per word
    starts, ends = {0, 4, 12, 19}, {3, 11, 18, 24}  # entities begin and end on word boundaries
    assert all(e["start"] in starts and e["end"] in ends and text[e["start"]:e["end"]] == e["text"]
               for e in answer["entities"])


def test_modernbert_directory_predicts_embeds_and_serves_on_every_engine(tmp_path, monkeypatch):
    """`predict --task classify|embed` at int8 and bf16 (torch) and on ONNX Runtime, and `serve --engine
    onnxruntime`, on a ModernBERT classifier directory: every answer within the BERT engine tests' budgets
    of the fp32 torch answer (tests/unit/test_engine.py: `TOLERANCES`, `REDUCED_MIN_COSINE`), the labels equal."""
    pytest.importorskip("onnxruntime")
    from tests.e2e.test_server import running
    from tests.unit.test_engine import REDUCED_MIN_COSINE, TOLERANCES

    from bertforge.cli import main
    from bertforge.model.modernbert import ModernBertForSequenceClassification
    from bertforge.serving.app import create_app

    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              local_attention=8, max_position_embeddings=512, id2label={0: "neg", 1: "pos"})
    torch.manual_seed(0)
    ModernBertForSequenceClassification(config).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    texts = ["The quick brown fox", "daily creme brulee " * 20, "lazy dog"]  # one longer than the window
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")

    def predicted(task: str, *flags: str) -> list[dict]:
        out = tmp_path / f"{task}{'_'.join(flags)}.jsonl"
        assert main(["predict", "--model", str(tmp_path / "model"), "--task", task, "--input",
                     str(tmp_path / "in.txt"), "--output", str(out), "--device", "cpu", *flags]) == 0
        return [json.loads(line) for line in out.read_text().splitlines()]

    def assert_within(got: np.ndarray, expected: np.ndarray, precision: str) -> None:
        assert np.abs(got - expected).max() <= TOLERANCES[precision] * max(1.0, np.abs(expected).max())
        if precision != "fp32":
            cosine = (got.ravel() @ expected.ravel()) / (np.linalg.norm(got) * np.linalg.norm(expected))
            assert cosine >= REDUCED_MIN_COSINE

    reference = {"classify": predicted("classify", "--engine", "torch", "--precision", "fp32"),
                 "embed": predicted("embed", "--engine", "torch", "--precision", "fp32")}
    scores = np.array([[a["scores"][n] for n in ("neg", "pos")] for a in reference["classify"]])
    vectors = np.array([a["embedding"] for a in reference["embed"]])
    for engine, precision in (("torch", "int8"), ("torch", "bf16"), ("onnxruntime", "fp32"), ("onnxruntime", "int8")):
        flags = ("--engine", engine, "--precision", precision)
        answers = predicted("classify", *flags)
        assert [a["label"] for a in answers] == [a["label"] for a in reference["classify"]]
        assert_within(np.array([[a["scores"][n] for n in ("neg", "pos")] for a in answers]), scores, precision)
        assert_within(np.array([a["embedding"] for a in predicted("embed", *flags)]), vectors, precision)

    app = create_app(tmp_path / "model", device="cpu", precision="fp32", engine="onnxruntime")
    with running(app) as client:
        response = client.post("/v1/classify", json={"inputs": texts})
        assert response.status_code == 200
        served = np.array([[o["scores"][n] for n in ("neg", "pos")] for o in response.json()["outputs"]])
        health = client.get("/health").json()
    assert_within(served, scores, "fp32")
    assert "onnxruntime" in json.dumps(health)


def tiny_modernbert(folder, texts, cls=None, **fields):
    """A tiny random ModernBERT directory (a byte-level BPE tokenizer.json trained on `texts`) of class `cls`."""
    from bertforge.model.modernbert import ModernBertForMaskedLM

    tokenizer = train_bpe(list(texts) * 5, vocab_size=300)
    config = ModernBertConfig(**{"vocab_size": tokenizer.vocab_size, "hidden_size": 32, "intermediate_size": 48,
                                 "num_hidden_layers": 3, "num_attention_heads": 2, "local_attention": 8,
                                 "pad_token_id": tokenizer.pad_token_id, "cls_token_id": tokenizer.cls_token_id,
                                 "sep_token_id": tokenizer.sep_token_id, "max_position_embeddings": 512, **fields})
    torch.manual_seed(0)
    (cls or ModernBertForMaskedLM)(config).save_pretrained(folder, tokenizer=tokenizer)
    return tokenizer


def test_modernbert_finetune_refuses_a_window_past_its_positions_before_loading(tmp_path, monkeypatch, capsys):
    from bertforge.cli import main
    from bertforge.families import registry
    from bertforge.families.classification import FAMILY

    rows = ["text_a\tlabel"] + [f"day {i}\t{'pos' if i % 2 else 'neg'}" for i in range(20)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    tiny_modernbert(tmp_path / "base", [row.split("\t")[0] for row in rows])
    calls = []
    monkeypatch.setattr(registry, "load_model", lambda *a, **k: calls.append("model") or (_ for _ in ()).throw(
        AssertionError("the model loaded before the window was refused")))
    monkeypatch.setattr(FAMILY, "features", lambda *a, **k: calls.append("features") or [])
    code = main(["finetune", "--format", "classification", "--train", str(tmp_path / "train.tsv"), "--model",
                 str(tmp_path / "base"), "--out", str(tmp_path / "ft"), "--device", "cpu", "--max-seq-length",
                 "600", "--no-dev", "--progress=false"])
    assert code != 0 and calls == []  # neither the features nor the model were made
    assert "max_seq_length=600 exceeds the model's max_position_embeddings=512" in capsys.readouterr().err


@pytest.mark.parametrize("marker", ["[MASK]", "<mask>"])
def test_modernbert_fill_mask_reads_the_mask_as_transformers_does(tmp_path, marker):
    """ModernBERT's mask token takes the space before it (tokenizer.json's lstrip): "Paris is the [MASK]." is
    [CLS] Paris Ġis Ġthe [MASK] . [SEP] in transformers, not ... Ġthe Ġ [MASK]; a RoBERTa-style "<mask>" alike."""
    import dataclasses

    import tokenizers

    from bertforge.families.pretraining import FAMILY
    from bertforge.model.modernbert import ModernBertForMaskedLM
    from bertforge.tokenization.tokenizer_json import JsonTokenizer

    transformers = pytest.importorskip("transformers")
    trained = train_bpe(["Paris is the capital of France.", "Lisbon is the capital of Portugal."] * 20, vocab_size=300)
    data = json.loads(trained.backend.to_str())
    for added in data["added_tokens"]:
        if added["content"] == "[MASK]":
            added.update(content=marker, lstrip=True)
    data["model"]["vocab"][marker] = data["model"]["vocab"].pop("[MASK]")
    tokenizer = JsonTokenizer(tokenizers.Tokenizer.from_str(json.dumps(data)),
                              dataclasses.replace(trained.config, mask_token=marker))
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                              bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                              local_attention=8, max_position_embeddings=512)
    torch.manual_seed(0)
    ModernBertForMaskedLM(config).save_pretrained(tmp_path, tokenizer=tokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = [f"Paris is the {marker}.", f"The capital   {marker}  of {marker} France", f"{marker} is Lisbon"]
    features = FAMILY.features(texts, load_tokenizer(tmp_path), load_pipeline(tmp_path, "fill-mask").settings,
                               config=config)
    for text, feature in zip(texts, features):
        expected = theirs(text)["input_ids"]
        assert feature.input_ids == expected, (text, theirs.convert_ids_to_tokens(expected))
        assert [feature.input_ids[p] for p in feature.mask_positions] == [tokenizer.mask_token_id] * text.count(marker)
    # The answers are the model's at transformers' ids: the first text's mask scored as transformers' model does.
    answer = load_pipeline(tmp_path, "fill-mask")([texts[0]])[0]["masks"][0]
    assert (answer["start"], answer["end"]) == (13, 13 + len(marker))
    model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    ids = theirs(texts[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, ids[0].tolist().index(tokenizer.mask_token_id)]
    logits[tokenizer.all_special_ids] = float("-inf")
    best = logits.softmax(-1).topk(5)
    assert [p["id"] for p in answer["predictions"]] == best.indices.tolist()
    np.testing.assert_allclose([p["score"] for p in answer["predictions"]], best.values.numpy(), atol=1e-5)


def test_modernbert_embeds_a_long_text_in_one_window_of_its_own_length(tmp_path):
    """A directory without a fine-tuning record: BERT's window is 512 (its positions), a ModernBERT's its own
    (here 2,048); a text past it is cut to one window, as every embed text is."""
    from bertforge.model.modernbert import ModernBertModel

    sentence = "the quick brown fox jumps over the lazy dog near the river bank"
    tokenizer = tiny_modernbert(tmp_path, [sentence], cls=ModernBertModel, max_position_embeddings=2048)
    pipeline = load_pipeline(tmp_path, "embed")
    assert pipeline.max_length == 2048
    long = " ".join([sentence] * 80)  # past 512 tokens, within 2,048
    longer = " ".join([sentence] * 300)  # past 2,048
    assert 512 < len(tokenizer.encode(long).ids) < 2048 < len(tokenizer.encode(longer).ids)
    (got, cut), = [pipeline.features([long, longer])]
    assert len(got.input_ids) == len(tokenizer.encode(long).ids) and len(cut.input_ids) == 2048
    vector = np.asarray(pipeline([long])[0]["embedding"])
    model = ModernBertModel.from_pretrained(tmp_path, fast_path=False)
    with torch.no_grad():
        expected = model(torch.tensor([tokenizer.encode(long).ids])).last_hidden_state[0].mean(0).numpy()
    np.testing.assert_allclose(vector, expected, atol=1e-5)
