"""Parity of our encoder, heads and losses with the reference implementation (`transformers`).

Each test builds one of our models from a tiny random config, copies its weights into the matching
`transformers` class through our key table (so the table is exercised too), runs both on the same padded
sentence-pair batch and compares every layer's hidden states, so a failure names the first layer that
drifts. The last tests run the real all-MiniLM-L6-v2 weights through both implementations.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertforge import checkpoint_format
from bertforge.checkpoint_format import hf_state_dict
from bertforge.constants import IGNORE_INDEX
from bertforge.families.classification import BertForSequenceClassification
from bertforge.families.multiple_choice import BertForMultipleChoice
from bertforge.families.pretraining import BertForPretraining
from bertforge.families.question_answering import BertForQuestionAnswering
from bertforge.families.tagging import BertForTokenClassification
from bertforge.interop import huggingface as hf
from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import set_fast_paths

transformers = pytest.importorskip("transformers")

# Same float32 math in a different order: agreement to rounding noise.
FP32_ATOL = 1e-5
FP32_RTOL = 1e-5
# Real weights, explicit-softmax attention path (needed to return probabilities) against the reference's
# eager path: activations reach ~10 and rounding grows through 6 layers. The reference's own eager and
# SDPA paths differ by up to 1e-4 on these inputs, so this is its noise floor, not ours.
MINILM_EAGER_ATOL = 2e-4

REFERENCE = {
    "BertModel": "BertModel",
    "BertForPretraining": "BertForPreTraining",
    "BertForSequenceClassification": "BertForSequenceClassification",
    "BertForTokenClassification": "BertForTokenClassification",
    "BertForQuestionAnswering": "BertForQuestionAnswering",
    "BertForMultipleChoice": "BertForMultipleChoice",
}


def reference_config(config, architecture: str):
    """Their config for our config, through our own config.json translation; eager attention so that
    attention probabilities can be returned."""
    data = hf.config_to_hf(config.to_dict(), architecture)
    return transformers.BertConfig.from_dict(data, attn_implementation="eager")


def twins(cls, config, seed: int = 0):
    """(ours, theirs): our model with random weights, on the plain path (padded, so every position can be
    compared), and the reference model holding the same weights."""
    torch.manual_seed(seed)
    ours = set_fast_paths(cls(config).eval(), unpad=False, fused_qkv=False)
    theirs = getattr(transformers, REFERENCE[cls.__name__])(reference_config(config, cls.__name__)).eval()
    missing, unexpected = theirs.load_state_dict(hf_state_dict(ours), strict=False)
    assert not unexpected, f"keys the reference does not know: {unexpected}"
    assert all(hf.is_redundant_hf_key(k) for k in missing), f"reference keys we did not provide: {missing}"
    return ours, theirs


def pair_batch(config, batch: int = 3, tokens: int = 9, seed: int = 1):
    """A padded sentence-pair batch: real lengths differ per row, segment B is the second half of each
    row's real tokens, padding has id 0, type 0 and mask 0."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [tokens, tokens - 3, tokens - 5][:batch] + [tokens] * max(0, batch - 3)
    input_ids = torch.randint(1, config.vocab_size, (batch, tokens), generator=generator)
    token_type_ids = torch.zeros(batch, tokens, dtype=torch.long)
    attention_mask = torch.zeros(batch, tokens, dtype=torch.long)
    for row, length in enumerate(lengths):
        attention_mask[row, :length] = 1
        token_type_ids[row, length // 2 : length] = 1
        input_ids[row, length:] = 0
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, what: str, atol: float = FP32_ATOL) -> None:
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=FP32_RTOL, msg=lambda m: f"{what}: {m}")


def assert_layers_close(ours, theirs, atol: float = FP32_ATOL) -> None:
    """Embeddings then every layer, in order, so the first failure names the layer that drifts."""
    assert len(ours) == len(theirs), f"{len(ours)} hidden states vs reference {len(theirs)}"
    for index, (a, b) in enumerate(zip(ours, theirs)):
        assert_close(a, b, "embeddings output" if index == 0 else f"layer {index} output", atol)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
