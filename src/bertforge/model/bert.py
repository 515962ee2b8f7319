"""The BERT encoder (Devlin et al., 2018), readable top to bottom.

Owns the architecture: embeddings, post-LayerNorm layers (self-attention -> add & norm -> feed-forward ->
add & norm), the encoder's layer loop, the pooler, weight initialisation, and `from_pretrained` /
`save_pretrained` (handed over to `bertforge.checkpoint_format`). The token layout (padded, or only the real
tokens) lives in `model/layouts.py`; fused QKV and activation checkpointing are applied to a built model
from outside, by `model/fast_paths.py`; how a model is prepared to run (int8 or bf16 linears, a traced layer
graph, CPU row chunks, ONNX Runtime) is `bertforge.engine`'s. Parameter names are our own (`encoder.layers.3.attention.query`);
the Hugging Face and TF names live in `interop/`.

Shape legend: B batch, T tokens per row, H hidden size, N heads, D head size (H / N), I intermediate size,
R real tokens of a batch, S sequences of a batch. In the encoder `x` is [B, T, H] padded, [R, H] unpadded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from bertforge import checkpoint_format
from bertforge.errors import InputError
from bertforge.initialisation import initialisation_deferred
from bertforge.model.config import BertConfig
from bertforge.model.fast_paths import set_fast_paths
from bertforge.model.layouts import Padded, Unpadded, choose_layout, packed_positions


def activation(name: str):
    """The feed-forward nonlinearity named by `hidden_act`. Released BERT checkpoints use the exact erf GELU
    (`gelu`); the tanh approximation (`gelu_new`) differs by up to ~1e-3: only when a config asks for it."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unsupported hidden_act {name!r}")


def sinusoidal_table(positions: int, hidden: int) -> torch.Tensor:
    """Fixed position encodings of Vaswani et al.: sin on even, cos on odd features.  Returns [T, H]."""
    position = torch.arange(positions, dtype=torch.float64)[:, None]  # [T, 1]
    rate = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float64) * (-math.log(10000.0) / hidden))  # [H/2]
    table = torch.zeros(positions, hidden, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: hidden // 2])
    return table.float()


class IndexableOutput:
    """Model outputs also read as transformers' do: `outputs[0]`, `outputs[:2]` are the fields that are set
    (not None), in `tuple_fields` order (default: field order); `outputs["name"]` is the field."""

    tuple_fields: tuple[str, ...] = ()

    def to_tuple(self) -> tuple:
        names = self.tuple_fields or tuple(f.name for f in fields(self))
        return tuple(value for name in names if (value := getattr(self, name)) is not None)

    def __getitem__(self, key):
        return getattr(self, key) if isinstance(key, str) else self.to_tuple()[key]


@dataclass
class BertOutput(IndexableOutput):
    """What `BertModel` returns.

    last_hidden_state: [B, T, H] (zeros at padding on the unpadded path). pooled_output: [B, H]
    (tanh(dense([CLS]))), or [S, H] for packed rows. hidden_states: L + 1 tensors [B, T, H] (embeddings, then
    each layer) when requested. attentions: L tensors [B, N, T, T] of attention probabilities when requested.
    """

    last_hidden_state: torch.Tensor
    pooled_output: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None

    @property
    def pooler_output(self) -> torch.Tensor | None:
        """`pooled_output` under transformers' name."""
        return self.pooled_output


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.sinusoidal = config.position_embedding_type == "sinusoidal"
        if self.sinusoidal:
            self.position.weight.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        # [B, T] ids -> [B, T, H]; the three embeddings are summed, as in the paper's Figure 2.
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position(position_ids)
        return self.dropout(self.norm(x))  # [B, T, H]


class SelfAttention(nn.Module):
    """Multi-head self-attention followed by its output projection, residual and LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, each shaped like x."""
        return self.query(x), self.key(x), self.value(x)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [B, T, H] (or [R, H] unpadded).  Returns (same shape, probabilities [B, N, T, T] or None)."""
        q, k, v = self.projections(x)
        dropout = self.attention_dropout if self.training else 0.0
        context, probs = layout.attend(q, k, v, self.num_heads, dropout, return_probs)  # like x
        return self.norm(x + self.dropout(self.output(context))), probs


class FeedForward(nn.Module):
    """H -> I (activation) -> H, then residual and LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., H] -> [..., I] -> [..., H]
        return self.norm(x + self.dropout(self.down(self.act(self.up(x)))))


class Layer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, probs = self.attention(x, layout, return_probs)
        return self.feed_forward(x), probs


class Encoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded, output_hidden_states: bool = False,
                output_attentions: bool = False) -> tuple[torch.Tensor, list | None, list | None]:
        """x in the layout's shape -> (last layer's x, L + 1 hidden states [B, T, H], L maps [B, N, T, T])."""
        hidden_states = [layout.leave(x)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            x, probs = layer(x, layout, output_attentions)
            if hidden_states is not None:
                hidden_states.append(layout.leave(x))
            if attentions is not None:
                attentions.append(probs)
        return x, hidden_states, attentions


class Pooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls))  # [..., H] [CLS] vectors -> [..., H]


