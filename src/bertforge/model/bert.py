"""The BERT encoder (Devlin et al., 2018), readable top to bottom.

Shape legend used in every comment below:
    B batch, T tokens per sequence, H hidden size, N attention heads, D head size (H / N),
    I intermediate (feed-forward) size, V vocabulary size, M masked positions per sequence.

Data flow: ids -> embeddings (word + position + segment, LayerNorm, dropout) -> L post-LayerNorm layers
(self-attention -> add & norm -> GELU feed-forward -> add & norm) -> last hidden state, and a pooler
(dense + tanh over the first, [CLS], token). Parameter names are our own (`embeddings.word`,
`encoder.layers.3.attention.query`, `...feed_forward.up`); the Hugging Face and TF names live in `interop/`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from bertforge.errors import InputError
from bertforge.model.config import BertConfig


def activation(name: str):
    """The feed-forward nonlinearity named by `hidden_act`.

    Released BERT checkpoints were trained with the exact erf GELU (`gelu`); the tanh approximation
    (`gelu_new`, `gelu_pytorch_tanh`) differs by up to ~1e-3 and must only be used when a config asks for it.
    """
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


@dataclass
class BertOutput:
    """What `BertModel` returns.

    last_hidden_state: [B, T, H]. pooled_output: [B, H] (tanh(dense([CLS]))), or [S, H] for S packed sequences.
    hidden_states: L + 1 tensors [B, T, H] (embeddings, then each layer) when requested, else None.
    attentions: L tensors [B, N, T, T] of attention probabilities when requested, else None.
    """

    last_hidden_state: torch.Tensor
    pooled_output: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


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
        return self.dropout(self.norm(x))


class Padded:
    """Tokens laid out as [B, T, H]; attention masks padded keys.  The plain, reference path."""

    def __init__(self, mask: torch.Tensor | None):
        self.mask = mask  # bool [B, 1, 1, T] (or [B, 1, T, T] for packed rows), True = attend, or None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, dropout: float,
               return_probs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: [B, T, H] -> context [B, T, H] (and probabilities [B, N, T, T] if asked)."""
        batch, tokens, hidden = q.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, tokens, heads, hidden // heads).transpose(1, 2)  # [B, T, H] -> [B, N, T, D]

        q, k, v = split(q), split(k), split(v)
        probs = None
        if return_probs:
            # The explicit path, used only when someone asks to see the attention maps.
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, N, T, T]
            if self.mask is not None:
                scores = scores.masked_fill(~self.mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout, dropout > 0) @ v  # [B, N, T, D]
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=dropout)  # [B, N, T, D]
        return context.transpose(1, 2).reshape(batch, tokens, hidden), probs  # [B, N, T, D] -> [B, T, H]


def packed_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal attention mask of packed rows: bool [B, 1, T, T], True = query may attend to key.

    sequence_ids: [B, T], k > 0 for the k-th sequence of the row, 0 for padding. A token sees only the tokens
    of its own sequence. Padding queries see every real token of their row: their outputs are discarded,
    but a query that sees nothing would turn into NaN inside the softmax.
    """
    real_key = (sequence_ids > 0)[:, None, :]  # [B, 1, T]
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]  # [B, T, T]
    pad_query = (sequence_ids == 0)[:, :, None]  # [B, T, 1]
    return ((same | pad_query) & real_key)[:, None]  # [B, 1, T, T]


def packed_positions(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Position ids that restart at 0 with every packed sequence: long [B, T] (padding gets 0..)."""
    tokens = sequence_ids.shape[1]
    index = torch.arange(tokens, device=sequence_ids.device).expand_as(sequence_ids)  # [B, T]
    starts = F.pad(sequence_ids[:, 1:] != sequence_ids[:, :-1], (1, 0), value=True)  # [B, T] first token of a run
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # [B, T] start of my run
    return index - first


