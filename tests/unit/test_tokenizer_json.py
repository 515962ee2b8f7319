"""`tokenization.tokenizer_json.JsonTokenizer`: a tokenizer.json (byte-level BPE, trained here by the
`tokenizers` library, no download) behind the interface of our WordPiece tokenizer, and model directories
that carry one."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from bertforge import checkpoint_format
from bertforge.errors import ConfigError, InputError
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertForMaskedLM
from bertforge.tokenization.tokenizer_json import JsonTokenizer, train_bpe

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Naïve café owners serve crème brûlée daily!",
          "ModernBERT reads 8,192 tokens; BERT reads 512.", "Ünïcödé and ASCII, side by side."] * 30


@pytest.fixture(scope="module")
def bpe() -> JsonTokenizer:
    return train_bpe(CORPUS, vocab_size=400)


def test_tokenizer_json_offsets_point_at_the_original_characters(bpe):
    text = "The  naïve fox, café!"
    encoding = bpe.encode(text, add_special_tokens=False)
    assert encoding.ids and len(encoding.offsets) == len(encoding.ids)
    # Every token's span is the text it decodes to, without the space a byte-level token carries.
    for index, (start, end) in zip(encoding.ids, encoding.offsets):
        assert bpe.decode([index]).strip() == text[start:end]
    covered = "".join(text[start:end] for start, end in encoding.offsets)
    assert covered == text.replace(" ", "")


def test_tokenizer_json_pairs_truncation_and_padding_use_our_layout(bpe):
    first, second = bpe.encode("The quick brown fox", add_special_tokens=False), bpe.encode("lazy dog",
                                                                                           add_special_tokens=False)
    pair = bpe.encode("The quick brown fox", "lazy dog")
    cls, sep = bpe.cls_token_id, bpe.sep_token_id
    assert pair.ids == [cls, *first.ids, sep, *second.ids, sep]
    assert pair.type_ids == [0] * (len(first.ids) + 2) + [1] * (len(second.ids) + 1)
    assert pair.sequence_ids.count(1) == len(second.ids)
    cut = bpe.encode("The quick brown fox jumps over the lazy dog.", "lazy dog", max_length=8, truncation=True)
    assert len(cut.ids) == 8 and cut.ids[0] == cls and cut.ids.count(sep) == 2
    with pytest.raises(InputError):
        bpe.encode("The quick brown fox jumps over the lazy dog.", max_length=4)
    batch = bpe(["fox", "The quick brown fox jumps"], padding=True, return_tensors="np")
    assert batch["input_ids"].shape[0] == 2 and batch["input_ids"][0, -1] == bpe.pad_token_id
    assert np.array_equal(batch["attention_mask"].sum(1), [len(bpe.encode(t).ids) for t in ["fox", "The quick brown fox jumps"]])
    assert bpe.all_special_ids == [0, 1, 2, 3, 4] and bpe.mask_token_id == 4


def test_tokenizer_json_words_and_pickling(bpe):
    text = "crème brûlée daily"
    assert [word for word, _, _ in bpe.pre_tokenize(text)] == ["crème", "brûlée", "daily"]
    ids, word_ids = bpe.encode_words(text)
    assert len(ids) == len(word_ids) and word_ids[0] == 0 and word_ids[-1] == 2
    again = pickle.loads(pickle.dumps(bpe))
    assert again.encode(text, "fox").ids == bpe.encode(text, "fox").ids
    with pytest.raises(InputError):
        bpe.decode([bpe.vocab_size])


def test_tokenizer_json_missing_special_token_is_named(bpe, tmp_path):
    bpe.save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"cls_token": "<s>"}))
    with pytest.raises(ConfigError, match="tokenizer_config.json.*<s>"):
        JsonTokenizer.from_pretrained(tmp_path)


def test_modernbert_directory_carries_its_tokenizer_json(bpe, tmp_path):
    config = ModernBertConfig(vocab_size=bpe.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=2, pad_token_id=bpe.pad_token_id, local_attention=8)
    torch.manual_seed(0)
    ModernBertForMaskedLM(config).save_pretrained(tmp_path / "model", tokenizer=bpe)
    assert not (tmp_path / "model" / "vocab.txt").exists()
    assert "tokenizer.json" in json.dumps(json.loads((tmp_path / "model" / "checksums.json").read_text()))
    directory = checkpoint_format.read_directory(tmp_path / "model")
    assert isinstance(directory.tokenizer, JsonTokenizer)
    assert directory.architecture == "ModernBertForMaskedLM"
    text = "The naïve fox"
    assert directory.tokenizer.encode(text, "dog").ids == bpe.encode(text, "dog").ids
    assert checkpoint_format.load_tokenizer(tmp_path / "model").encode(text).offsets == bpe.encode(text).offsets