class BertPretrainedModel(nn.Module):
    """Base of every bertforge model: holds the config, initialises weights as BERT did, saves and loads.

    `encoder_prefix` (where the encoder's parameters sit) and `head_prefixes` (the parameter-name prefixes
    of the model's own heads) tell `checkpoint_format` how to read a directory into the class.
    """

    encoder_prefix: str = ""
    head_prefixes: tuple[str, ...] = ()
    config_class: type = BertConfig  # the config it is built from (`checkpoint_format` checks a directory's)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self, only: Collection[str] | None = None) -> None:
        """Initialise the weights (`initialise`): all of them, or `only` these state-dict names (what a loader did
        not find in a checkpoint). A constructor's call does nothing while the model is built to be loaded
        (`initialisation.weights_to_come`)."""
        if only is None and initialisation_deferred():
            return
        self.initialise(lambda name: only is None or name in only)
        self.tie_weights()

    def initialise(self, wanted: Callable[[str], bool]) -> None:
        """Truncation-free normal(0, initializer_range) weights, zero biases, unit LayerNorm (as BERT does), for
        the parameters whose state-dict name is `wanted`."""
        std = self.config.initializer_range
        for name, module in self.named_modules(prefix=""):
            at = f"{name}." if name else ""
            if isinstance(module, nn.Linear | nn.Embedding) and wanted(at + "weight"):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None and wanted(at + "bias"):
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm) and wanted(at + "weight"):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for name, module in self.named_modules(prefix=""):  # after the normal draws, which the table replaces
            at = f"{name}." if name else ""
            if isinstance(module, Embeddings) and module.sinusoidal and wanted(at + "position.weight"):
                with torch.no_grad():
                    module.position.weight.copy_(sinusoidal_table(*module.position.weight.shape))

    def tie_weights(self) -> None:
        """Point output embeddings at the input ones (task models with an MLM head override this)."""

    @classmethod
    def from_pretrained(cls, path, *, fast_path: bool = True, **kwargs):
        """Load a model directory (keywords of `checkpoint_format.load_model`), in eval mode, on the fastest
        path tested equal to the plain one (unpadding + fused QKV). `fast_path=False`, or later
        `set_fast_paths(model, unpad=False, fused_qkv=False)`, gives the plain reference path."""
        model, _ = checkpoint_format.load_model(path, cls, **kwargs)
        return set_fast_paths(model, unpad=fast_path, fused_qkv=fast_path)

    def save_pretrained(self, path, tokenizer=None, **kwargs) -> None:
        checkpoint_format.save_model(self, path, tokenizer=tokenizer, **kwargs)


class BertModel(BertPretrainedModel):
    """The BERT encoder with its pooler (`add_pooling_layer=False` drops it: token-level tasks do not need it).

    `unpad` (default True) skips padding tokens in every matmul (`fast_paths.set_fast_paths` switches it);
    `check_values` (default True) checks the token and segment ids' values against the vocabulary
    (`fast_paths.set_value_checks` switches it).
    """

    check_values = True

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.unpad = True
        self.init_weights()

    def check_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> None:
        """Turn the cryptic index errors of out-of-range inputs into messages that say what to do."""
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        tokens, limit = input_ids.shape[1], self.config.max_position_embeddings
        if tokens > limit:
            raise InputError(f"sequence of {tokens} tokens is longer than max_position_embeddings={limit}; "
                             "truncate it or split it into windows with a stride")
        if not input_ids.numel() or not self.check_values:
            # Value checks need the data: whoever runs the model on an accelerator or compiled turns them off
            # (`fast_paths.set_value_checks`), where they would force a sync on every step.
            return
        vocab, types = self.config.vocab_size, self.config.type_vocab_size
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab:
            raise InputError(f"token id {low if low < 0 else high} is outside the vocabulary (size {vocab}); "
                             "was the text encoded with this model's vocab.txt?")
        if token_type_ids is not None and token_type_ids.numel() and not (
                0 <= int(token_type_ids.min()) and int(token_type_ids.max()) < types):
            raise InputError(f"token_type_ids must lie in [0, {types}); BERT uses 0 for segment A and 1 for "
                             "segment B")

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                sequence_ids: torch.Tensor | None = None, compute_masked: bool = False) -> BertOutput:
        """Encode a batch.

        Args:
            input_ids, token_type_ids: long [B, T]; types are 0 for segment A and 1 for B (default all 0).
            attention_mask: [B, T], 1 for real tokens and 0 for padding (default all 1).
            position_ids: long [B, T] or [T] (default 0..T-1, restarting with every packed sequence).
            sequence_ids: long [B, T] for packed rows (`data.collate.pack_rows`), replacing attention_mask:
                k > 0 for the k-th sequence of its row, 0 for padding. Each sequence attends only to itself;
                the pooled output has one row per sequence, [S, H], in row-major order.
            compute_masked: also compute the positions `attention_mask` hides from attention (no token attends
                to them, they attend to the real ones: ColBERT's query expansion); runs padded.
        """
        self.check_inputs(input_ids, token_type_ids)
        token_type_ids = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        in_sequence = None if sequence_ids is None else packed_positions(sequence_ids)  # [B, T]
        if position_ids is None:
            position_ids = in_sequence if in_sequence is not None else \
                torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]  # [1, T]
        layout = choose_layout(attention_mask, sequence_ids, unpad=self.unpad and not compute_masked,
                               output_attentions=output_attentions)
        x = layout.enter(self.embeddings(input_ids, token_type_ids, position_ids))  # [B, T, H] -> layout's
        x, hidden_states, attentions = self.encoder(x, layout, output_hidden_states, output_attentions)
        x = hidden_states[-1] if hidden_states else layout.leave(x)  # -> [B, T, H]
        # The [CLS] token of every row, [B, H], or of every packed sequence, [S, H].
        pooled = None
        if self.pooler is not None:
            cls = x[:, 0] if sequence_ids is None else x[(in_sequence == 0) & (sequence_ids > 0)]
            pooled = self.pooler(cls)
        return BertOutput(last_hidden_state=x, pooled_output=pooled,
                          hidden_states=tuple(hidden_states) if hidden_states is not None else None,
                          attentions=tuple(attentions) if attentions is not None else None)
