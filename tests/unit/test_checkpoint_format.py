"""Model directories: what a save writes, that it is atomic, and that every broken checkpoint fails with an
error naming the file and the key instead of a traceback from deep inside torch or safetensors."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import checkpoint_format, storage
from bertforge.checkpoint_format import LoadReport, load_model, load_tokenizer, read_config, save_model
from bertforge.errors import CheckpointError, ConfigError
from bertforge.families import registry
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.initialisation import weights_to_come
from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import fast_paths_enabled

QUERY_KEY = "encoder.layer.0.attention.self.query.weight"


@pytest.fixture
def saved(tmp_path, tiny_config):
    """A saved BertModel directory."""
    torch.manual_seed(0)
    path = tmp_path / "model"
    BertModel(tiny_config).save_pretrained(path)
    return path


def unverified(path):
    """The directory without its checksums.json, as a directory from elsewhere (Hugging Face's, an older
    save) is: these tests damage files behind the loader's back to reach the checks after the checksum's
    (which `test_checkpoint_integrity.py` tests with the manifest in place)."""
    (path / "checksums.json").unlink()
    return path


def rewrite_weights(path, change) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(unverified(path) / "model.safetensors"))


def edit_config(path, **changes) -> None:
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


# --- what a save writes ----------------------------------------------------------------------------------

def test_checkpoint_format_save_writes_hf_directory(saved):
    assert sorted(os.listdir(saved)) == ["checksums.json", "config.json", "model.safetensors"]
    data = json.loads((saved / "config.json").read_text())
    assert data["model_type"] == "bert" and data["architectures"] == ["BertModel"]
    assert QUERY_KEY in load_file(str(saved / "model.safetensors"))


def test_checkpoint_format_save_and_load_round_trip_is_exact(saved, tiny_config):
    torch.manual_seed(0)
    original = BertModel(tiny_config)
    loaded = BertModel.from_pretrained(saved)
    assert not loaded.training and loaded.config == tiny_config
    for key, value in original.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, atol=0, rtol=0, msg=key)


def test_checkpoint_format_load_model_picks_class_from_config(tmp_path, tiny_config):
    BertForTokenClassification(tiny_config.with_labels(["O", "B-X"])).save_pretrained(tmp_path)
    model, report = registry.load_model(tmp_path)
    assert type(model) is BertForTokenClassification and model.config.label_names == ["O", "B-X"]
    assert report.fresh == [] and report.skipped == []


def test_checkpoint_format_load_model_dtype_and_overrides(saved):
    model, _ = load_model(saved, BertModel, dtype=torch.float64, config_overrides={"hidden_dropout_prob": 0.2})
    assert model.embeddings.word.weight.dtype == torch.float64
    assert model.config.hidden_dropout_prob == 0.2


def test_checkpoint_format_load_model_bad_override_is_config_error(saved):
    with pytest.raises(ConfigError, match="bad config override"):
        load_model(saved, BertModel, config_overrides={"hidden_sise": 3})


def test_checkpoint_format_save_with_tokenizer_and_extra_files(tmp_path, tiny_config):
    from tokenizers import Tokenizer as RustTokenizer

    from bertforge.tokenization import Tokenizer, Vocab

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", ".", "北"]
    tokenizer = Tokenizer(Vocab(tokens))
    save_model(BertModel(tiny_config), tmp_path / "m", tokenizer=tokenizer,
               extra_files={"README.md": "notes", "blob.bin": b"\x00\x01", "sub/x.json": "{}"})
    assert (tmp_path / "m" / "vocab.txt").read_text().split() == tokens
    assert (tmp_path / "m" / "README.md").read_text() == "notes"
    assert (tmp_path / "m" / "blob.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "m" / "sub" / "x.json").read_text() == "{}"
    # tokenizer.json (what text-embeddings-inference loads) tokenizes as ours does.
    rust = RustTokenizer.from_file(str(tmp_path / "m" / "tokenizer.json"))
    text = "The cats sat. 北 dog"
    assert rust.encode(text).ids == tokenizer.encode(text).ids


def test_checkpoint_format_load_tokenizer_without_vocab_says_so(saved):
    with pytest.raises(CheckpointError, match=rf"{saved}: no vocab.txt"):
        load_tokenizer(saved)


def test_checkpoint_format_saved_directory_is_not_private(tmp_path, tiny_config):
    # The temporary build directory must not leave the saved model readable only by its owner.
    previous = os.umask(0o022)
    try:
        BertModel(tiny_config).save_pretrained(tmp_path / "m")
    finally:
        os.umask(previous)
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o755


# --- atomic save -----------------------------------------------------------------------------------------

def leftovers(parent) -> list[str]:
    return sorted(name for name in os.listdir(parent) if name.startswith("."))


def test_checkpoint_format_save_failure_keeps_previous_directory(monkeypatch, saved, tiny_config):
    before = {name: (saved / name).read_bytes() for name in os.listdir(saved)}

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_format, "save_file", full_disk)
    with pytest.raises(CheckpointError, match=rf"{saved}: could not write the model directory .*No space left"):
        BertForPretraining(tiny_config).save_pretrained(saved)
    assert {name: (saved / name).read_bytes() for name in os.listdir(saved)} == before
    assert leftovers(saved.parent) == []


def test_checkpoint_format_save_interrupted_by_other_error_keeps_previous_directory(monkeypatch, saved, tiny_config):
    before = sorted(os.listdir(saved))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_format, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        BertModel(tiny_config).save_pretrained(saved)
    assert sorted(os.listdir(saved)) == before and leftovers(saved.parent) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_checkpoint_format_save_failure_on_swap_restores_previous_directory(monkeypatch, saved, tiny_config, exchange):
    before = (saved / "config.json").read_text()
    real_rename = os.rename

    def cross_device(*args):
        raise OSError(18, "Invalid cross-device link")

    def fail_second_rename(src, dst):
        if ".tmp-" in os.fspath(src):
            cross_device()
        return real_rename(src, dst)

    if exchange:
        monkeypatch.setattr(storage, "exchange", cross_device)
    else:
        monkeypatch.setattr(storage, "exchange", lambda a, b: False)
        monkeypatch.setattr(storage.os, "rename", fail_second_rename)
    with pytest.raises(CheckpointError, match="Invalid cross-device link.*nothing was changed"):
        BertModel(tiny_config.replace(hidden_act="relu")).save_pretrained(saved)
    assert (saved / "config.json").read_text() == before
    assert leftovers(saved.parent) == []


def test_checkpoint_format_save_over_existing_directory_replaces_it_whole(saved, tiny_config):
    (saved / "stale.txt").write_text("from an older save")
    BertModel(tiny_config.replace(hidden_act="relu")).save_pretrained(saved)
    assert not (saved / "stale.txt").exists()
    assert json.loads((saved / "config.json").read_text())["hidden_act"] == "relu"
    assert leftovers(saved.parent) == []


# --- broken checkpoints ----------------------------------------------------------------------------------

def test_checkpoint_format_load_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'nope'}: not a model directory"):
        BertModel.from_pretrained(tmp_path / "nope")


def test_checkpoint_format_load_missing_config(saved):
    (saved / "config.json").unlink()
    with pytest.raises(CheckpointError, match=rf"{saved / 'config.json'}: missing"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_malformed_config(saved):
    (saved / "config.json").write_text("{\"hidden_size\": ")
    with pytest.raises(CheckpointError, match=rf"{saved / 'config.json'}: cannot read this config.json as JSON"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_unknown_config_key_names_file_and_key(saved):
    edit_config(saved, hidden_sise=64)
    with pytest.raises(ConfigError, match=rf"{saved / 'config.json'}: unknown BertConfig key\(s\) \['hidden_sise'\]"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_invalid_config_value_names_file_and_field(saved):
    edit_config(saved, hidden_act="swish")
    with pytest.raises(ConfigError, match=rf"{saved / 'config.json'}: BertConfig\.hidden_act='swish'"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_other_model_type(saved):
    edit_config(saved, model_type="roberta")
    with pytest.raises(ConfigError, match="model_type is 'roberta'"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_missing_weights(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=rf"{saved}: no weights found; expected model.safetensors"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_corrupt_safetensors_names_file(saved):
    unverified(saved)
    (saved / "model.safetensors").write_bytes(b"\x13\x37 definitely not safetensors" * 10)
    with pytest.raises(CheckpointError, match=rf"{saved / 'model.safetensors'}: weights are unreadable or corrupt"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_truncated_safetensors_names_file(saved):
    data = (saved / "model.safetensors").read_bytes()
    (unverified(saved) / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{saved / 'model.safetensors'}: weights are unreadable"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_corrupt_pytorch_bin_names_file(saved):
    (saved / "model.safetensors").unlink()
    (saved / "pytorch_model.bin").write_bytes(b"garbage, not a pickle")
    with pytest.raises(CheckpointError, match=rf"{saved / 'pytorch_model.bin'}: weights are unreadable"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_mis_shaped_tensor_names_file_and_key(saved):
    rewrite_weights(saved, lambda t: t.__setitem__(QUERY_KEY, torch.zeros(32, 16)))
    with pytest.raises(CheckpointError, match=rf"{saved / 'model.safetensors'}: mis-shaped tensors "
                                              rf"\['{QUERY_KEY}: stored \(32, 16\), model \(32, 32\)'\]"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_config_that_does_not_match_weights(saved):
    edit_config(saved, intermediate_size=40)
    with pytest.raises(CheckpointError, match="config.json does not match the weights"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_missing_encoder_tensor_names_file_and_key(saved):
    rewrite_weights(saved, lambda t: t.pop(QUERY_KEY))
    with pytest.raises(CheckpointError, match=rf"{saved / 'model.safetensors'}: missing tensors \['{QUERY_KEY}'\]"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_foreign_tensor_names_it(saved):
    rewrite_weights(saved, lambda t: t.__setitem__("encoder.rotary.inv_freq", torch.zeros(4)))
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['encoder.rotary.inv_freq'\].*is this a BERT"):
        BertModel.from_pretrained(saved)


def test_checkpoint_format_load_sharded_safetensors(saved):
    tensors = load_file(str(saved / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(saved / shard))
    (saved / "model.safetensors").unlink()
    weight_map = {k: shard for shard, keys in halves.items() for k in keys}
    (saved / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = BertModel.from_pretrained(saved)
    torch.testing.assert_close(loaded.embeddings.word.weight, tensors["embeddings.word_embeddings.weight"])


# --- heads between tasks ---------------------------------------------------------------------------------

def test_checkpoint_format_encoder_checkpoint_starts_fresh_head(saved):
    _, report = load_model(saved, BertForSequenceClassification)
    assert report.fresh == ["classifier.bias", "classifier.weight"] and report.skipped == []


def test_checkpoint_format_registry_load_fast_path_switch(saved):
    # Fast paths on by default; fast_path=False is the plain reference path (padded, unfused), not the
    # constructor's default layout (a fresh BertModel starts unpadded), so export can trace one graph.
    fast, _ = registry.load_model(saved)
    assert fast_paths_enabled(fast) == {"unpad": True, "fused_qkv": True,
                                          "activation_checkpointing": False}
    plain, _ = registry.load_model(saved, fast_path=False)
    assert fast_paths_enabled(plain) == {"unpad": False, "fused_qkv": False,
                                          "activation_checkpointing": False}
    assert plain.state_dict().keys() == fast.state_dict().keys()


def test_checkpoint_format_report_is_returned_not_attached(saved):
    # The loader's report is its return value; nothing is attached to the model it builds.
    model, report = load_model(saved, BertForSequenceClassification)
    assert isinstance(report, LoadReport) and report.source == str(saved / "model.safetensors")
    assert report.fresh == ["classifier.bias", "classifier.weight"]
    assert not hasattr(model, "load_report")
    model, report = registry.load_model(saved, BertForSequenceClassification)
    assert isinstance(report, LoadReport) and not hasattr(model, "load_report")
    assert not hasattr(BertForSequenceClassification.from_pretrained(saved), "load_report")


def test_checkpoint_format_pretraining_checkpoint_feeds_token_level_tasks(tmp_path, tiny_config):
    # A pretraining checkpoint has a pooler and MLM/NSP heads that token-level models do not have.
    BertForPretraining(tiny_config).save_pretrained(tmp_path)
    for cls in (BertForTokenClassification, BertForQuestionAnswering):
        _, report = load_model(tmp_path, cls)
        assert "bert.pooler.dense.weight" in report.skipped
        assert "cls.predictions.bias" in report.skipped


def test_checkpoint_format_token_level_checkpoint_feeds_classifier_with_fresh_pooler(tmp_path, tiny_config):
    BertForQuestionAnswering(tiny_config).save_pretrained(tmp_path)
    _, report = load_model(tmp_path, BertForSequenceClassification)
    assert "bert.pooler.dense.weight" in report.fresh
    assert "qa_outputs.weight" in report.skipped


def test_checkpoint_format_head_with_other_label_count_needs_fresh_head(tmp_path, tiny_config):
    BertForSequenceClassification(tiny_config.with_labels(["a", "b", "c"])).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="another number of outputs than config.json's 2 labels.*id2label.*fresh_head=True"):
        registry.load_model(tmp_path, config_overrides={"id2label": {0: "x", 1: "y"}})
    model, report = registry.load_model(tmp_path, config_overrides={"id2label": {0: "x", 1: "y"}}, fresh_head=True)
    assert type(model) is BertForSequenceClassification
    assert model.config.label_names == ["x", "y"] and model.classifier.out_features == 2
    assert sorted(report.fresh) == ["classifier.bias", "classifier.weight"]


def test_checkpoint_format_read_config_returns_architecture(tmp_path, tiny_config):
    BertForPretraining(tiny_config).save_pretrained(tmp_path)
    config, architecture = read_config(tmp_path)
    assert architecture == "BertForPretraining" and config == tiny_config


def test_checkpoint_format_weights_with_nan_are_refused_naming_the_tensor(tmp_path, tiny_config):
    from safetensors.torch import load_file, save_file

    BertModel(tiny_config).save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(unverified(tmp_path / "m") / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"tensor {name} holds 1 NaN or infinite values"):
        BertModel.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_checkpoint_format_load_initialises_only_what_the_checkpoint_lacks(monkeypatch, tmp_path, tiny_config, arch):
    """Loading an encoder into a classifier draws random numbers for the fresh classifier (and BERT's pooler) only,
    not for every tensor the checkpoint then overwrites (a ModernBERT-base's init was 25 of a load's 31 CPU s);
    the fresh head is initialised as the class initialises it (zero bias, weights of the init's spread)."""
    from bertforge.model.config.modernbert import ModernBertConfig
    from bertforge.model.modernbert import ModernBertForSequenceClassification, ModernBertModel

    torch.manual_seed(0)
    if arch == "bert":
        encoder, cls, draw = BertModel(tiny_config, add_pooling_layer=False), BertForSequenceClassification, "normal_"
    else:
        config = ModernBertConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                  num_attention_heads=2, pad_token_id=0)
        encoder, cls, draw = ModernBertModel(config), ModernBertForSequenceClassification, "trunc_normal_"
    encoder.save_pretrained(tmp_path / "encoder")
    drawn = []
    real = getattr(torch.nn.init, draw)
    monkeypatch.setattr(torch.nn.init, draw, lambda tensor, *a, **k: (drawn.append(tuple(tensor.shape)),
                                                                       real(tensor, *a, **k))[1])
    with weights_to_come():  # what the modules' own constructors draw (torch's defaults: BERT's embeddings)
        cls(encoder.config)
    constructors = len(drawn)
    model, report = load_model(tmp_path / "encoder", cls)
    fresh = set(report.fresh)
    assert fresh and all(k.startswith(("classifier.", "head.", "bert.pooler.")) for k in fresh)
    assert len(drawn) - constructors == constructors + len([k for k in fresh if k.endswith("weight")
                                                             and "norm" not in k])
    state = model.state_dict()
    for key, value in encoder.state_dict().items():
        assert torch.equal(state[model.encoder_prefix + key], value)
    assert (model.classifier.bias == 0).all() and 0 < float(model.classifier.weight.detach().std()) < 1
