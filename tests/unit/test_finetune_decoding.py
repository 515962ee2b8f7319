"""Decoding model outputs back to what the data speaks: averaged window logits (classification, multiple
choice), word tags from max-context windows, entities in character offsets, SQuAD n-best answers across
windows (v1.1 and v2.0)."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.data.classification import ClassificationExample
from bertforge.data.finetuning import Feature
from bertforge.data.multiple_choice import ChoiceExample
from bertforge.data.question_answering import QAExample
from bertforge.data.tagging import TaggingExample
from bertforge.families import question_answering, tagging
from bertforge.families.base import InputSettings
from bertforge.families.classification import FAMILY as CLASSIFICATION
from bertforge.families.classification import mean_window_logits
from bertforge.families.multiple_choice import FAMILY as MULTIPLE_CHOICE
from bertforge.families.question_answering import decode_answers
from bertforge.families.tagging import FAMILY as TAGGING
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab

WORDS = "the cat sat on a mat john lives in paris where does live . ?".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", *"北京张三住在"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(Vocab(TOKENS), TokenizerConfig())


def labelled(*names: str) -> BertConfig:
    return BertConfig(id2label=dict(enumerate(names)))


def one_hot_logits(feature: Feature, predicted, classes: int, value: float = 5.0) -> np.ndarray:
    """[T, C] logits whose arg-max at each position is `predicted[position]`."""
    logits = np.zeros((len(feature.input_ids), classes))
    logits[np.arange(len(feature.input_ids)), predicted] = value
    return logits


def confidence(classes: int, value: float = 5.0) -> float:
    return float(np.exp(value) / (np.exp(value) + classes - 1))


# --- window logits ----------------------------------------------------------------------------------------

def test_mean_window_logits_means_per_example():
    features = [Feature(0, [], []), Feature(0, [], []), Feature(1, [], [])]
    logits = [np.array([1.0, 3.0]), np.array([3.0, -1.0]), np.array([0.5, 0.0])]
    np.testing.assert_allclose(mean_window_logits(features, logits, 2), [[2.0, 1.0], [0.5, 0.0]])
    with pytest.raises(ValueError, match="no feature"):
        mean_window_logits(features, logits, 3)


def test_classification_decode_softmaxes_the_mean_of_window_logits():
    features = [Feature(0, [], []), Feature(0, [], []), Feature(1, [], [])]
    logits = [np.array([1.0, 3.0]), np.array([3.0, -1.0]), np.array([0.5, 0.0])]
    examples = [ClassificationExample("a", None, None, "f:1"), ClassificationExample("b", None, None, "f:2")]
    first, second = CLASSIFICATION.decode(examples, features, logits, {"threshold": 0.5}, labelled("neg", "pos"))
    # Example 0: mean logits [2, 1] -> "neg", although one window alone says "pos" more strongly.
    assert first["label"] == "neg" and first["windows"] == 2
    assert first["score"] == pytest.approx(1 / (1 + np.exp(-1.0)))
    assert sum(first["scores"].values()) == pytest.approx(1.0)
    assert second["label"] == "neg" and second["windows"] == 1
    (value,) = CLASSIFICATION.decode(examples[:1], features[:2], [np.array([1.0]), np.array([2.0])], {},
                                     BertConfig(problem_type="regression"))
    assert value == {"value": pytest.approx(1.5), "windows": 2}


def test_choice_decode_averages_the_windows_choice_logits():
    example = ChoiceExample("context", "", ["a", "b"], None, "f:1")
    features = [Feature(0, [[]], [[]], window=0), Feature(0, [[]], [[]], window=1)]
    (result,) = MULTIPLE_CHOICE.decode([example], features, [np.array([1.0, 3.0]), np.array([3.0, -1.0])], {},
                                       BertConfig())
    assert result["choice"] == 0 and result["logits"] == pytest.approx([2.0, 1.0])
    assert result["scores"] == pytest.approx([1 / (1 + np.exp(-1.0)), 1 / (1 + np.exp(1.0))])
    assert result["score"] == pytest.approx(result["scores"][0])


# --- tagging ----------------------------------------------------------------------------------------------

def test_tagging_decode_takes_each_word_from_its_max_context_window(tokenizer):
    words = ["the", "cat", "sat", "on", "a", "mat"] * 3
    example = TaggingExample(words, None, " ", "f:1")
    features = tagging.build_features([example], tokenizer, InputSettings(max_seq_length=8, doc_stride=3))
    assert len(features) > 2
    # Every window predicts B-X for all its tokens except in the window where the token has most context,
    # where it predicts O: decoding must read only the max-context window.
    outputs = [one_hot_logits(f, [0 if w is not None else 1 for w in f.word_index], 2) for f in features]
    (result,) = TAGGING.decode([example], features, outputs, {}, labelled("O", "B-X"))
    assert result == {"entities": [], "tags": ["O"] * len(words)}


def test_tagging_decode_iobes_to_bio_and_unpredicted_words(tokenizer):
    example = TaggingExample(["john", "\u200b", "paris"], None, " ", "f:1")
    (feature,) = tagging.build_features([example], tokenizer, InputSettings(max_seq_length=16))
    predicted = [0] * len(feature.input_ids)
    predicted[1], predicted[2] = 1, 2
    (result,) = TAGGING.decode([example], [feature], [one_hot_logits(feature, predicted, 3)], {},
                               labelled("O", "S-PER", "S-LOC"))
    assert result["tags"] == ["B-PER", "O", "B-LOC"]
    assert [(e["type"], e["text"]) for e in result["entities"]] == [("PER", "john"), ("LOC", "paris")]


def decode_with_tags(example: TaggingExample, tags: list[str], tokenizer) -> dict:
    """Decode logits that predict `tags` (one per word) for `example`."""
    names = ["O", *sorted({t for t in tags if t != "O"})]
    (feature,) = TAGGING.features([example], tokenizer, InputSettings(max_seq_length=32), config=labelled(*names))
    predicted = [names.index(tags[w]) if w is not None else 0 for w in feature.word_index]
    (result,) = TAGGING.decode([example], [feature], [one_hot_logits(feature, predicted, len(names))], {},
                               labelled(*names))
    assert result["tags"] == tags
    return result


def test_tagging_entities_character_offsets_words_and_characters(tokenizer):
    english = TaggingExample(["Peter", "Blackburn", "visits", "New", "York"], None, " ", "f:1")
    result = decode_with_tags(english, ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"], tokenizer)
    score = confidence(5)
    assert result["entities"] == [{"type": "PER", "start": 0, "end": 15, "text": "Peter Blackburn",
                                   "score": pytest.approx(score)},
                                  {"type": "LOC", "start": 23, "end": 31, "text": "New York",
                                   "score": pytest.approx(score)}]
    chinese = TaggingExample(list("张三住在北京"), None, "", "f:1")
    result = decode_with_tags(chinese, ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"], tokenizer)
    assert [{k: e[k] for k in ("type", "start", "end", "text")} for e in result["entities"]] == [
        {"type": "PER", "start": 0, "end": 2, "text": "张三"}, {"type": "LOC", "start": 4, "end": 6, "text": "北京"}]


def test_tagging_raw_text_entities_point_into_the_text_sent(tokenizer):
    text = "john  lives in paris."  # two spaces and no space before the full stop
    example = TAGGING.parse(text)
    result = decode_with_tags(example, ["B-PER", "O", "O", "B-LOC", "O"], tokenizer)
    assert example.words == ["john", "lives", "in", "paris", "."]
    assert [(e["start"], e["end"], e["text"]) for e in result["entities"]] == [(0, 4, "john"), (15, 20, "paris")]
    assert all(text[e["start"]:e["end"]] == e["text"] for e in result["entities"])


# --- question answering -----------------------------------------------------------------------------------

def qa_setup(tokenizer, max_seq_length=24, doc_stride=8):
    filler = "the cat sat on a mat . " * 3
    context = filler + "john lives in paris . " + filler
    example = QAExample("q1", "where does john live ?", context, ["paris"], context.index("paris"), "paris")
    features = question_answering.build_features(
        [example], tokenizer, InputSettings(max_seq_length=max_seq_length, doc_stride=doc_stride))
    return example, features


def logits_for(features, target: str, context: str, score: float = 5.0):
    starts, ends = [], []
    for feature in features:
        start = np.zeros(len(feature.input_ids))
        end = np.zeros(len(feature.input_ids))
        for position, offset in enumerate(feature.offsets):
            if offset is not None and context[offset[0]:offset[1]] == target:
                start[position] = end[position] = score
        starts.append(start)
        ends.append(end)
    return starts, ends


def answer(example, features, starts, ends, **options) -> dict:
    (result,) = decode_answers([example], features, list(zip(starts, ends)), **options)
    return result


def test_decode_answers_finds_the_span_across_windows(tokenizer):
    example, features = qa_setup(tokenizer)
    assert len(features) > 2
    starts, ends = logits_for(features, "paris", example.context)
    result = answer(example, features, starts, ends)
    assert result["answer"] == "paris" and example.context[result["start"]:result["end"]] == "paris"
    assert 0 < result["probability"] <= 1 and "null_margin" not in result and "score" not in result
    best = result["nbest"][0]
    assert example.context[best["start"]:best["end"]] == "paris" and best["logit_score"] == pytest.approx(10.0)
    # One name, one meaning: the answer's fields are its best candidate's, probability and logit sum alike.
    assert (result["probability"], result["logit_score"]) == (best["probability"], best["logit_score"])
    assert all("score" not in c for c in result["nbest"])
    texts = [c["text"] for c in result["nbest"]]
    assert len(set(texts)) == len(texts)  # n-best texts are distinct
    logits = [c["logit_score"] for c in result["nbest"]]
    assert logits == sorted(logits, reverse=True)


def test_decode_answers_rules_out_bad_spans(tokenizer):
    example, features = qa_setup(tokenizer)
    starts, ends = logits_for(features, "john", example.context)
    ends_paris = logits_for(features, "paris", example.context)[1]
    result = answer(example, features, starts, ends_paris, max_answer_length=2)
    assert result["answer"] != "john lives in paris"  # 4 tokens > max_answer_length
    assert answer(example, features, starts, ends_paris)["answer"] == "john lives in paris"
    # A start on a question token or [CLS] is never an answer.
    for start in starts:
        start[:] = 0.0
        start[0] = start[1] = 100.0
    predicted = answer(example, features, starts, ends_paris)["answer"]
    assert predicted and predicted in example.context
    assert "where" not in predicted


def test_decode_answers_version_2_null_score_diff_threshold(tokenizer):
    example, features = qa_setup(tokenizer)
    starts, ends = logits_for(features, "paris", example.context, score=1.0)
    for start, end in zip(starts, ends):
        start[0] = end[0] = 3.0  # null score 6 beats the best span (2)
    result = answer(example, features, starts, ends, version_2_with_negative=True)
    assert (result["answer"], result["start"], result["end"]) == ("", None, None)
    assert result["null_margin"] == pytest.approx(4.0)
    result = answer(example, features, starts, ends, version_2_with_negative=True, null_score_diff_threshold=5.0)
    assert result["answer"] == "paris"
    assert answer(example, features, starts, ends)["answer"] == "paris"  # v1.1 never answers ""


def span_logits(features, context: str, first: tuple[int, str], last: tuple[int, str], score: float = 5.0):
    """Start logits on the token at character `first[0]` spelling `first[1]`, end logits on `last`'s."""
    starts, ends = [], []
    for feature in features:
        start = np.zeros(len(feature.input_ids))
        end = np.zeros(len(feature.input_ids))
        for position, offset in enumerate(feature.offsets):
            if offset is None:
                continue
            if (offset[0], context[offset[0]:offset[1]]) == first:
                start[position] = score
            if (offset[0], context[offset[0]:offset[1]]) == last:
                end[position] = score
        starts.append(start)
        ends.append(end)
    return starts, ends