def test_bert_model_matches_reference_per_layer(tiny_config, hidden_act):
    ours, theirs = twins(BertModel, tiny_config.replace(hidden_act=hidden_act))
    inputs = pair_batch(tiny_config)
    with torch.no_grad():
        out = ours(**inputs, output_hidden_states=True)
        ref = theirs(**inputs, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states)
    assert_close(out.last_hidden_state, ref.last_hidden_state, "last hidden state")
    assert_close(out.pooled_output, ref.pooler_output, "pooled output")


def test_bert_model_attention_probabilities_match_reference(tiny_config):
    ours, theirs = twins(BertModel, tiny_config)
    inputs = pair_batch(tiny_config)
    with torch.no_grad():
        out = ours(**inputs, output_attentions=True)
        ref = theirs(**inputs, output_attentions=True)
    assert len(out.attentions) == len(ref.attentions) == tiny_config.num_hidden_layers
    for index, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        assert_close(a, b, f"layer {index + 1} attention probabilities")


def test_bert_model_default_inputs_match_reference(tiny_config):
    # No mask and no token types: both sides fill in their defaults (all attend, segment A).
    ours, theirs = twins(BertModel, tiny_config)
    input_ids = pair_batch(tiny_config)["input_ids"]
    with torch.no_grad():
        assert_close(ours(input_ids).last_hidden_state, theirs(input_ids).last_hidden_state, "last hidden state")


def test_pretraining_logits_match_reference(tiny_config):
    ours, theirs = twins(BertForPretraining, tiny_config)
    inputs = pair_batch(tiny_config)
    with torch.no_grad():
        out = ours(**inputs, output_hidden_states=True)
        ref = theirs(**inputs, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states)
    assert_close(out.mlm_logits, ref.prediction_logits, "MLM logits over all positions")
    assert_close(out.nsp_logits, ref.seq_relationship_logits, "NSP logits")


def masked_positions(inputs, per_row: int, seed: int = 2):
    """(mlm_positions [B, M], mlm_labels [B, M], all-position labels [B, T]) for random real positions;
    the last slot of the shortest row is padding (label IGNORE_INDEX, position 0)."""
    generator = torch.Generator().manual_seed(seed)
    mask = inputs["attention_mask"]
    batch, tokens = mask.shape
    positions = torch.zeros(batch, per_row, dtype=torch.long)
    labels = torch.full((batch, per_row), IGNORE_INDEX)
    full_labels = torch.full((batch, tokens), IGNORE_INDEX)
    for row in range(batch):
        real = int(mask[row].sum())
        count = per_row - 1 if row == batch - 1 else per_row
        chosen = torch.randperm(real, generator=generator)[:count].sort().values
        positions[row, :count] = chosen
        labels[row, :count] = torch.randint(0, 99, (count,), generator=generator)
        full_labels[row, chosen] = labels[row, :count]
    return positions, labels, full_labels


def test_pretraining_gathered_mlm_loss_equals_all_positions_loss(tiny_config):
    # Faithfulness trap 10: loss over gathered masked positions == the reference's loss over all positions
    # with IGNORE_INDEX (-100) everywhere else.
    ours, theirs = twins(BertForPretraining, tiny_config)
    inputs = pair_batch(tiny_config)
    positions, labels, full_labels = masked_positions(inputs, per_row=3)
    nsp_labels = torch.tensor([0, 1, 0])
    with torch.no_grad():
        out = ours(**inputs, mlm_positions=positions, mlm_labels=labels, nsp_labels=nsp_labels)
        ref = theirs(**inputs, labels=full_labels, next_sentence_label=nsp_labels)
    # The reference reports only the summed loss; its two parts are its own cross-entropies over its logits
    # (all T positions for MLM, with IGNORE_INDEX everywhere but the masked ones).
    ref_mlm = F.cross_entropy(ref.prediction_logits.flatten(0, 1), full_labels.flatten(), ignore_index=IGNORE_INDEX)
    ref_nsp = F.cross_entropy(ref.seq_relationship_logits, nsp_labels)
    gathered = ref.prediction_logits[torch.arange(3)[:, None], positions]  # [B, T, V] -> [B, M, V]
    assert_close(out.mlm_logits, gathered, "MLM logits at the gathered positions")
    assert out.mlm_count.item() == (full_labels != IGNORE_INDEX).sum().item()
    assert out.nsp_count.item() == 3
    assert_close(out.mlm_loss_sum / out.mlm_count, ref_mlm, "mean MLM loss")
    assert_close(out.nsp_loss_sum / out.nsp_count, ref_nsp, "mean NSP loss")
    assert_close(out.loss, ref.loss, "MLM + NSP loss")


