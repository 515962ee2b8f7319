"""`BertModel` on its own: input checks, attention probabilities, padding, dropout, initialisation and the
sinusoidal position table. Agreement with the reference implementation lives in tests/parity/."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from bertforge.errors import InputError
from bertforge.model.bert import BertModel, sinusoidal_table

FP32_ATOL = 1e-5
FP32_RTOL = 1e-5


def model_for(config, seed: int = 0, **kwargs) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(config, **kwargs).eval()


def padded_batch(config):
    input_ids = torch.tensor([[2, 11, 12, 13, 14, 3], [2, 21, 22, 3, 0, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    token_type_ids = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


# --- bad input -------------------------------------------------------------------------------------------

def test_bert_model_rejects_sequence_longer_than_positions(tiny_config):
    model = model_for(tiny_config)
    with pytest.raises(InputError, match="65 tokens is longer than max_position_embeddings=64"):
        model(torch.ones(1, 65, dtype=torch.long))


@pytest.mark.parametrize("bad_id", [99, 1000, -1])
def test_bert_model_rejects_token_id_outside_vocabulary(tiny_config, bad_id):
    input_ids = torch.tensor([[2, 5, bad_id, 3]])
    with pytest.raises(InputError, match=rf"token id {bad_id} is outside the vocabulary \(size 99\)"):
        model_for(tiny_config)(input_ids)


def test_bert_model_rejects_token_type_outside_range(tiny_config):
    with pytest.raises(InputError, match=r"token_type_ids must lie in \[0, 2\)"):
        model_for(tiny_config)(torch.tensor([[2, 5, 3]]), token_type_ids=torch.tensor([[0, 2, 0]]))


def test_bert_model_rejects_unbatched_input(tiny_config):
    with pytest.raises(InputError, match=r"input_ids must be \[batch, tokens\]"):
        model_for(tiny_config)(torch.tensor([2, 5, 3]))


def test_bert_model_accepts_longest_allowed_sequence(tiny_config):
    out = model_for(tiny_config)(torch.ones(1, 64, dtype=torch.long))
    assert out.last_hidden_state.shape == (1, 64, 32)


# --- outputs ---------------------------------------------------------------------------------------------

def test_bert_model_output_shapes(tiny_config):
    out = model_for(tiny_config)(**padded_batch(tiny_config), output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (2, 6, 32)
    assert out.pooled_output.shape == (2, 32)
    assert len(out.hidden_states) == tiny_config.num_hidden_layers + 1
    assert all(h.shape == (2, 6, 32) for h in out.hidden_states)
    assert out.hidden_states[-1] is out.last_hidden_state
    assert len(out.attentions) == tiny_config.num_hidden_layers
    assert all(a.shape == (2, 4, 6, 6) for a in out.attentions)


def test_bert_model_without_pooler(tiny_config):
    model = model_for(tiny_config, add_pooling_layer=False)
    assert model.pooler is None and not any(k.startswith("pooler.") for k in model.state_dict())
    assert model(torch.tensor([[2, 5, 3]])).pooled_output is None


def test_bert_model_pooler_is_tanh_of_first_token(tiny_config):
    model = model_for(tiny_config)
    out = model(**padded_batch(tiny_config))
    expected = torch.tanh(model.pooler.dense(out.last_hidden_state[:, 0]))
    torch.testing.assert_close(out.pooled_output, expected, atol=0, rtol=0)


def test_bert_model_attention_rows_sum_to_one_and_padding_gets_zero(tiny_config):
    inputs = padded_batch(tiny_config)
    out = model_for(tiny_config)(**inputs, output_attentions=True)
    for probs in out.attentions:
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 6), atol=FP32_ATOL, rtol=FP32_RTOL)
        assert (probs >= 0).all()
        assert (probs[1, :, :, 4:] == 0).all(), "padded keys must receive no attention"
        assert (probs[1, :, :, :4] > 0).all()


def test_bert_model_attention_path_equals_default_path(tiny_config):
    # Asking for the probabilities switches to the padded explicit softmax; real tokens must not change.
    model = model_for(tiny_config)
    inputs = padded_batch(tiny_config)
    real = inputs["attention_mask"].bool()
    default = model(**inputs, output_hidden_states=True)
    explicit = model(**inputs, output_hidden_states=True, output_attentions=True)
    for index, (a, b) in enumerate(zip(default.hidden_states, explicit.hidden_states)):
        torch.testing.assert_close(a[real], b[real], atol=FP32_ATOL, rtol=FP32_RTOL, msg=f"hidden state {index}")


def test_bert_model_default_is_unpadded_with_zeros_at_padding(tiny_config):
    model = model_for(tiny_config)
    assert model.unpad
    inputs = padded_batch(tiny_config)
    out = model(**inputs, output_hidden_states=True)
    padding = ~inputs["attention_mask"].bool()
    assert all(torch.count_nonzero(h[padding]) == 0 for h in out.hidden_states)
    assert out.hidden_states[-1] is out.last_hidden_state


def test_encoder_runs_every_layer_in_order(tiny_config):
    from bertforge.model.layouts import Padded

    model = model_for(tiny_config)
    x = torch.randn(2, 5, tiny_config.hidden_size, generator=torch.Generator().manual_seed(0))
    last, hidden_states, attentions = model.encoder(x, Padded(None), output_hidden_states=True,
                                                    output_attentions=True)
    expected = x
    for layer, state in zip(model.encoder.layers, hidden_states[1:]):
        expected = layer(expected, Padded(None), True)[0]
        torch.testing.assert_close(state, expected, atol=0, rtol=0)
    assert hidden_states[0] is x and last is hidden_states[-1]
    assert len(attentions) == tiny_config.num_hidden_layers and attentions[0].shape == (2, 4, 5, 5)
    assert model.encoder(x, Padded(None))[1:] == (None, None)


def test_bert_model_padding_does_not_change_real_tokens(tiny_config):
    model = model_for(tiny_config)
    input_ids = torch.tensor([[2, 21, 22, 3]])
    token_type_ids = torch.tensor([[0, 0, 1, 1]])
    alone = model(input_ids, token_type_ids).last_hidden_state
    padded = model(torch.tensor([[2, 21, 22, 3, 0, 0, 0]]), torch.tensor([[0, 0, 1, 1, 0, 0, 0]]),
                   torch.tensor([[1, 1, 1, 1, 0, 0, 0]])).last_hidden_state
    torch.testing.assert_close(padded[:, :4], alone, atol=FP32_ATOL, rtol=FP32_RTOL)


def test_bert_model_batch_rows_are_independent(tiny_config):
    model = model_for(tiny_config)
    inputs = padded_batch(tiny_config)
    together = model(**inputs).last_hidden_state
    for row in range(2):
        alone = model(**{k: v[row : row + 1] for k, v in inputs.items()}).last_hidden_state
        torch.testing.assert_close(together[row : row + 1], alone, atol=FP32_ATOL, rtol=FP32_RTOL)


def test_bert_model_token_types_and_positions_matter(tiny_config):
    model = model_for(tiny_config)
    input_ids = torch.tensor([[2, 7, 7, 3]])
    base = model(input_ids).last_hidden_state
    segment_b = model(input_ids, token_type_ids=torch.ones_like(input_ids)).last_hidden_state
    assert not torch.allclose(base, segment_b)
    # The two 7s differ only by position.
    assert not torch.allclose(base[0, 1], base[0, 2])
    shifted = model(input_ids, position_ids=torch.arange(4) + 5).last_hidden_state
    assert not torch.allclose(base, shifted)


@pytest.mark.parametrize("output_attentions", [False, True])
def test_bert_model_all_padding_row_stays_finite(tiny_config, output_attentions):
    # A row with no real token (batch filler) must not turn into NaN and poison a summed loss.
    out = model_for(tiny_config)(torch.tensor([[2, 5, 3], [0, 0, 0]]),
                                 attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]),
                                 output_attentions=output_attentions)
    assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooled_output).all()


# --- dropout ---------------------------------------------------------------------------------------------

def test_bert_model_dropout_active_in_train_only(tiny_config):
    model = model_for(tiny_config.replace(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    inputs = padded_batch(tiny_config)
    model.train()
    first, second = model(**inputs).last_hidden_state, model(**inputs).last_hidden_state
    assert not torch.equal(first, second)
    model.eval()
    torch.testing.assert_close(model(**inputs).last_hidden_state, model(**inputs).last_hidden_state,
                               atol=0, rtol=0)


@pytest.mark.parametrize("output_attentions", [False, True])
def test_bert_model_attention_dropout_alone_changes_outputs(tiny_config, output_attentions):
    model = model_for(tiny_config.replace(attention_probs_dropout_prob=0.5)).train()
    inputs = padded_batch(tiny_config)
    first = model(**inputs, output_attentions=output_attentions).last_hidden_state
    second = model(**inputs, output_attentions=output_attentions).last_hidden_state
    assert not torch.equal(first, second)


# --- initialisation --------------------------------------------------------------------------------------

def test_bert_model_initialisation_follows_bert(tiny_config):
    config = tiny_config.replace(vocab_size=4000, initializer_range=0.02)
    model = model_for(config)
    word = model.embeddings.word.weight
    assert abs(word.std().item() - 0.02) < 0.002 and abs(word.mean().item()) < 0.002
    layer = model.encoder.layers[0]
    assert torch.all(layer.attention.query.bias == 0)
    assert torch.all(layer.feed_forward.norm.weight == 1) and torch.all(layer.feed_forward.norm.bias == 0)
    assert model.embeddings.norm.eps == 1e-12


def test_bert_model_same_seed_same_weights(tiny_config):
    a, b = model_for(tiny_config, seed=3), model_for(tiny_config, seed=3)
    for (key, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, atol=0, rtol=0, msg=key)


# --- sinusoidal positions --------------------------------------------------------------------------------

def test_sinusoidal_table_values():
    table = sinusoidal_table(50, 16)
    assert table.shape == (50, 16) and table.dtype == torch.float32
    for position in (0, 1, 7, 49):
        for i in range(8):
            angle = position / 10000 ** (2 * i / 16)
            assert table[position, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[position, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_table_odd_width():
    table = sinusoidal_table(4, 5)
    assert table.shape == (4, 5)
    assert table[3, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)), abs=1e-6)


def test_sinusoidal_positions_frozen_and_saved(tmp_path, tiny_config):
    model = model_for(tiny_config.replace(position_embedding_type="sinusoidal")).train()
    table = model.embeddings.position.weight
    torch.testing.assert_close(table, sinusoidal_table(64, 32), atol=0, rtol=0)
    assert not table.requires_grad
    model(**padded_batch(tiny_config)).last_hidden_state.sum().backward()
    assert table.grad is None
    assert model.embeddings.word.weight.grad is not None
    assert "embeddings.position.weight" in model.state_dict()
    model.save_pretrained(tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))["embeddings.position_embeddings.weight"]
    torch.testing.assert_close(stored, sinusoidal_table(64, 32), atol=0, rtol=0)
    loaded = BertModel.from_pretrained(tmp_path)
    assert not loaded.embeddings.position.weight.requires_grad
    torch.testing.assert_close(loaded.embeddings.position.weight, sinusoidal_table(64, 32), atol=0, rtol=0)


def test_absolute_positions_are_learned(tiny_config):
    model = model_for(tiny_config)
    assert model.embeddings.position.weight.requires_grad
    assert not torch.allclose(model.embeddings.position.weight, sinusoidal_table(64, 32))
