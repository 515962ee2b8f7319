"""Google's TensorFlow 1 BERT checkpoints (`bertforge.interop.google_tf`): names, layout, directories, models.

The fixtures in tests/fixtures/google_tf/ were written by real TensorFlow (scripts/write_google_tf_fixtures.py,
see the README there); `expected.npz` holds every variable the script stored, for bitwise comparison. The file
format alone (checksums, varints, tensor decoding, each kind of damage) is tested in test_interop_tf_bundle.py;
its `write_bundle` makes the bundles TensorFlow would not write here (fine-tuned heads, an unknown dtype).
"""

from __future__ import annotations

import ast
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

# The bundle writer is the format's, tested there; this file writes Google's names with it.
from test_interop_tf_bundle import release_tensors, write_bundle

from bertforge import checkpoint_format
from bertforge.errors import CheckpointError
from bertforge.families import registry
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.interop import google_tf, tf_bundle
from bertforge.interop import huggingface as hf
from bertforge.model.bert import BertModel
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.tokenizer_files import google_do_lower_case

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "google_tf"
RELEASE = FIXTURES / "uncased_L-2_H-32_A-4"
RUN = FIXTURES / "pretraining_output"
DTYPES = FIXTURES / "dtypes" / "dtypes.ckpt"
WORD = "bert/embeddings/word_embeddings"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected.npz") as data:
        return {k: data[k] for k in data.files}


def stored(expected, step: int = 20) -> dict[str, np.ndarray]:
    """The model variables the fixture script saved at `step` (the release holds step 20's)."""
    prefix = f"step{step}/"
    return {k[len(prefix):]: v for k, v in expected.items() if k.startswith(prefix)}


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def google_directory(tmp_path: Path, name: str, extra: dict[str, np.ndarray]) -> Path:
    """A release-layout directory holding the fixture's weights plus `extra` float32 tensors."""
    folder = tmp_path / name
    folder.mkdir()
    for file in ("bert_config.json", "vocab.txt"):
        shutil.copy(RELEASE / file, folder / file)
    tensors = release_tensors()
    tensors.update({k: (1, v.shape, v.astype("<f4").tobytes()) for k, v in extra.items()})
    write_bundle(folder / "bert_model.ckpt", tensors)
    return folder


def test_google_tf_names_module_imports_no_tensorflow():
    source = Path(google_tf.__file__).read_text(encoding="utf-8")
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= {"__future__", "logging", "os", "re", "dataclasses", "pathlib", "numpy", "bertforge"}, modules


# --- names -----------------------------------------------------------------------------------------------

HEAD_NAMES = ("output_weights", "output_bias", "cls/squad/output_weights", "cls/squad/output_bias")


def our_names(tiny_config) -> set[str]:
    """Every parameter name of the pretraining model, the classifier and the QA model (encoder under bert.)."""
    names = set(BertForPretraining(tiny_config).state_dict())
    for cls in (BertForSequenceClassification, BertForQuestionAnswering):
        names |= {k for k in cls(tiny_config).state_dict() if not k.startswith("bert.")}
    return names


def test_google_tf_key_table_is_bijective_and_complete(tiny_config, expected):
    google_names = set(stored(expected)) | set(HEAD_NAMES)
    ours = {}
    for name in google_names:
        found = google_tf.from_google_key(name)
        assert found is not None, name
        assert google_tf.to_google_key(found[0]) == name
        ours[name] = found[0]
    assert len(set(ours.values())) == len(ours), "two Google names map to one parameter"
    # Complete: every parameter of our models (the tied MLM decoder has none of its own) has a Google name.
    assert set(ours.values()) == our_names(tiny_config)
    for name in our_names(tiny_config):
        assert google_tf.from_google_key(google_tf.to_google_key(name))[0] == name
    # And each has a Hugging Face name, the form checkpoint_format reads.
    assert all(hf.from_hf_key(hf.to_hf_key(n)) == n for n in ours.values())
    assert google_tf.from_google_key("bert/encoder/layer_11/output/LayerNorm/gamma") == (
        "bert.encoder.layers.11.feed_forward.norm.weight", False)
    assert google_tf.from_google_key("bert/encoder/layer_0/attention/self/query/kernel/adam_m") is None
    with pytest.raises(KeyError):
        google_tf.to_google_key("bert.embeddings.nope.weight")


