"""The embedding family: the bare encoder as a family like the others (registry, options, pooling, the embed
pipeline through the family, export outputs), with the embed outputs pinned to the values the pipelines gave
before `embed` became a family."""

from __future__ import annotations

import json
import string

import pytest
import torch

from bertforge.engine.onnx_export import output_axes
from bertforge.errors import InputError
from bertforge.evaluation import run_features
from bertforge.families import registry
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.embedding import FAMILY as EMBEDDING
from bertforge.families.embedding import encoder_of, pool
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.inference import pipelines as P
from bertforge.model.bert import BertModel
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab import Vocab

WORDS = "the cat sat on mat paris is capital of france john smith lives in london where does live".split()
TEXTS = ["the cat sat on the mat", "john smith lives in london", "where does john live? " * 15]  # the last: cut
OPTIONS = [{}, {"pooling": "cls"}, {"pooling": "max", "normalize": True}, {"layer": 0}, {"pooling": "max", "layer": -2},
           {"normalize": True}]
# Per model and OPTIONS entry, per text: (vector[0], sum of (i + 1) * vector[i]), recorded with the
# EmbedPipeline of before the embedding family (fp32, CPU). Encoder: BertModel, seed 0; classifier: the
# encoder of a BertForSequenceClassification, seed 1.
PINNED = {
    "encoder": [
        [(-0.396524, -15.64893), (0.054607, -18.97386), (-0.513036, -34.2917)],
        [(-0.998872, -25.92946), (-0.99575, -26.08066), (-1.002128, -26.21233)],
        [(0.125147, 79.80408), (0.210912, 74.84265), (0.12429, 87.01069)],
        [(-0.391829, -15.98781), (0.056529, -19.01359), (-0.505786, -34.21427)],
        [(0.912775, 583.32603), (1.664821, 587.39423), (1.337147, 943.53946)],
        [(-0.121397, -4.79098), (0.017955, -6.23859), (-0.154182, -10.30562)],
    ],
    "classifier": [
        [(-0.08789, 9.63667), (0.036815, -7.91822), (-0.08115, -46.18617)],
        [(-0.062205, -31.57917), (-0.062146, -31.4293), (-0.06823, -31.58828)],
        [(0.067676, 80.20811), (0.103081, 74.50616), (0.176845, 81.25412)],
        [(-0.084514, 8.67356), (0.044937, -9.07455), (-0.068393, -46.96238)],
        [(0.57115, 683.14249), (0.783754, 569.18005), (1.839324, 848.33502)],
        [(-0.025598, 2.80665), (0.010041, -2.15973), (-0.022404, -12.75086)],
    ],
}
# Tolerances of the pinned digests: float32 rounding across CPUs, and the 6 / 5 recorded decimals.
FIRST_TOLERANCE = 2e-6
SUM_TOLERANCE = 2e-4


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


def encoder(config: BertConfig) -> BertModel:
    torch.manual_seed(0)
    return BertModel(config).eval()


def classifier(config: BertConfig) -> BertForSequenceClassification:
    torch.manual_seed(1)
    return BertForSequenceClassification(config.with_labels(["x", "y"])).eval()


# --- registry ----------------------------------------------------------------------------------------------

def test_embedding_registry_lookups_find_the_family():
    assert registry.for_task("embed") is EMBEDDING
    assert all(registry.family(name) is EMBEDDING for name in ("embedding", "embed", "sentence embedding"))
    assert registry.FAMILIES[-1] is EMBEDDING and registry.FINETUNING_FAMILIES[-1] is EMBEDDING
    assert registry.TASKS == ("classify", "tag", "answer", "choose", "fill-mask", "rerank", "embed-sparse",
                              "embed-multi-vector", "embed")
    assert sorted(registry.MODEL_CLASSES) == [
        "BertForColBERT", "BertForMaskedLM", "BertForMultipleChoice", "BertForPretraining", "BertForQuestionAnswering",
        "BertForSequenceClassification", "BertForSparseEmbedding", "BertForTokenClassification", "BertModel",
        "ModernBertForColBERT", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
        "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification", "ModernBertForSparseEmbedding",
        "ModernBertForTokenClassification", "ModernBertModel"]
    assert registry.for_model(BertModel) is EMBEDDING


@pytest.mark.parametrize("cls, task", [
    (BertForSequenceClassification, "classify"), (BertForTokenClassification, "tag"),
    (BertForQuestionAnswering, "answer"), (BertForMultipleChoice, "choose"), (BertForPretraining, "fill-mask"),
])
def test_embedding_registry_maps_task_models_to_their_own_family(cls, task):
    assert registry.for_model(cls) is registry.for_task(task) is not EMBEDDING
    assert P.serves(cls, EMBEDDING) and P.serves(cls, registry.for_task(task))  # any encoder serves embed


# --- options -----------------------------------------------------------------------------------------------

