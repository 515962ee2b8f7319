"""Tests of `bertforge.data.pretraining`: Google's instance construction, NSP labels, truncation, word starts."""

from __future__ import annotations

import random
from array import array
from collections import Counter

import pytest

from bertforge.constants import NSP_IS_NEXT, NSP_IS_RANDOM
from bertforge.data.pretraining import (
    Sentence,
    _truncate_pair,
    create_contiguous_instances,
    create_instances,
    jieba_segmenter,
    segment_word_starts,
    tokenize_document,
    validate_instance_settings,
)
from bertforge.errors import ConfigError
from bertforge.tokenization import Tokenizer, Vocab
from bertforge.tokenization.postprocessor import PostProcessor

CLS, SEP = 2, 3
WORDS = "the cat sat on mat and dog ran to park it was sunny day . , ! ? un ##aff ##able 我 们 喜 欢 北 京".split()


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]))


def numbered_documents(sizes: list[list[int]], base: int = 1000) -> list[list[Sentence]]:
    """Documents whose token ids encode (document, position): document d holds ids d*base + 0, 1, 2 ..."""
    documents = []
    for number, lengths in enumerate(sizes):
        counter = number * base
        document = []
        for length in lengths:
            document.append(Sentence(array("i", range(counter, counter + length)), b"\x01" * length))
            counter += length
        documents.append(document)
    return documents


def split_instance(instance):
    ids = list(instance.ids)
    b = instance.segment_b_start
    assert ids[0] == CLS and ids[b - 1] == SEP and ids[-1] == SEP
    return ids[1:b - 1], ids[b:-1]


def all_instances(documents, seed=0, **settings):
    rng = random.Random(seed)
    settings = {"max_seq_length": 32, "short_seq_prob": 0.1, "special": PostProcessor(CLS, SEP), **settings}
    return [instance for index in range(len(documents))
            for instance in create_instances(documents, index, rng=rng, **settings)]


def test_pretraining_instances_have_bert_layout_and_fit():
    documents = numbered_documents([[7, 5, 9, 12, 3, 8, 6, 11] * 3 for _ in range(6)])
    instances = all_instances(documents)
    assert instances
    for instance in instances:
        a, b = split_instance(instance)
        assert a and b
        assert len(instance.ids) <= 32
        assert len(instance.word_starts) == len(instance.ids)
        assert instance.word_starts[0] == 1 and instance.word_starts[-1] == 1


def test_pretraining_contiguous_rows_are_full_consecutive_text_with_a_sep_between_documents():
    # 3 documents of 7 + 5 + 9 = 21, 10 and 4 tokens: with the 2 separators, 37 tokens of text in rows of 14 ids
    # ([CLS] 12 tokens [SEP]); only the group's last row is short, and no token is lost, repeated or reordered.
    documents = numbered_documents([[7, 5, 9], [4, 6], [4]])
    instances = create_contiguous_instances(documents, max_seq_length=14, special=PostProcessor(CLS, SEP))
    bodies = []
    for instance in instances:
        ids = list(instance.ids)
        assert ids[0] == CLS and ids[-1] == SEP  # (document 0 holds the ids 2 and 3 as text: kept as text)
        assert instance.segment_b_start == len(ids) and instance.nsp_label == NSP_IS_NEXT  # no segment B
        assert len(instance.word_starts) == len(ids) and instance.word_starts[:2] == b"\x01\x01"
        bodies.append(ids[1:-1])
    assert [len(body) for body in bodies] == [12, 12, 12, 1]  # no padding but in the last row
    text = [token for body in bodies for token in body]
    assert text == [*range(0, 21), SEP, *range(1000, 1010), SEP, *range(2000, 2004)]
    # a chunk never begins with the separator: it begins after it (and the count shrinks by that one)
    at_boundary = numbered_documents([[6, 6], [5]])
    rows = create_contiguous_instances(at_boundary, max_seq_length=14, special=PostProcessor(CLS, SEP))
    assert [list(row.ids) for row in rows] == [[CLS, *range(12), SEP], [CLS, *range(1000, 1005), SEP]]
    # an empty document adds no separator
    assert [len(r.ids) for r in create_contiguous_instances(numbered_documents([[3], [], [3]]), max_seq_length=14,
                                                            special=PostProcessor(CLS, SEP))] == [9]


def test_pretraining_contiguous_rows_start_a_word_where_a_row_cuts_one():
    document = [Sentence(array("i", range(10, 20)), b"\x01\x00" * 5)]  # five two-piece words
    rows = create_contiguous_instances([document], max_seq_length=5, special=PostProcessor(CLS, SEP))
    assert [row.word_starts for row in rows] == [b"\x01\x01\x00\x01\x01", b"\x01\x01\x01\x00\x01",
                                                 b"\x01\x01\x00\x01\x01", b"\x01\x01\x01"]