@pytest.mark.parametrize(
    ("problem_type", "labels"),
    [
        ("single_label_classification", torch.tensor([2, 0, 1])),
        ("regression", torch.tensor([0.5, -1.0, 2.0])),
        ("multi_label_classification", torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])),
    ],
)
def test_sequence_classification_matches_reference(tiny_config, problem_type, labels):
    config = tiny_config.replace(problem_type=problem_type)
    if problem_type != "regression":
        config = config.with_labels(["neg", "neu", "pos"])
    ours, theirs = twins(BertForSequenceClassification, config)
    inputs = pair_batch(config)
    with torch.no_grad():
        out = ours(**inputs, labels=labels, output_hidden_states=True)
        ref = theirs(**inputs, labels=labels, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states)
    assert out.logits.shape == ref.logits.shape == (3, 1 if problem_type == "regression" else 3)
    assert_close(out.logits, ref.logits, "logits")
    assert_close(out.loss, ref.loss, f"{problem_type} loss")


def test_sequence_classification_infers_problem_type_like_reference(tiny_config):
    # A checkpoint with one label and no problem_type is a regression model for the reference; a
    # cross-entropy over one class would be a constant zero loss.
    config = tiny_config.with_labels(["score"])
    assert config.problem_type is None
    ours, theirs = twins(BertForSequenceClassification, config)
    labels = torch.tensor([0.5, -1.0, 2.0])
    with torch.no_grad():
        out, ref = ours(**pair_batch(config), labels=labels), theirs(**pair_batch(config), labels=labels)
    assert out.loss.item() > 0
    assert_close(out.loss, ref.loss, "inferred regression loss")


def test_token_classification_matches_reference(tiny_config):
    config = tiny_config.with_labels(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    ours, theirs = twins(BertForTokenClassification, config)
    inputs = pair_batch(config)
    labels = torch.randint(0, 5, inputs["input_ids"].shape, generator=torch.Generator().manual_seed(3))
    labels[inputs["attention_mask"] == 0] = IGNORE_INDEX
    labels[:, 0] = IGNORE_INDEX  # [CLS] carries no label
    labels[0, 3] = IGNORE_INDEX  # a continuation word piece
    with torch.no_grad():
        out = ours(**inputs, labels=labels, output_hidden_states=True)
        ref = theirs(**inputs, labels=labels, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states)
    assert_close(out.logits, ref.logits, "token logits")
    assert_close(out.loss, ref.loss, "token loss with ignored positions")


def test_question_answering_matches_reference(tiny_config):
    ours, theirs = twins(BertForQuestionAnswering, tiny_config)
    inputs = pair_batch(tiny_config)
    # Row 1 points past the window (ignored by both); row 2 has no answer and points at [CLS].
    start, end = torch.tensor([5, 40, 0]), torch.tensor([7, 41, 0])
    with torch.no_grad():
        out = ours(**inputs, start_positions=start, end_positions=end, output_hidden_states=True)
        ref = theirs(**inputs, start_positions=start, end_positions=end, output_hidden_states=True)
    assert_layers_close(out.hidden_states, ref.hidden_states)
    real = inputs["attention_mask"].bool()
    assert_close(out.start_logits[real], ref.start_logits[real], "start logits")
    assert_close(out.end_logits[real], ref.end_logits[real], "end logits")
    # Padding is masked out of our span loss (the reference leaves it in the softmax), so the reference
    # loss is recomputed from its logits with padding masked the same way.
    tokens = real.shape[1]

    def masked_span_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.masked_fill(~real, float("-inf")), target.clamp(0, tokens),
                               ignore_index=tokens)

    expected = (masked_span_loss(ref.start_logits, start) + masked_span_loss(ref.end_logits, end)) / 2
    assert_close(out.loss, expected, "span loss over real tokens")
    assert bool((out.start_logits[~real] == torch.finfo(out.start_logits.dtype).min).all())