def test_google_tf_kernels_are_transposed_and_output_weights_are_not(expected):
    values = stored(expected)
    tensors = google_tf.read_google_weights(RELEASE / "bert_model.ckpt").tensors
    up = tensors["bert.encoder.layers.1.feed_forward.up.weight"]
    assert up.shape == (37, 32) and bitwise_equal(up, values["bert/encoder/layer_1/intermediate/dense/kernel"].T.copy())
    assert bitwise_equal(tensors["bert.encoder.layers.0.attention.query.weight"],
                         values["bert/encoder/layer_0/attention/self/query/kernel"].T.copy())
    assert bitwise_equal(tensors["mlm.transform.weight"], values["cls/predictions/transform/dense/kernel"].T.copy())
    assert tensors["nsp.weight"].shape == (2, 32)
    assert bitwise_equal(tensors["nsp.weight"], values["cls/seq_relationship/output_weights"])
    assert bitwise_equal(tensors["mlm.bias"], values["cls/predictions/output_bias"])
    assert bitwise_equal(tensors["bert.embeddings.norm.weight"], values["bert/embeddings/LayerNorm/gamma"])


def test_google_tf_optimizer_slots_are_skipped_and_counted():
    run = google_tf.read_google_weights(RUN / "model.ckpt-20")
    model_variables = 46
    assert len(run.tensors) == model_variables and not run.unknown
    assert len(run.optimizer) == 2 * model_variables + 1
    assert {n.rsplit("/", 1)[-1] for n in run.optimizer} == {"adam_m", "adam_v", "global_step"}
    assert not any(google_tf.is_optimizer_state(n) for n in google_tf.read_google_weights(
        RELEASE / "bert_model.ckpt").tensors)
    _, report = checkpoint_format.load_model(RUN, BertForPretraining)
    assert sorted(report.skipped) == sorted(run.optimizer)
    _, report = checkpoint_format.load_model(RELEASE, BertForPretraining)
    assert report.skipped == []
    for name in ("bad_steps", "good_steps", "loss_scale", "current_loss_scale", "beta1_power", "x/Adam_1"):
        assert google_tf.is_optimizer_state(name)


# --- directories and models ------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", [RELEASE, RUN], ids=["release", "pretraining_output"])
@pytest.mark.parametrize("cls", [BertModel, BertForPretraining, BertForSequenceClassification])
def test_google_tf_models_load_both_directories(folder, cls, expected):
    values = stored(expected)
    model = cls.from_pretrained(folder)
    state = {k: v for k, v in model.state_dict().items()}
    prefix = cls.encoder_prefix
    word = state[f"{prefix}embeddings.word.weight"]
    assert torch.equal(word, torch.from_numpy(values[WORD]))
    if f"{prefix}encoder.layers.1.feed_forward.down.weight" in state:
        assert torch.equal(state[f"{prefix}encoder.layers.1.feed_forward.down.weight"],
                           torch.from_numpy(values["bert/encoder/layer_1/output/dense/kernel"].T.copy()))
    _, report = checkpoint_format.load_model(folder, cls)
    if cls is BertForSequenceClassification:
        assert report.fresh_in(("classifier.",)) == ["classifier.bias", "classifier.weight"]
    else:
        assert report.fresh == []
    if cls is BertForPretraining:
        assert torch.equal(model.mlm.bias, torch.from_numpy(values["cls/predictions/output_bias"]))
        assert torch.equal(model.nsp.weight, torch.from_numpy(values["cls/seq_relationship/output_weights"]))
    config, architecture = checkpoint_format.read_config(folder)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (99, 32, 37)
    assert architecture == "BertForPretraining"


def test_google_tf_outputs_equal_transformers(expected):
    transformers = pytest.importorskip("transformers")
    config, _ = checkpoint_format.read_config(RELEASE)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)).eval()
    # Their model built from the same stored tensors, named by hand-independent route: Google -> ours -> theirs.
    tensors = {hf.to_hf_key(k): torch.from_numpy(v)
               for k, v in google_tf.read_google_weights(RELEASE / "bert_model.ckpt").tensors.items()}
    result = theirs.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys
    assert all(hf.is_redundant_hf_key(k) for k in result.missing_keys), result.missing_keys
    theirs.tie_weights()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, 17), generator=generator)
    types = (torch.arange(17) >= 9).long().expand(3, -1)
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    with torch.no_grad():
        reference = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        for fast_path in (False, True):
            encoder = BertModel.from_pretrained(RELEASE, fast_path=fast_path)
            ours = BertForPretraining.from_pretrained(RUN, fast_path=fast_path)  # step 20 = the release's weights
            hidden = encoder(ids, types, mask).last_hidden_state
            out = ours(ids, types, mask)
            real = mask.bool()
            torch.testing.assert_close(hidden[real], reference.hidden_states[-1][real], rtol=0, atol=1e-5)
            torch.testing.assert_close(out.mlm_logits[real], reference.prediction_logits[real], rtol=0, atol=1e-5)
            torch.testing.assert_close(out.nsp_logits, reference.seq_relationship_logits, rtol=0, atol=1e-5)


