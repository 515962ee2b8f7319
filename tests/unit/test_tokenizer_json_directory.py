"""Model directories whose tokenizer is a `tokenizer.json` alone (what sentence-transformers 6 and transformers 5
save: no vocab.txt): the vocabulary and normaliser settings are read from it, a tokenizer.json that is not BERT's
WordPiece is refused naming the file and the field, and a tokenizer_config.json beside it must agree."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from tokenizers import Tokenizer as RustTokenizer

from bertforge.checkpoint_format import load_tokenizer, read_directory
from bertforge.errors import CheckpointError
from bertforge.model.bert import BertModel
from bertforge.tokenization import Tokenizer, Vocab
from bertforge.tokenization.tokenizer_files import TokenizerConfig

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "The", "cat", "café", "cafe", "sat", "##s", ".", "北",
          "京", "北京", "Zürich", "zurich"]
TEXTS = ["The cats sat.", "the café in Zürich", "北京 the cat", "CAFÉ"]


def only_tokenizer_json(folder):
    """The directory as sentence-transformers 6 leaves it: tokenizer.json (and what else it keeps), no vocab.txt."""
    for name in ("vocab.txt", "checksums.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    return folder


def saved(tmp_path, tiny_config, config: TokenizerConfig):
    tokenizer = Tokenizer(Vocab(TOKENS), config)
    BertModel(tiny_config).save_pretrained(tmp_path / "m", tokenizer=tokenizer)
    return tmp_path / "m", tokenizer


def edit(folder, change) -> None:
    data = json.loads((folder / "tokenizer.json").read_text())
    change(data)
    (folder / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize("casing", [
    TokenizerConfig(model_max_length=64),
    TokenizerConfig(do_lower_case=False, strip_accents=False, tokenize_chinese_chars=False, model_max_length=64)])
def test_tokenizer_json_alone_gives_the_same_tokenizer(tmp_path, tiny_config, casing):
    folder, original = saved(tmp_path, tiny_config, casing)
    only_tokenizer_json(folder)
    (folder / "tokenizer_config.json").unlink()  # every setting from tokenizer.json
    tokenizer = read_directory(folder).tokenizer
    assert tokenizer is not None and tokenizer.vocab.tokens == TOKENS
    for name in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "max_input_chars_per_word"):
        assert getattr(tokenizer.config, name) == getattr(original.config, name), name
    rust = RustTokenizer.from_file(str(folder / "tokenizer.json"))
    for text in TEXTS:
        assert tokenizer.encode(text).ids == original.encode(text).ids == rust.encode(text).ids, text
    assert load_tokenizer(folder).vocab.tokens == TOKENS


def test_tokenizer_json_with_tokenizer_config_takes_its_limit_and_refuses_other_casing(tmp_path, tiny_config):
    folder, _ = saved(tmp_path, tiny_config, TokenizerConfig(model_max_length=64))
    only_tokenizer_json(folder)
    assert read_directory(folder).tokenizer.model_max_length == 64  # from tokenizer_config.json
    stated = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**stated, "do_lower_case": False}))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: normalizer lowercase is True but "
                                              r"tokenizer_config\.json has do_lower_case False"):
        read_directory(folder)


@pytest.mark.parametrize("field,change", [
    ("model.continuing_subword_prefix", lambda t: t["model"].update(continuing_subword_prefix="@@")),
    ("model.vocab", lambda t: t["model"]["vocab"].update(cat=99)),
    ("normalizer.type", lambda t: t.update(normalizer={"type": "Sequence", "normalizers": []})),
    ("pre_tokenizer.type", lambda t: t.update(pre_tokenizer={"type": "Whitespace"}))])
def test_tokenizer_json_not_bert_wordpiece_is_refused_naming_file_and_field(tmp_path, tiny_config, field, change):
    folder, _ = saved(tmp_path, tiny_config, TokenizerConfig())
    edit(only_tokenizer_json(folder), change)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(folder / 'tokenizer.json'))}: .*{re.escape(field)}"):
        read_directory(folder)


def test_tokenizer_json_of_another_model_type_is_read_by_the_tokenizers_library(tmp_path, tiny_config):
    # Not WordPiece: no longer refused as "not BERT's" but handed to the tokenizers library (JsonTokenizer), which
    # here cannot read a BPE model without merges: the error names the file.
    folder, _ = saved(tmp_path, tiny_config, TokenizerConfig())
    edit(only_tokenizer_json(folder), lambda t: t["model"].update(type="BPE"))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(folder / 'tokenizer.json'))}: the tokenizers library"):
        read_directory(folder)


def test_tokenizer_json_real_vocabulary_tokenizes_as_vocab_txt(tmp_path, tiny_minilm_model):
    folder = tmp_path / "m"
    shutil.copytree(tiny_minilm_model, folder)
    with_vocab = read_directory(folder).tokenizer
    only_tokenizer_json(folder)
    alone = read_directory(folder).tokenizer
    assert alone.vocab.tokens == with_vocab.vocab.tokens and len(alone.vocab) == 30522
    texts = ["Crème brûlée and naïve façades.", "北京是中国的首都。", "A man is playing a guitar!", "ok"]
    assert [alone.encode(t).ids for t in texts] == [with_vocab.encode(t).ids for t in texts]