def qa_example(tokenizer, context: str, question: str = "where does john live ?"):
    example = QAExample("q", question, context, [], None, None)
    return example, question_answering.build_features([example], tokenizer, InputSettings(max_seq_length=64))


def test_decode_answers_widens_a_span_ending_inside_a_word(tokenizer):
    context = "john sat on the mats, the cats sat on a mat."
    example, features = qa_example(tokenizer, context)
    cats = context.index("cats")
    pieces = [context[o[0]:o[1]] for o in features[0].offsets if o is not None and o[0] >= cats]
    assert pieces[:2] == ["cat", "s"]  # "cats" is "cat ##s"
    starts, ends = span_logits(features, context, (cats, "cat"), (cats, "cat"))
    assert answer(example, features, starts, ends, whole_words=False)["answer"] == "cat"  # the old cut
    result = answer(example, features, starts, ends)
    assert (result["answer"], result["start"], result["end"]) == ("cats", cats, cats + 4)
    assert all(c["text"] == context[c["start"]:c["end"]] for c in result["nbest"])
    assert "cat" not in [c["text"] for c in result["nbest"]]


def test_decode_answers_widens_a_span_starting_inside_a_word(tokenizer):
    context = "john sat on the mats, the cats sat on a mat."
    example, features = qa_example(tokenizer, context)
    mats = context.index("mats")
    starts, ends = span_logits(features, context, (mats + 3, "s"), (mats + 3, "s"))
    assert answer(example, features, starts, ends, whole_words=False)["answer"] == "s"
    assert answer(example, features, starts, ends)["answer"] == "mats"