def test_multiple_choice_matches_reference(tiny_config):
    ours, theirs = twins(BertForMultipleChoice, tiny_config)
    flat = pair_batch(tiny_config, batch=6)
    inputs = {k: v.view(2, 3, -1) for k, v in flat.items()}  # [B*C, T] -> [B, C, T]
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        out = ours(**inputs, labels=labels)
        ref = theirs(**inputs, labels=labels)
    assert out.logits.shape == ref.logits.shape == (2, 3)
    assert_close(out.logits, ref.logits, "choice logits")
    assert_close(out.loss, ref.loss, "choice loss")


# --- the real all-MiniLM-L6-v2 checkpoint ----------------------------------------------------------------

MINILM_TEXTS = [
    ("A man is playing a guitar on the street.", "Someone plays music outdoors."),
    ("Tokenization splits unaffable words into pieces.", None),
]


def minilm_batch(path):
    """Real tokenized inputs (a sentence pair and a single sentence, padded) from the reference tokenizer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    first, second = zip(*MINILM_TEXTS)
    batch = tokenizer(list(first), [s or "" for s in second], padding=True, return_tensors="pt")
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    assert (inputs["attention_mask"] == 0).any(), "the batch should contain padding"
    assert (inputs["token_type_ids"] == 1).any(), "the batch should contain a sentence pair"
    return inputs


@pytest.mark.parametrize("fast_path", [True, False])
def test_minilm_real_weights_match_reference(minilm_path, fast_path):
    # Our default (unpadded, fused QKV) and plain paths against the reference's default (SDPA) path, at
    # every real token (the unpadded path leaves zeros at padding).
    ours = BertModel.from_pretrained(minilm_path, fast_path=fast_path)
    theirs = transformers.AutoModel.from_pretrained(minilm_path, attn_implementation="sdpa").eval()
    inputs = minilm_batch(minilm_path)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        out = ours(**inputs, output_hidden_states=True)
        ref = theirs(**inputs, output_hidden_states=True)
    assert_layers_close([h[real] for h in out.hidden_states], [h[real] for h in ref.hidden_states])
    assert_close(out.pooled_output, ref.pooler_output, "pooled output")


def test_minilm_real_attention_probabilities_match_reference(minilm_path):
    ours = BertModel.from_pretrained(minilm_path)
    theirs = transformers.AutoModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    inputs = minilm_batch(minilm_path)
    with torch.no_grad():
        out = ours(**inputs, output_hidden_states=True, output_attentions=True)
        ref = theirs(**inputs, output_hidden_states=True, output_attentions=True)
    assert_layers_close(out.hidden_states, ref.hidden_states, atol=MINILM_EAGER_ATOL)
    assert_close(out.pooled_output, ref.pooler_output, "pooled output", atol=MINILM_EAGER_ATOL)
    for index, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        assert_close(a, b, f"layer {index + 1} attention probabilities", atol=MINILM_EAGER_ATOL)


def test_minilm_loads_into_task_model_with_fresh_head(minilm_path):
    # Fine-tuning starts from an encoder-only checkpoint: the encoder is the reference's, the head is new.
    ours, report = checkpoint_format.load_model(minilm_path, BertForTokenClassification)
    assert sorted(report.fresh) == ["classifier.bias", "classifier.weight"]
    assert sorted(report.skipped) == ["pooler.dense.bias", "pooler.dense.weight"]
    theirs = transformers.AutoModel.from_pretrained(minilm_path).eval()
    input_ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        ours_hidden = ours.bert(input_ids).last_hidden_state
        ref_hidden = theirs(input_ids).last_hidden_state
    assert_close(ours_hidden, ref_hidden, "encoder output")