def test_embedding_check_options_is_the_family_check_naming_unknown_options(config):
    with pytest.raises(InputError, match=r"unknown option\(s\) \['poolin'\] for embed; known: \['layer', "
                                         r"'normalize', 'pooling', 'token_vectors'\]"):
        EMBEDDING.check_options({"poolin": "cls"})
    assert EMBEDDING.check_options({"pooling": "cls"}) == {"pooling": "cls", "normalize": False, "layer": -1,
                                                           "token_vectors": False}
    for bad, message in [({"pooling": "sum"}, "pooling must be one of"), ({"normalize": 1}, "normalize must be"),
                         ({"layer": "x"}, "layer must be an integer"), ({"layer": True}, "layer must be an integer")]:
        with pytest.raises(InputError, match=message):
            EMBEDDING.check_options(bad)
    EMBEDDING.check_options({"layer": 7})  # in range or not: only the model's depth says
    with pytest.raises(InputError, match=r"layer must be an integer in \[-3, 2\] \(-1 = last\), got 3"):
        EMBEDDING.check_options({"layer": 3}, config)


def test_embedding_pipeline_options_are_the_family_options(tokenizer, config):
    pipe = P.make_pipeline("embed", encoder(config), tokenizer, precision="fp32")
    assert pipe.family is EMBEDDING and pipe.defaults == EMBEDDING.options
    with pytest.raises(InputError, match=r"unknown option\(s\) \['top_k'\] for embed"):
        pipe("the cat", top_k=3)
    with pytest.raises(InputError, match=r"layer must be an integer in \[-3, 2\]"):
        pipe("the cat", layer=-4)


# --- pooling and the one path ------------------------------------------------------------------------------

def test_embedding_pool_counts_real_tokens_only():
    hidden = torch.tensor([[[1.0, 4.0], [3.0, -2.0], [100.0, 100.0]],
                           [[2.0, 0.0], [-50.0, 50.0], [50.0, -50.0]]])  # [B=2, T=3, H=2]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 1.0], [2.0, 0.0]]))
    torch.testing.assert_close(pool(hidden, mask, "max"), torch.tensor([[3.0, 4.0], [2.0, 0.0]]))
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, 4.0], [2.0, 0.0]]))


@pytest.mark.parametrize("name, build", [("encoder", encoder), ("classifier", classifier)])
def test_embedding_outputs_equal_the_pinned_embed_outputs(tokenizer, config, name, build):
    pipe = P.make_pipeline("embed", build(config), tokenizer, precision="fp32", device="cpu")
    assert pipe.max_length == 64
    for options, pinned in zip(OPTIONS, PINNED[name]):
        for result, (first, weighted) in zip(pipe(TEXTS, **options), pinned):
            vector = result["embedding"]
            assert len(vector) == config.hidden_size
            assert vector[0] == pytest.approx(first, abs=FIRST_TOLERANCE), options
            assert sum((i + 1) * v for i, v in enumerate(vector)) == pytest.approx(weighted, abs=SUM_TOLERANCE), options


def test_embedding_pipeline_runs_the_family_steps(tokenizer, config):
    model = classifier(config)
    pipe = P.make_pipeline("embed", model, tokenizer, precision="fp32", device="cpu")
    options = EMBEDDING.check_options({"pooling": "max", "layer": 1}, config)
    features = EMBEDDING.features(TEXTS, tokenizer, pipe.settings, config=config)
    assert [len(f.input_ids) for f in features] == [8, 7, 64]  # one window each, the long text cut to it
    outputs = run_features(model, features, lambda m, b: EMBEDDING.forward(m, b, options), batch_size=2,
                           pad_token_id=tokenizer.pad_token_id, device="cpu")
    direct = EMBEDDING.decode(TEXTS, features, outputs, options, config)
    assert json.dumps(pipe(TEXTS, pooling="max", layer=1)) == json.dumps(direct)
    assert encoder_of(model) is model.bert and encoder_of(model.bert) is model.bert


def test_embedding_route_is_refused_by_the_plain_pipeline_class(tokenizer, config):
    with pytest.raises(InputError, match=r"runs through EmbedPipeline"):
        P.Pipeline("embed", encoder(config), tokenizer)


def test_embedding_ignores_the_record_of_another_family(tmp_path, tokenizer, config):
    classifier(config).save_pretrained(tmp_path / "clf", tokenizer=tokenizer)
    (tmp_path / "clf" / "finetuning.json").write_text(json.dumps({"max_seq_length": 16, "doc_stride": 8}))
    pipelines = P.load_pipelines(tmp_path / "clf", precision="fp32", device="cpu")
    assert list(pipelines) == ["classify", "embed"]
    assert pipelines["classify"].max_length == 16 and pipelines["embed"].max_length == 64
    assert pipelines["embed"].family_name == "embedding"
    assert pipelines["embed"].description.startswith("Sentence vectors from any model's encoder.")


# --- export ------------------------------------------------------------------------------------------------

def test_embedding_export_outputs_are_what_the_bare_encoder_returns(config):
    tokens, batch = {0: "batch", 1: "sequence"}, {0: "batch"}
    assert output_axes(encoder(config), EMBEDDING) == {"last_hidden_state": tokens, "pooled_output": batch}
    assert output_axes(BertModel(config, add_pooling_layer=False).eval(), EMBEDDING) == {"last_hidden_state": tokens}
    assert registry.for_model(encoder(config)).input_axes == tokens