def test_pretraining_nsp_labels_match_segment_origin():
    documents = numbered_documents([[4, 6, 5, 7, 3, 6, 5, 4, 6] * 2 for _ in range(8)])
    instances = all_instances(documents, seed=3)
    for instance in instances:
        a, b = split_instance(instance)
        # Within a segment ids are increasing runs of one document (whole sentences, possibly trimmed).
        assert a == sorted(a) and b == sorted(b)
        same_document = a[0] // 1000 == b[0] // 1000
        if instance.nsp_label == NSP_IS_NEXT:
            assert same_document and b[0] > a[-1]
        else:
            assert instance.nsp_label == NSP_IS_RANDOM and not same_document
    labels = Counter(instance.nsp_label for instance in instances)
    assert 0.35 < labels[NSP_IS_NEXT] / len(instances) < 0.65


def test_pretraining_single_sentence_chunk_takes_random_b_and_unused_sentences_return():
    # Sentences as long as the target: each chunk is one sentence, so every B is random and no sentence of
    # the document is lost: every sentence appears as segment A once.
    documents = numbered_documents([[30, 30, 30, 30] for _ in range(3)])
    instances = all_instances(documents, short_seq_prob=0.0, seed=1)
    assert all(instance.nsp_label == NSP_IS_RANDOM for instance in instances)
    assert len(instances) == 12


def test_pretraining_target_length_and_short_sequences():
    documents = numbered_documents([[5] * 60 for _ in range(4)])
    full = all_instances(documents, short_seq_prob=0.0)
    lengths = [len(instance.ids) for instance in full]
    # Chunks stop at the first sentence that reaches the 29-token target; pairs are trimmed to 29 + 3.
    assert max(lengths) == 32 and sum(length >= 28 for length in lengths) / len(lengths) > 0.8
    short = all_instances(documents, short_seq_prob=1.0, seed=5)
    assert sum(len(instance.ids) for instance in short) / len(short) < sum(lengths) / len(lengths)


def test_pretraining_is_deterministic_for_a_seed():
    documents = numbered_documents([[3, 8, 5, 9, 2, 7] * 3 for _ in range(5)])
    first = [(list(i.ids), i.segment_b_start, i.nsp_label) for i in all_instances(documents, seed=11)]
    again = [(list(i.ids), i.segment_b_start, i.nsp_label) for i in all_instances(documents, seed=11)]
    other = [(list(i.ids), i.segment_b_start, i.nsp_label) for i in all_instances(documents, seed=12)]
    assert first == again and first != other


def test_pretraining_truncation_trims_longer_side_from_both_ends():
    rng = random.Random(0)
    a_front, a_back, b_front, b_back = _truncate_pair(100, 10, 50, rng)
    assert a_front + a_back == 60 and b_front == b_back == 0
    assert a_front > 10 and a_back > 10  # random front/back, not always the back
    assert _truncate_pair(30, 30, 40, random.Random(1))[0:2] != (0, 0)
    assert sum(_truncate_pair(30, 30, 40, random.Random(1))) == 20
    assert _truncate_pair(5, 5, 40, rng) == (0, 0, 0, 0)


def test_pretraining_tokenize_document_word_starts_follow_word_ids():
    tokenizer = tiny_tokenizer()
    document = tokenize_document(["The unaffable cat.", "   ", "Dog ran!"], tokenizer)
    assert len(document) == 2  # the blank sentence produced no token and was dropped
    tokens = tokenizer.convert_ids_to_tokens(list(document[0].ids))
    assert tokens == ["the", "un", "##aff", "##able", "cat", "."]
    assert list(document[0].word_starts) == [1, 1, 0, 0, 1, 1]


def test_pretraining_segmenter_word_starts_for_chinese():
    tokenizer = tiny_tokenizer()
    segmenter_calls = []

    def segmenter(text):
        segmenter_calls.append(text)
        return ["我们", "喜欢", "北京", "!"]

    document = tokenize_document(["我们喜欢北京!"], tokenizer, segmenter=segmenter)
    assert segmenter_calls == ["我们喜欢北京!"]
    assert list(document[0].word_starts) == [1, 0, 1, 0, 1, 0, 1]
    plain = tokenize_document(["我们喜欢北京!"], tokenizer)
    assert list(plain[0].ids) == list(document[0].ids)  # segmentation never changes the token ids
    assert list(plain[0].word_starts) == [1] * 7


def test_pretraining_segment_word_starts_prefers_longest_and_ignores_non_cjk():
    starts = bytearray([1, 1, 1, 1])
    segment_word_starts(["北", "京", "喜", "欢"], starts, ["北京喜", "北京", "hello"])
    assert list(starts) == [1, 0, 0, 1]


def test_pretraining_jieba_segmenter_when_installed():
    pytest.importorskip("jieba")
    words = jieba_segmenter()("我们喜欢北京")
    assert "".join(words) == "我们喜欢北京"


def test_pretraining_settings_are_validated():
    validate_instance_settings(128, 0.1, 1)
    with pytest.raises(ConfigError, match="max_seq_length"):
        validate_instance_settings(4, 0.1, 1)
    with pytest.raises(ConfigError, match="short_seq_prob"):
        validate_instance_settings(128, 1.5, 1)
    with pytest.raises(ConfigError, match="dupe_factor"):
        validate_instance_settings(128, 0.1, 0)
