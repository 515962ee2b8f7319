"""Parity of our ModernBERT (`model/modernbert.py`) with transformers' on tiny random configs, and the
Hugging Face directory format both ways.

Each test builds our model, copies its weights into the matching transformers class through our key
table (`interop.modernbert`, so the table is exercised), runs both on the same batch and compares every
layer's hidden states at the real positions: lengths 8 (a window of 4 so that local layers still cut) and
512 (the released window of 128), padded and unpadded batches, both of our layouts (padded + banded mask,
and only the real tokens, attended per sequence), global and local layers. The reference runs its eager and
SDPA paths on CPU (no flash attention).
"""

from __future__ import annotations

import json

import pytest
import torch

from bertforge import checkpoint_format
from bertforge.checkpoint_format import hf_state_dict
from bertforge.families import registry
from bertforge.families.multiple_choice import ModernBertForMultipleChoice
from bertforge.families.question_answering import ModernBertForQuestionAnswering
from bertforge.families.tagging import ModernBertForTokenClassification
from bertforge.interop import modernbert as hf_modernbert
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.model.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertModel,
)

transformers = pytest.importorskip("transformers")

# Same float32 math in a different order: agreement to rounding noise.
FP32_ATOL = 1e-5

CLASSES = (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
           ModernBertForTokenClassification, ModernBertForQuestionAnswering, ModernBertForMultipleChoice)


def tiny(**overrides) -> ModernBertConfig:
    """4 layers (global, local, local, global ... by global_attn_every_n_layers=3: layers 0 and 3 global)."""
    fields = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
              "num_attention_heads": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
              "cls_token_id": 1, "sep_token_id": 2, "id2label": {0: "a", 1: "b", 2: "c"}}
    return ModernBertConfig(**{**fields, **overrides})


def reference_config(config: ModernBertConfig, architecture: str, attention: str = "sdpa"):
    """Their config for ours, through our own config.json translation."""
    data = hf_modernbert.config_to_hf(config.to_dict(), architecture)
    return transformers.ModernBertConfig.from_dict(data, attn_implementation=attention)


def twins(cls, config, attention: str = "sdpa", seed: int = 0):
    """(ours on the plain padded path, theirs holding the same weights)."""
    torch.manual_seed(seed)
    ours = set_fast_paths(cls(config).eval(), unpad=False)
    theirs = getattr(transformers, cls.__name__)(reference_config(config, cls.__name__, attention)).eval()
    assert theirs.config._attn_implementation == attention  # their eager or SDPA path on CPU, never flash
    missing, unexpected = theirs.load_state_dict(hf_state_dict(ours), strict=False)
    assert not unexpected, f"keys the reference does not know: {unexpected}"
    assert all(hf_modernbert.is_redundant_hf_key(k) for k in missing), f"reference keys we did not provide: {missing}"
    return ours, theirs