def test_google_tf_checkpoint_file_picks_the_latest_and_step_picks_another(tmp_path, expected):
    assert google_tf.available_steps(RUN) == [10, 20]
    assert checkpoint_format.weights_file(RUN).name == "model.ckpt-20.index"
    model = BertModel.from_pretrained(RUN, step=10)
    assert torch.equal(model.embeddings.word.weight, torch.from_numpy(stored(expected, 10)[WORD]))
    assert torch.equal(BertModel.from_pretrained(RUN).embeddings.word.weight,
                       torch.from_numpy(stored(expected, 20)[WORD]))
    with pytest.raises(CheckpointError, match=r"step 30.*\[10, 20\]"):
        BertModel.from_pretrained(RUN, step=30)
    # The checkpoint file as a TPU run writes it: absolute gs:// paths of another machine.
    run = copy_dir(RUN, tmp_path / "run")
    (run / "checkpoint").write_text('model_checkpoint_path: "gs://bucket/run/model.ckpt-10"\n'
                                    'all_model_checkpoint_paths: "gs://bucket/run/model.ckpt-10"\n')
    assert checkpoint_format.weights_file(run).name == "model.ckpt-10.index"
    (run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-99"\n')
    with pytest.raises(CheckpointError, match=r"model\.ckpt-99"):
        checkpoint_format.weights_file(run)
    (run / "checkpoint").unlink()  # no checkpoint file: the highest step
    assert checkpoint_format.weights_file(run).name == "model.ckpt-20.index"
    (run / "bert_config.json").unlink()
    with pytest.raises(CheckpointError, match="bert_config.json.*--bert_config_file"):
        BertModel.from_pretrained(run)


def test_google_tf_release_directory_reads_as_one_model_directory():
    directory = checkpoint_format.read_directory(RELEASE)
    assert directory.architecture == "BertForPretraining"
    assert directory.tokenizer is not None and directory.tokenizer.vocab_size == 99
    assert directory.tokenizer.model_max_length == 64  # from bert_config.json
    assert directory.finetuning is None
    assert directory.tokenizer.vocab[directory.tokenizer.config.mask_token] == 4
    model, report = registry.load_model(RUN)  # the class from the heads the checkpoint holds
    assert isinstance(model, BertForPretraining) and report.source.endswith("model.ckpt-20.index")


def test_google_tf_fine_tuned_heads_load_untransposed(tmp_path):
    rng = np.random.default_rng(1)
    classifier = rng.normal(size=(3, 32)).astype(np.float32)
    folder = google_directory(tmp_path, "mnli_output", {"output_weights": classifier,
                                                        "output_bias": np.arange(3, dtype=np.float32)})
    config, architecture = checkpoint_format.read_config(folder)
    assert architecture == "BertForSequenceClassification" and config.num_labels == 3
    model = BertForSequenceClassification.from_pretrained(folder)
    assert torch.equal(model.classifier.weight, torch.from_numpy(classifier))
    assert torch.equal(model.classifier.bias, torch.arange(3, dtype=torch.float32))
    squad = rng.normal(size=(2, 32)).astype(np.float32)
    folder = google_directory(tmp_path, "squad_output", {"cls/squad/output_weights": squad,
                                                         "cls/squad/output_bias": np.ones(2, np.float32)})
    assert checkpoint_format.read_config(folder)[1] == "BertForQuestionAnswering"
    model, report = checkpoint_format.load_model(folder, BertForQuestionAnswering)
    assert torch.equal(model.qa_outputs.weight, torch.from_numpy(squad)) and report.fresh == []


# --- damage: the format's CheckpointError reaches the caller of from_pretrained -------------------------

def _flip_shard_byte(folder: Path) -> None:
    data = folder / "bert_model.ckpt.data-00000-of-00001"
    offset = tf_bundle.TensorBundle(folder / "bert_model.ckpt").entries[WORD].offset
    raw = bytearray(data.read_bytes())
    raw[offset + 101] ^= 0x10
    data.write_bytes(bytes(raw))


def _flip_index_byte(folder: Path) -> None:
    index = folder / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[40] ^= 0x01
    index.write_bytes(bytes(raw))


def _unknown_dtype(folder: Path) -> None:
    tensors = release_tensors()
    _, shape, raw = tensors[WORD]
    tensors[WORD] = (99, shape, raw)
    write_bundle(folder / "bert_model.ckpt", tensors)


@pytest.mark.parametrize(("damage", "file", "words"), [
    (_flip_shard_byte, "bert_model.ckpt.data-00000-of-00001", ("checksum", repr(WORD))),
    (lambda folder: (folder / "bert_model.ckpt.data-00000-of-00001").unlink(), "bert_model.ckpt.data-00000-of-00001",
     ("missing shard", "tensor 'bert/")),
    (_flip_index_byte, "bert_model.ckpt.index", ("checksum mismatch in the index",)),
    (_unknown_dtype, "bert_model.ckpt.index", ("unknown DataType enum 99", repr(WORD))),
], ids=["flipped_shard_byte", "missing_shard", "flipped_index_byte", "unknown_dtype"])
@pytest.mark.parametrize("cls", [BertModel, BertForPretraining])
def test_google_tf_damaged_checkpoint_fails_loading_naming_file_and_tensor(tmp_path, damage, file, words, cls):
    folder = copy_dir(RELEASE, tmp_path / "uncased_L-2_H-32_A-4")
    damage(folder)
    with pytest.raises(CheckpointError) as error:
        cls.from_pretrained(folder)
    message = str(error.value)
    assert str(folder / file) in message and all(word in message for word in words), message


# --- casing ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "lower"), [
    ("uncased_L-12_H-768_A-12", True), ("cased_L-24_H-1024_A-16", False), ("multi_cased_L-12_H-768_A-12", False),
    ("multilingual_L-12_H-768_A-12", True), ("chinese_L-12_H-768_A-12", True), ("multi_uncased_L-12", True),
    ("wwm_cased_L-24_H-1024_A-16", False), ("wwm_uncased_L-24_H-1024_A-16", True), ("my_bert", None),
])
def test_google_tf_casing_rule_by_model_name(name, lower):
    assert google_do_lower_case(name) is lower


