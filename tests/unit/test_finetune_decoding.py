"""Decoding model outputs back to what the data speaks: averaged window logits, word tags from max-context
windows, entities in character offsets, SQuAD n-best answers across windows (v1.1 and v2.0)."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.data.conll import TaggingExample, build_tagging_features
from bertforge.data.finetuning import Feature
from bertforge.data.squad import QAExample, build_qa_features
from bertforge.evaluation import aggregate_windows, decode_answers, decode_tags, tag_entities
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab

WORDS = "the cat sat on a mat john lives in paris where does live . ?".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", *"北京张三住在"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(Vocab(TOKENS), TokenizerConfig())


def test_aggregate_windows_means_per_example():
    features = [Feature(0, [], []), Feature(0, [], []), Feature(1, [], [])]
    logits = [np.array([1.0, 3.0]), np.array([3.0, -1.0]), np.array([0.5, 0.0])]
    np.testing.assert_allclose(aggregate_windows(features, logits, 2), [[2.0, 1.0], [0.5, 0.0]])
    with pytest.raises(ValueError, match="no feature"):
        aggregate_windows(features, logits, 3)


def test_decode_tags_takes_each_word_from_its_max_context_window(tokenizer):
    words = ["the", "cat", "sat", "on", "a", "mat"] * 3
    example = TaggingExample(words, None, " ", "f:1")
    features = build_tagging_features([example], tokenizer, 8, stride=3)
    id2label = {0: "O", 1: "B-X"}
    # Every window predicts B-X for all its tokens except in the window where the token has most context,
    # where it predicts O: decoding must read only the max-context window.
    predictions = []
    for feature in features:
        predictions.append([0 if w is not None else 1 for w in feature.word_index])
    assert decode_tags([example], features, predictions, id2label) == [["O"] * len(words)]


def test_decode_tags_iobes_to_bio_and_unpredicted_words(tokenizer):
    example = TaggingExample(["john", "\u200b", "paris"], None, " ", "f:1")
    (feature,) = build_tagging_features([example], tokenizer, 16)
    id2label = {0: "O", 1: "S-PER", 2: "S-LOC"}
    predicted = [0] * len(feature.input_ids)
    predicted[1], predicted[2] = 1, 2
    assert decode_tags([example], [feature], [predicted], id2label, "IOBES") == [["B-PER", "O", "B-LOC"]]


def test_tag_entities_character_offsets_words_and_characters():
    english = TaggingExample(["Peter", "Blackburn", "visits", "New", "York"], None, " ", "f:1")
    entities = tag_entities(english, ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"])
    assert entities == [{"type": "PER", "start": 0, "end": 15, "text": "Peter Blackburn"},
                        {"type": "LOC", "start": 23, "end": 31, "text": "New York"}]
    chinese = TaggingExample(list("张三住在北京"), None, "", "f:1")
    assert tag_entities(chinese, ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"]) == [
        {"type": "PER", "start": 0, "end": 2, "text": "张三"}, {"type": "LOC", "start": 4, "end": 6, "text": "北京"}]


def qa_setup(tokenizer, max_seq_length=24, stride=8):
    filler = "the cat sat on a mat . " * 3
    context = filler + "john lives in paris . " + filler
    example = QAExample("q1", "where does john live ?", context, ["paris"], context.index("paris"), "paris")
    features = build_qa_features([example], tokenizer, max_seq_length, doc_stride=stride)
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


def test_decode_answers_finds_the_span_across_windows(tokenizer):
    example, features = qa_setup(tokenizer)
    assert len(features) > 2
    starts, ends = logits_for(features, "paris", example.context)
    predictions, nbest, _ = decode_answers([example], features, starts, ends)
    assert predictions == {"q1": "paris"}
    best = nbest["q1"][0]
    assert example.context[best.start:best.end] == "paris" and best.score == pytest.approx(10.0)
    assert len({c.text for c in nbest["q1"]}) == len(nbest["q1"])  # n-best texts are distinct


def test_decode_answers_rules_out_bad_spans(tokenizer):
    example, features = qa_setup(tokenizer)
    starts, ends = logits_for(features, "john", example.context)
    ends_paris = logits_for(features, "paris", example.context)[1]
    predictions, _, _ = decode_answers([example], features, starts, ends_paris, max_answer_length=2)
    assert predictions["q1"] != "john lives in paris"  # 4 tokens > max_answer_length
    predictions, _, _ = decode_answers([example], features, starts, ends_paris)
    assert predictions["q1"] == "john lives in paris"
    # A start on a question token or [CLS] is never an answer.
    for start in starts:
        start[:] = 0.0
        start[0] = start[1] = 100.0
    predictions, _, _ = decode_answers([example], features, starts, ends_paris)
    assert predictions["q1"] and predictions["q1"] in example.context
    assert "where" not in predictions["q1"]


def test_decode_answers_version_2_null_threshold(tokenizer):
    example, features = qa_setup(tokenizer)
    starts, ends = logits_for(features, "paris", example.context, score=1.0)
    for start, end in zip(starts, ends):
        start[0] = end[0] = 3.0  # null score 6 beats the best span (2)
    predictions, _, margins = decode_answers([example], features, starts, ends, version_2_with_negative=True)
    assert predictions == {"q1": ""} and margins["q1"] == pytest.approx(4.0)
    predictions, _, _ = decode_answers([example], features, starts, ends, version_2_with_negative=True,
                                       null_score_diff_threshold=5.0)
    assert predictions == {"q1": "paris"}
    predictions, _, _ = decode_answers([example], features, starts, ends)  # v1.1 never answers ""
    assert predictions == {"q1": "paris"}