class Unpadded:
    """Only the real tokens, laid out as [R, H] (R = real tokens in the batch): the padding-free fast path.

    Projections, feed-forward and LayerNorms touch real tokens only; attention runs per sequence, through
    the variable-length flash kernel where PyTorch has one for this device and dtype, otherwise by
    scattering back to [B, T] for a masked SDPA call. Equal to `Padded` at every real position.

    A row holds one sequence (`attention_mask`) or several packed ones (`sequence_ids`); either way the
    real tokens, read row by row, are the sequences one after another, and `cu_seqlens` delimits them.
    """

    def __init__(self, attention_mask: torch.Tensor, sequence_ids: torch.Tensor | None = None):
        batch, tokens = attention_mask.shape
        real = attention_mask.reshape(-1).to(torch.bool)
        self.index = real.nonzero().squeeze(1)  # [R] positions in the flattened [B*T]
        self.batch, self.tokens = batch, tokens
        if sequence_ids is None:
            lengths = attention_mask.to(torch.int32).sum(1)  # [B]
            self._mask = lambda: attention_mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, T]
            contiguous = torch.equal(attention_mask.to(torch.bool), torch.arange(tokens) < lengths[:, None]) \
                if not attention_mask.is_cuda else False
        else:
            # [R] a number for each real token's (row, sequence), so runs never merge across rows
            rows = torch.arange(batch, device=sequence_ids.device)[:, None] * (tokens + 1)  # [B, 1]
            flat = (sequence_ids + rows).reshape(-1)[self.index]
            starts = F.pad(flat[1:] != flat[:-1], (1, 0), value=True) if flat.numel() else flat.bool()
            bounds = F.pad(starts.nonzero().squeeze(1), (0, 1), value=flat.numel())  # [S + 1]
            lengths = (bounds[1:] - bounds[:-1]).to(torch.int32)  # [S]
            self._mask = lambda: packed_mask(sequence_ids)  # [B, 1, T, T]
            contiguous = not sequence_ids.is_cuda
            if contiguous and len(lengths) != int(sequence_ids.max(dim=1).values.sum()):
                raise InputError("sequence_ids must number each row's packed sequences 1, 2, ... with every "
                                 "sequence one contiguous run of tokens (0 = padding)")
        self.cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # [S + 1]
        self.max_len = int(lengths.max()) if lengths.numel() else 0
        # Sequence lengths on the host, for the per-sequence CPU path; valid when each sequence is one run of
        # real tokens (left-aligned masks; packed rows).
        self.lengths = lengths.tolist() if contiguous else None

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(0, 1).index_select(0, self.index)  # [B, T, ...] -> [R, ...]

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(self.batch * self.tokens, *x.shape[1:])
        return out.index_copy(0, self.index, x).view(self.batch, self.tokens, *x.shape[1:])  # [R, ...] -> [B, T, ...]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, dropout: float,
               return_probs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: [R, H] -> context [R, H]."""
        real, hidden = q.shape
        if varlen_attention is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) \
                and dropout == 0.0 and not return_probs:
            shape = (real, heads, hidden // heads)  # [R, H] -> [R, N, D]
            context = varlen_attention(q.view(shape), k.view(shape), v.view(shape), self.cu_seqlens,
                                       self.cu_seqlens, self.max_len, self.max_len)
            return context.reshape(real, hidden), None
        if self.lengths is not None and not return_probs:
            # CPU: one unmasked SDPA call per sequence over its own L tokens, which picks the fused
            # kernel (a masked call falls back to the math path) and costs L^2 rather than T^2.
            contexts = []
            for qs, ks, vs in zip(q.split(self.lengths), k.split(self.lengths), v.split(self.lengths)):
                length = qs.shape[0]
                shape = (1, length, heads, hidden // heads)  # [L, H] -> [1, L, N, D] -> [1, N, L, D]
                out = F.scaled_dot_product_attention(qs.view(shape).transpose(1, 2), ks.view(shape).transpose(1, 2),
                                                     vs.view(shape).transpose(1, 2), dropout_p=dropout)
                contexts.append(out.transpose(1, 2).reshape(length, hidden))  # [1, N, L, D] -> [L, H]
            return torch.cat(contexts), None
        # The masked fallback (attention maps, holes in the mask, CUDA without varlen): built only when used.
        if not isinstance(self._mask, torch.Tensor):
            self._mask = self._mask()  # once per forward, shared by every layer
        context, probs = Padded(self._mask).attend(self.scatter(q), self.scatter(k), self.scatter(v), heads,
                                                   dropout, return_probs)
        return self.gather(context), probs


try:  # PyTorch >= 2.9 on CUDA: flash attention over packed variable-length sequences.
    from torch.nn.attention.varlen import varlen_attn as varlen_attention
except ImportError:  # pragma: no cover - depends on the installed torch
    varlen_attention = None


class SelfAttention(nn.Module):
    """Multi-head self-attention followed by its output projection, residual and LayerNorm (post-LN).

    `fused_qkv` computes the three projections as one matmul against the concatenated weights; the
    parameters stay separate, so checkpoints keep the usual layout.
    """

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
        self.fused_qkv = False
        self._fused_cache: tuple | None = None

    def fused_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The concatenated [3H, H] weight and [3H] bias of the fused projection.

        Training concatenates on every call (gradients must reach the three parameters). Without gradients
        (inference) the concatenation, a copy of 3H x H numbers per layer, is kept and reused until a
        parameter is replaced or changed in place (its storage or version counter moves) or the module
        is switched to train mode (fused optimizers update in place without moving the version counter).
        """
        parts = (self.query.weight, self.key.weight, self.value.weight, self.query.bias, self.key.bias,
                 self.value.bias)
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(p.requires_grad for p in parts)):
            return torch.cat(parts[:3]), torch.cat(parts[3:])
        key = tuple((p.data_ptr(), p._version, p.dtype) for p in parts)
        if self._fused_cache is None or self._fused_cache[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                self._fused_cache = (key, torch.cat(parts[:3]), torch.cat(parts[3:]))
        return self._fused_cache[1], self._fused_cache[2]

    def train(self, mode: bool = True):
        self._fused_cache = None
        return super().train(mode)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [B, T, H] (or [R, H] unpadded).  Returns (same shape, probabilities [B, N, T, T] or None)."""
        if self.fused_qkv:
            weight, bias = self.fused_weights()  # [3H, H], [3H]
            q, k, v = F.linear(x, weight, bias).chunk(3, dim=-1)  # [..., 3H] -> 3 x [..., H]
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        dropout = self.attention_dropout if self.training else 0.0
        context, probs = layout.attend(q, k, v, self.num_heads, dropout, return_probs)
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
        # [B, T, H] -> [B, T, I] -> [B, T, H]
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


class Pooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls))  # [..., H] [CLS] vectors -> [..., H]


class BertPretrainedModel(nn.Module):
    """Base of every bertforge model: holds the config, initialises weights as BERT did, saves and loads.

    `from_pretrained` / `save_pretrained` are conveniences that hand over to `bertforge.artifacts`, the one
    place that reads and writes model directories (imported late, as it sits above the model in the layering).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        """Truncation-free normal(0, initializer_range) weights, zero biases, unit LayerNorm (as BERT does)."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, Embeddings) and module.sinusoidal:
                with torch.no_grad():
                    module.position.weight.copy_(sinusoidal_table(*module.position.weight.shape))
        self.tie_weights()

    def tie_weights(self) -> None:
        """Point output embeddings at the input ones (task models with an MLM head override this)."""

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        from bertforge.artifacts import load_model

        return load_model(path, cls, **kwargs)

    def save_pretrained(self, path, tokenizer=None, **kwargs) -> None:
        from bertforge.artifacts import save_model

        save_model(self, path, tokenizer=tokenizer, **kwargs)


class BertModel(BertPretrainedModel):
    """The BERT encoder with its pooler.

    Args:
        config: the architecture.
        add_pooling_layer: False drops the pooler (token-level tasks do not need it).
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.unpad = False
        self.activation_checkpointing = False
        self.init_weights()

    def set_activation_checkpointing(self, enabled: bool = True) -> None:
        """Keep only each layer's input during training and recompute the layer in the backward pass.

        Activation memory drops from every layer's intermediates to one [B, T, H] tensor per layer, for about a
        third more compute: what lets BERT-large fine-tune on a small GPU. Dropout masks are replayed exactly
        (the RNG state is saved with each checkpoint), so gradients equal those of the plain path.
        """
        self.activation_checkpointing = bool(enabled)

    def set_fast_path(self, *, unpad: bool | None = None, fused_qkv: bool | None = None) -> None:
        """Switch the fast paths (both off by default; each is tested equal to the plain path).

        unpad: skip padding tokens in every matmul (batches with an attention_mask only).
        fused_qkv: one [3H, H] projection instead of three [H, H] ones.
        """
        if unpad is not None:
            self.unpad = unpad
        if fused_qkv is not None:
            for layer in self.encoder.layers:
                layer.attention.fused_qkv = fused_qkv

    def check_inputs(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> None:
        """Turn the cryptic index errors of out-of-range inputs into messages that say what to do."""
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        tokens = input_ids.shape[1]
        limit = self.config.max_position_embeddings
        if tokens > limit:
            raise InputError(f"sequence of {tokens} tokens is longer than max_position_embeddings={limit}; "
                             "truncate it or split it into windows with a stride")
        # Value checks need the data; on an accelerator they would force a sync on every step, so they run
        # for CPU tensors only (where index errors are also the least readable).
        if input_ids.device.type == "cpu" and input_ids.numel() and not torch.compiler.is_compiling():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.config.vocab_size:
                bad = low if low < 0 else high
                raise InputError(f"token id {bad} is outside the vocabulary (size {self.config.vocab_size}); "
                                 "was the text encoded with this model's vocab.txt?")
            if token_type_ids is not None and token_type_ids.numel():
                if int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= self.config.type_vocab_size:
                    raise InputError(f"token_type_ids must lie in [0, {self.config.type_vocab_size}); "
                                     "BERT uses 0 for segment A and 1 for segment B")

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        sequence_ids: torch.Tensor | None = None,
    ) -> BertOutput:
        """Encode a batch.

        Args:
            input_ids: long [B, T].
            token_type_ids: long [B, T], 0 for segment A and 1 for B (default all 0).
            attention_mask: [B, T], 1 for real tokens and 0 for padding (default all 1).
            position_ids: long [B, T] or [T] (default 0..T-1, restarting with every packed sequence).
            sequence_ids: long [B, T] for packed rows (several sequences per row, `data.collate.pack_rows`):
                k > 0 for the k-th sequence of its row, 0 for padding. Each sequence attends only to itself
                and the pooled output has one row per sequence, [S, H], in row-major order. It replaces
                `attention_mask`.
        """
        self.check_inputs(input_ids, token_type_ids)
        batch, tokens = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        in_sequence = None
        if sequence_ids is not None:
            attention_mask = (sequence_ids > 0).long()
            in_sequence = packed_positions(sequence_ids)  # [B, T] position within each packed sequence
            if position_ids is None:
                position_ids = in_sequence
        if position_ids is None:
            position_ids = torch.arange(tokens, device=input_ids.device)[None, :]  # [1, T]
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # [B, T, H]
        layout: Padded | Unpadded
        if sequence_ids is not None and self.unpad and not output_attentions:
            layout = Unpadded(attention_mask, sequence_ids)
            x = layout.gather(x)  # [B, T, H] -> [R, H]
        elif sequence_ids is not None:
            layout = Padded(packed_mask(sequence_ids))
        elif attention_mask is not None and not output_attentions and self.unpad and not (
                not attention_mask.is_cuda and bool(attention_mask.all())):  # no padding: nothing to skip
            layout = Unpadded(attention_mask)
            x = layout.gather(x)  # [B, T, H] -> [R, H]
        else:
            mask = None if attention_mask is None else attention_mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, T]
            layout = Padded(mask)
        restore = layout.scatter if isinstance(layout, Unpadded) else (lambda h: h)
        hidden_states = [restore(x)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        checkpointing = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.encoder.layers:
            if checkpointing:
                x, probs = torch.utils.checkpoint.checkpoint(layer, x, layout, output_attentions, use_reentrant=False)
            else:
                x, probs = layer(x, layout, output_attentions)
            if hidden_states is not None:
                hidden_states.append(restore(x))
            if attentions is not None:
                attentions.append(probs)
        x = restore(x)  # [R, H] -> [B, T, H] (zeros at padding) on the unpadded path
        pooled = None
        if self.pooler is not None:
            if sequence_ids is None:
                pooled = self.pooler(x[:, 0])  # the [CLS] token of every row: [B, H]
            else:
                first = (in_sequence == 0) & (sequence_ids > 0)  # [B, T] each sequence's [CLS]
                pooled = self.pooler(x[first])  # [S, H]
        return BertOutput(
            last_hidden_state=x,
            pooled_output=pooled,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )


def set_fast_paths(model: nn.Module, *, unpad: bool = True, fused_qkv: bool = True) -> nn.Module:
    """Switch the fast paths of every `BertModel` inside `model` (a task model holds one as `.bert`)."""
    for module in model.modules():
        if isinstance(module, BertModel):
            module.set_fast_path(unpad=unpad, fused_qkv=fused_qkv)
    return model