def test_google_tf_casing_follows_the_directory_name_and_can_be_overridden(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="bertforge.tokenization.tokenizer_files")
    assert Tokenizer.from_pretrained(RELEASE).config.do_lower_case is True
    assert "do_lower_case=True" in caplog.text and "uncased_L-2_H-32_A-4" in caplog.text
    assert Tokenizer.from_pretrained(RELEASE).tokenize("The") == ["the"]
    cased = tmp_path / "cased_L-2_H-32_A-4"
    cased.mkdir()
    for file in ("bert_config.json", "vocab.txt"):
        shutil.copy(RELEASE / file, cased / file)
    assert Tokenizer.from_pretrained(cased).config.do_lower_case is False
    assert Tokenizer.from_pretrained(cased).tokenize("The") == ["[UNK]"]
    assert checkpoint_format.load_tokenizer(cased).config.do_lower_case is False
    unnamed = tmp_path / "my_bert"
    shutil.copytree(cased, unnamed)
    assert Tokenizer.from_pretrained(unnamed).config.do_lower_case is True  # the default
    assert Tokenizer.from_pretrained(RELEASE, do_lower_case=False).config.do_lower_case is False
    assert Tokenizer.from_pretrained(cased, do_lower_case=True).config.do_lower_case is True
    assert checkpoint_format.read_directory(RELEASE, do_lower_case=False).tokenizer.config.do_lower_case is False
    # Our own directories keep their recorded casing unless overridden.
    ours = tmp_path / "ours"
    Tokenizer.from_pretrained(cased).save_pretrained(ours)
    assert Tokenizer.from_pretrained(ours).config.do_lower_case is False
    assert Tokenizer.from_pretrained(ours, do_lower_case=True).config.do_lower_case is True