def test_decode_answers_keeps_attached_punctuation_out_of_the_word(tokenizer):
    # "mats," is one whitespace word; its punctuation-split words are "mats" and ",": the comma stays out.
    context = "john sat on the mats, the cats sat on a mat."
    example, features = qa_example(tokenizer, context)
    mats = context.index("mats")
    starts, ends = span_logits(features, context, (mats, "mat"), (mats, "mat"))
    assert answer(example, features, starts, ends)["answer"] == "mats"
    final = context.index("mat.")
    starts, ends = span_logits(features, context, (final, "mat"), (final, "mat"))
    assert answer(example, features, starts, ends)["answer"] == "mat"


def test_decode_answers_leaves_chinese_characters_as_they_are(tokenizer):
    context = "张三住在北京"
    example, features = qa_example(tokenizer, context, "张三住在")
    starts, ends = span_logits(features, context, (4, "北"), (5, "京"))
    assert answer(example, features, starts, ends)["answer"] == "北京"
    starts, ends = span_logits(features, context, (4, "北"), (4, "北"))
    assert answer(example, features, starts, ends)["answer"] == "北"  # one character is one word


def test_decode_answers_whole_words_through_the_family_decode(tokenizer):
    # evaluate, predict and the server call family.decode with the model's tokenizer: the same widening.
    context = "john sat on the mats, the cats sat on a mat."
    example, features = qa_example(tokenizer, context)
    cats = context.index("cats")
    starts, ends = span_logits(features, context, (cats, "cat"), (cats, "cat"))
    family = question_answering.FAMILY
    (result,) = family.decode([example], features, list(zip(starts, ends)), family.check_options({}),
                              BertConfig(), tokenizer)
    assert result["answer"] == "cats"