def batch(config, tokens: int, padded: bool, rows: int = 3, seed: int = 1):
    """Random ids; when `padded`, rows end early (the last row after a few tokens: its padding queries sit
    far beyond any real token, where a local layer's window holds only padding)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, config.vocab_size, (rows, tokens), generator=generator)
    mask = torch.ones(rows, tokens, dtype=torch.long)
    if padded:
        for row, length in enumerate([tokens, tokens - tokens // 3, max(2, tokens // 8)][:rows]):
            mask[row, length:] = 0
            input_ids[row, length:] = config.pad_token_id
    return {"input_ids": input_ids, "attention_mask": mask}


def assert_real_close(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor, what: str,
                      atol: float = FP32_ATOL) -> float:
    """Compare at the real positions ([B, T, ...] tensors); returns max |Δ|."""
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=atol, rtol=1e-5, msg=lambda m: f"{what}: {m}")
    return float((ours[real] - theirs[real]).abs().max())


def assert_layers_close(ours, theirs, mask) -> None:
    assert len(ours) == len(theirs), f"{len(ours)} hidden states vs reference {len(theirs)}"
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert_real_close(a, b, mask, "embeddings output" if index == 0 else f"layer {index} output")


CASES = [  # (tokens, local_attention, reference attention)
    (8, 4, "eager"), (8, 4, "sdpa"), (512, 128, "sdpa")]


@pytest.mark.parametrize("tokens,window,attention", CASES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded_batch", "padded_batch"])
@pytest.mark.parametrize("unpad", [False, True], ids=["padded_layout", "unpadded_layout"])
def test_modernbert_model_matches_reference_per_layer(tokens, window, attention, padded, unpad):
    config = tiny(local_attention=window)
    assert {"full_attention", "sliding_attention"} == set(config.attention_kinds)
    assert tokens > window  # local layers see less than the sequence
    ours, theirs = twins(ModernBertModel, config, attention)
    set_fast_paths(ours, unpad=unpad)
    inputs = batch(config, tokens, padded)
    with torch.no_grad():
        out = ours(**inputs, output_hidden_states=True)
        ref = theirs(**inputs, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states, inputs["attention_mask"])
    assert_real_close(out.last_hidden_state, ref.last_hidden_state, inputs["attention_mask"], "last hidden state")


@pytest.mark.parametrize("layer_types", [["sliding_attention", "full_attention", "sliding_attention"],
                                         ["full_attention"] * 3])
def test_modernbert_layer_types_and_biases_match_reference(layer_types):
    # An explicit layer_types (transformers 5's key), every optional bias on, other rotary bases.
    config = tiny(num_hidden_layers=3, layer_types=layer_types, local_attention=8, attention_bias=True,
                  mlp_bias=True, norm_bias=True, classifier_bias=True, global_rope_theta=1000.0,
                  local_rope_theta=500.0, hidden_activation="gelu_pytorch_tanh")
    ours, theirs = twins(ModernBertForMaskedLM, config)
    inputs = batch(config, 40, padded=True)
    with torch.no_grad():
        out = ours(**inputs, output_hidden_states=True)
        ref = theirs(**inputs, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states, inputs["attention_mask"])
    assert_real_close(out.logits, ref.logits, inputs["attention_mask"], "MLM logits")


@pytest.mark.parametrize("unpad", [False, True], ids=["padded_layout", "unpadded_layout"])
@pytest.mark.parametrize("tokens,window", [(8, 4), (512, 128)])
def test_modernbert_heads_match_reference(tokens, window, unpad):
    config = tiny(local_attention=window)
    inputs = batch(config, tokens, padded=True)
    mask = inputs["attention_mask"]
    with torch.no_grad():
        ours, theirs = twins(ModernBertForMaskedLM, config)
        set_fast_paths(ours, unpad=unpad)
        assert_real_close(ours(**inputs).logits, theirs(**inputs).logits, mask, "MLM logits")
        ours, theirs = twins(ModernBertForTokenClassification, config)
        set_fast_paths(ours, unpad=unpad)
        assert_real_close(ours(**inputs).logits, theirs(**inputs).logits, mask, "token logits")
        for pooling in ("cls", "mean"):
            ours, theirs = twins(ModernBertForSequenceClassification, config.replace(classifier_pooling=pooling))
            set_fast_paths(ours, unpad=unpad)
            torch.testing.assert_close(ours(**inputs).logits, theirs(**inputs).logits, atol=FP32_ATOL, rtol=1e-5,
                                       msg=lambda m, p=pooling: f"sequence logits, {p} pooling: {m}")


@pytest.mark.slow
def test_modernbert_model_matches_reference_at_8192_tokens():
    config = tiny(hidden_size=16, intermediate_size=24, num_hidden_layers=3, vocab_size=50)
    ours, theirs = twins(ModernBertModel, config)
    inputs = batch(config, 8192, padded=True, rows=2)
    for unpad in (False, True):
        set_fast_paths(ours, unpad=unpad)
        with torch.no_grad():
            out = ours(**inputs, output_hidden_states=True)
            ref = theirs(**inputs, output_hidden_states=True)
        assert_layers_close(out.hidden_states, ref.hidden_states, inputs["attention_mask"])


def test_modernbert_key_table_is_bijective_and_complete():
    # Every one of their parameter names maps to one of ours and back, for every class and every bias.
    for config in (tiny(), tiny(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True)):
        for cls in CLASSES:
            theirs = getattr(transformers, cls.__name__)(reference_config(config, cls.__name__))
            their_keys = {k for k in theirs.state_dict() if not hf_modernbert.is_redundant_hf_key(k)}
            ours = {hf_modernbert.from_hf_key(k) for k in their_keys}
            assert None not in ours, [k for k in their_keys if hf_modernbert.from_hf_key(k) is None]
            assert len(ours) == len(their_keys)
            assert {hf_modernbert.to_hf_key(k) for k in ours} == their_keys
            assert ours == set(cls(config).state_dict()), cls.__name__


def test_modernbert_bf16_padded_batches_have_no_nan():
    # Padding queries beyond a local window see only padding keys: each keeps itself, so nothing turns NaN,
    # and mean pooling (which sums every position) stays finite.
    config = tiny(local_attention=16, classifier_pooling="mean")
    torch.manual_seed(0)
    model = ModernBertForSequenceClassification(config).eval().to(torch.bfloat16)
    inputs = batch(config, 256, padded=True)
    for unpad in (False, True):
        set_fast_paths(model, unpad=unpad)
        with torch.no_grad():
            out = model(**inputs, output_hidden_states=True)
        assert all(int(h.isnan().sum()) == 0 for h in out.hidden_states)
        assert int(out.logits.isnan().sum()) == 0


def test_modernbert_directory_saved_by_us_loads_in_transformers(tmp_path):
    config = tiny(local_attention=8)
    torch.manual_seed(0)
    ours = set_fast_paths(ModernBertForSequenceClassification(config).eval(), unpad=False)
    ours.save_pretrained(tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "modernbert" and written["architectures"] == ["ModernBertForSequenceClassification"]
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    assert type(theirs).__name__ == "ModernBertForSequenceClassification"
    assert theirs.config.layer_types == config.attention_kinds
    assert theirs.config.sliding_window == config.window_radius
    assert theirs.config.id2label == config.id2label
    inputs = batch(config, 30, padded=True)
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, theirs(**inputs).logits, atol=FP32_ATOL, rtol=1e-5)


@pytest.mark.parametrize("cls", [ModernBertForMaskedLM, ModernBertForTokenClassification])
def test_modernbert_directory_saved_by_transformers_loads_here(tmp_path, cls):
    reference = transformers.ModernBertConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, local_attention=8,
        global_attn_every_n_layers=2, global_rope_theta=20_000.0, num_labels=3)
    torch.manual_seed(0)
    theirs = getattr(transformers, cls.__name__)(reference).eval()
    theirs.save_pretrained(tmp_path / "theirs")
    assert "rope_parameters" in json.loads((tmp_path / "theirs" / "config.json").read_text())
    model, report = registry.load_model(tmp_path / "theirs")  # the class its config.json names
    assert type(model) is cls and report.fresh == []
    assert model.config.global_rope_theta == 20_000.0 and model.config.attention_kinds == reference.layer_types
    inputs = batch(model.config, 30, padded=True)
    with torch.no_grad():
        assert_real_close(model(**inputs).logits, theirs(**inputs).logits, inputs["attention_mask"], "logits")
    # ... and back out: our save of it loads in transformers with the same weights.
    model.save_pretrained(tmp_path / "again")
    again = getattr(transformers, cls.__name__).from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        assert_real_close(again(**inputs).logits, theirs(**inputs).logits, inputs["attention_mask"], "logits")


def test_modernbert_encoder_loads_from_a_task_directory(tmp_path):
    # A bare encoder from a masked-LM directory: the head is skipped, the encoder is the same.
    config = tiny(local_attention=8)
    torch.manual_seed(0)
    mlm = ModernBertForMaskedLM(config).eval()
    mlm.save_pretrained(tmp_path / "mlm")
    encoder, report = checkpoint_format.load_model(tmp_path / "mlm", ModernBertModel)
    assert sorted(report.skipped) == ["decoder.bias", "head.dense.weight", "head.norm.weight"]
    inputs = batch(config, 20, padded=True)
    with torch.no_grad():
        assert_real_close(encoder(**inputs).last_hidden_state, mlm.bert(**inputs).last_hidden_state,
                          inputs["attention_mask"], "encoder output")


def test_tokenizer_json_matches_transformers_fast_tokenizer(tmp_path):
    # A byte-level BPE trained here, saved by us, loaded by transformers' AutoTokenizer: same ids, same offsets.
    from bertforge.tokenization.tokenizer_json import train_bpe

    corpus = ["Naïve café owners serve crème brûlée daily!", "The quick brown fox jumps over the lazy dog."] * 20
    ours = train_bpe(corpus, vocab_size=300)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ("The  naïve fox, café!", "crème brûlée über alles 8,192", ""):
        mine = ours.encode(text, add_special_tokens=False)
        reference = theirs(text, add_special_tokens=False, return_offsets_mapping=True)
        assert mine.ids == reference["input_ids"]
        assert mine.offsets == [tuple(span) for span in reference["offset_mapping"]]
    assert theirs.cls_token_id == ours.cls_token_id and theirs.pad_token_id == ours.pad_token_id


def test_modernbert_attention_probabilities_match_reference_eager():
    # Global layers see every real key; local ones only the band: their maps agree with the reference's.
    config = tiny(local_attention=4)
    ours, theirs = twins(ModernBertModel, config, "eager")
    inputs = batch(config, 12, padded=True)
    with torch.no_grad():
        out = ours(**inputs, output_attentions=True)
        ref = theirs(**inputs, output_attentions=True)
    assert len(out.attentions) == len(ref.attentions) == config.num_hidden_layers
    real = inputs["attention_mask"].bool()
    for index, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        a, b = a.transpose(1, 2)[real], b.transpose(1, 2)[real]  # real query rows: [R, N, T]
        torch.testing.assert_close(a, b, atol=FP32_ATOL, rtol=1e-5, msg=lambda m, i=index: f"layer {i}: {m}")
    local = out.attentions[1][0, 0]  # [T, T] of a full row, a local layer
    assert int((local[6, :] > 0).sum()) == 2 * config.window_radius + 1
