"""How the encoder lays out a batch's tokens, and how attention respects that layout.

Shape legend: B batch, T tokens per row, H hidden size, N heads, D head size (H / N), R real (non-padding)
tokens in the batch, S sequences in the batch (one per row, or several per packed row), L one sequence's
length.

`BertModel.forward` asks `choose_layout` for a layout, then runs

    x = layout.enter(embeddings)   # [B, T, H] -> the layout's shape
    ... every layer: layout.attend(q, k, v, ...) ...
    layout.leave(x)                # -> [B, T, H]

- `Padded`: [B, T, H], padded keys masked out of the softmax. The reference path of the paper.
- `Unpadded`: only the real tokens, [R, H]; projections, feed-forward and LayerNorms never touch padding,
  and attention runs per sequence (the variable-length flash kernel on CUDA, one SDPA call per sequence on
  CPU). Equal to `Padded` at every real position; padding positions come back as zeros.

Attention may be local (`window`: a query sees only the keys at most `window` positions away, ModernBERT's
sliding-window layers): over a row (or a sequence) longer than 4 windows only the band is computed
(`banded_attention`: blocks of `window` queries, each attending to its own and its neighbours' keys); shorter
ones take one call with a banded mask, in the padded layout and in the per-sequence CPU calls (on CUDA, local
layers take the padded path).

Rows may hold several packed sequences (`sequence_ids`: k > 0 for the k-th sequence of its row, 0 for
padding, as `data.collate.pack_rows` builds them); each sequence then attends only to itself.

Under `torch.compile` no layout reads the batch on the host: the real-token count and the packed sequences'
bounds stay tensors whose sizes come from the data (the loop traces them into the graph:
`training.loop.compiled`), the per-sequence CPU path and the input checks are left out, and the
variable-length kernel gets the row length as its bound on a sequence's length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bertforge.errors import InputError

try:  # PyTorch >= 2.9 on CUDA: flash attention over packed variable-length sequences.
    from torch.nn.attention.varlen import varlen_attn as varlen_attention
except ImportError:  # pragma: no cover - depends on the installed torch
    varlen_attention = None


def packed_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal attention mask of packed rows: bool [B, 1, T, T], True = query may attend to key.

    sequence_ids: [B, T]. A token sees only the tokens of its own sequence. Padding queries see every real
    token of their row: their outputs are discarded, but a query that sees nothing would turn into NaN
    inside the softmax.
    """
    real_key = (sequence_ids > 0)[:, None, :]  # [B, 1, T]
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]  # [B, T, T]
    pad_query = (sequence_ids == 0)[:, :, None]  # [B, T, 1]
    return ((same | pad_query) & real_key)[:, None]  # [B, 1, T, T]


def packed_positions(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Position ids that restart at 0 with every packed sequence: long [B, T] (padding gets 0..)."""
    tokens = sequence_ids.shape[1]
    index = torch.arange(tokens, device=sequence_ids.device).expand_as(sequence_ids)  # [B, T]
    starts = F.pad(sequence_ids[:, 1:] != sequence_ids[:, :-1], (1, 0), value=True)  # [B, T] first of a run
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # [B, T] start of my run
    return index - first


def band(tokens: int, window: int, device: torch.device) -> torch.Tensor:
    """Sliding-window mask: bool [T, T], True where |query - key| <= window."""
    index = torch.arange(tokens, device=device)
    return (index[:, None] - index[None, :]).abs() <= window  # [T, T]


def windowed(mask: torch.Tensor | None, tokens: int, window: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """A padding (or packed) mask ([B, 1, 1, T], [B, 1, T, T] or None) narrowed to the window: (bool
    [B or 1, 1, T, T], sighted bool [B or 1, 1, T, 1]: the queries that see a key). A query that sees no key
    (a masked position farther than the window from any real token: padding, or ColBERT's non-attended query
    expansion) gets itself in the mask, since a query that sees nothing turns into NaN inside some softmaxes
    (ONNX Runtime's, bf16 kernels'), which mean pooling would then spread over the whole row; its context is
    then zeroed (`Padded.attend`), what torch's SDPA and transformers give such a query."""
    banded = band(tokens, window, device)[None, None]  # [1, 1, T, T]
    if mask is not None:
        banded = banded & mask
    sighted = banded.sum(-1, keepdim=True) > 0  # [B or 1, 1, T, 1]
    # (the diagonal, not `torch.eye`: ONNX Runtime has no bool EyeLike)
    return banded | (band(tokens, 0, device) & ~sighted), sighted


def computes_band_only(tokens: int, window: int | None) -> bool:
    """Whether a layer of this `window` attends block by block (`banded_attention`) at `tokens` tokens: where a
    query's 3 blocks of keys are fewer than the row's T keys by a margin (below it, one masked T x T call is as
    cheap and makes fewer kernels). Not while tracing (a traced graph keeps the one masked form, right at any
    length: `engine.onnx_export`)."""
    return window is not None and window > 0 and tokens > 4 * window and not torch.jit.is_tracing()


def band_blocks_mask(batch: int, tokens: int, window: int, real: torch.Tensor | None, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The mask of `banded_attention` for rows of `tokens` tokens (`real` bool [B, T] or None: every token real):
    (bool [B * nb, 1, W, 3W], the queries that see a key [B * nb, 1, W, 1] or None when every query sees itself).
    Query r of block i (position iW + r) may see key c of its 3 blocks (position (i - 1)W + c) when it is in the
    window, |c - W - r| <= W, and a real key of the row; a query that sees no key gets itself (`windowed`).
    Made once per forward and window (`Padded`), shared by the layers."""
    width = window
    blocks = -(-tokens // width)
    tail = blocks * width - tokens
    row = torch.arange(width, device=device)[:, None]  # [W, 1]
    column = torch.arange(3 * width, device=device)[None, :]  # [1, 3W]
    in_window = (column - width - row).abs() <= window  # [W, 3W]
    keys = torch.ones(batch, tokens, dtype=torch.bool, device=device) if real is None else real.to(torch.bool)
    keys = F.pad(keys, (width, tail + width)).unfold(1, 3 * width, width)  # [B, nb, 3W]: real keys of each block
    seen = in_window & keys[:, :, None, :]  # [B, nb, W, 3W]
    sighted = seen.any(-1, keepdim=True)  # [B, nb, W, 1]
    mask = (seen | ((column == width + row) & ~sighted)).flatten(0, 1)[:, None]  # [B * nb, 1, W, 3W]
    # (without padding every query sees itself: no pass over the context to zero none)
    return mask, None if real is None else sighted.flatten(0, 1)[:, None]


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, window: int,
                     real: torch.Tensor | None = None, dropout: float = 0.0,
                     masks: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """Sliding-window attention that computes only the band: q, k, v [B, T, H] -> context [B, T, H], each query
    attending to the keys at most `window` positions away (and, with `real` bool [B, T], only to real keys;
    a query whose window holds none gets a zero context, as `windowed` rules). `masks`: `band_blocks_mask` of
    these rows, when the caller keeps it for several layers (made here otherwise).

    The rows are cut into blocks of W = `window` queries (the last block padded). A query of block i sees keys in
    blocks i - 1, i and i + 1 only, so each block attends to those 3W keys, masked to the exact window: one SDPA
    call over [B * nb, N, W, 3W] instead of [B, N, T, T], T / 3W times less attention work (2,048 tokens,
    ModernBERT's window of 64: 10.7x). Equal to the masked T x T call at every query (the same keys, the same
    softmax), up to rounding. The 3W keys of every block are a view, not a copy: the rows' blocks one after
    another in one stream with a block of padding at each end, read in overlapping windows (the first and last
    block of a row then also read a neighbouring row's block, which the mask leaves out as outside the row).
    """
    batch, tokens, hidden = q.shape
    size, width = hidden // heads, window
    blocks = -(-tokens // width)  # nb = ceil(T / W)
    tail = blocks * width - tokens  # padding that fills the last block of each row

    def split(x: torch.Tensor) -> torch.Tensor:
        return x if not tail else F.pad(x, (0, 0, 0, tail))  # [B, T, H] -> [B, nb * W, H]

    # queries: [B, nb * W, H] -> [B * nb, W, N, D] -> [B * nb, N, W, D]
    qb = split(q).reshape(batch * blocks, width, heads, size).transpose(1, 2)

    def around(x: torch.Tensor) -> torch.Tensor:
        """Keys or values of the 3 blocks around each block, as a view: [B, nb * W, H] -> a stream of (B nb + 2)
        blocks [(B nb + 2) W, H] -> windows of 3W every W, [B * nb, H, 3W] -> [B * nb, 3W, N, D] ->
        [B * nb, N, 3W, D] (the queries' layout)."""
        stream = F.pad(split(x).reshape(-1, hidden), (0, 0, width, width))
        return stream.unfold(0, 3 * width, width).transpose(1, 2).unflatten(-1, (heads, size)).transpose(1, 2)

    mask, sighted = masks if masks is not None else band_blocks_mask(batch, tokens, window, real, q.device)
    context = F.scaled_dot_product_attention(qb, around(k), around(v), attn_mask=mask,
                                             dropout_p=dropout)  # [B * nb, N, W, D]
    if sighted is not None:
        context = context * sighted.to(context.dtype)
    # [B * nb, N, W, D] -> [B * nb, W, N, D] -> [B, nb * W, H] -> [B, T, H]
    return context.transpose(1, 2).reshape(batch, blocks * width, hidden)[:, :tokens]


# Above this many sequences in a batch, CPU attention runs as one masked call over the padded layout.
PER_SEQUENCE_ATTENTION_MAX = 4


class Padded:
    """Tokens laid out as [B, T, H]; attention masks padded keys.  The plain, reference path."""

    def __init__(self, mask: torch.Tensor | None):
        self.mask = mask  # bool [B, 1, 1, T] (or [B, 1, T, T] for packed rows), True = attend, or None
        # window -> (the mask narrowed to it, the queries that see a key), and ("band", window) -> the banded
        # blocks' (`band_blocks_mask`), shared by layers
        self.windowed: dict = {}

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def mask_for(self, tokens: int, window: int | None, device: torch.device
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the mask, the queries that see a key or None: all) of a global (`window` None) or local layer, made
        once per window and forward."""
        if window is None or (window >= tokens - 1 and not torch.jit.is_tracing()):
            return self.mask, None  # (a traced graph keeps the band: it must hold at lengths beyond the window too)
        if window not in self.windowed:
            self.windowed[window] = windowed(self.mask, tokens, window, device)
        return self.windowed[window]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, dropout: float,
               return_probs: bool, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: [B, T, H] -> context [B, T, H] (and probabilities [B, N, T, T] if asked); `window`:
        each query sees only keys at most that many positions away."""
        batch, tokens, hidden = q.shape
        # A local layer over a long row, with a padding mask (not packed rows' [B, 1, T, T]): the band only.
        if not return_probs and computes_band_only(tokens, window) and (self.mask is None or self.mask.shape[2] == 1):
            if ("band", window) not in self.windowed:  # made once per forward, shared by the local layers
                real = None if self.mask is None else self.mask[:, 0, 0]  # [B, 1, 1, T] -> [B, T]
                self.windowed["band", window] = band_blocks_mask(batch, tokens, window, real, q.device)
            return banded_attention(q, k, v, heads, window, dropout=dropout,
                                    masks=self.windowed["band", window]), None
        mask, sighted = self.mask_for(tokens, window, q.device)

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, tokens, heads, hidden // heads).transpose(1, 2)  # [B, T, H] -> [B, N, T, D]

        q, k, v = split(q), split(k), split(v)
        probs = None
        if return_probs:
            # The explicit softmax, used only when someone asks to see the attention maps.
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, N, T, T]
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout, dropout > 0) @ v  # [B, N, T, D]
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)  # [B, N, T, D]
        if sighted is not None:  # a query that sees no key: 0, not its own value (`windowed`)
            context = context * sighted.to(context.dtype)  # [B, N, T, D] * [B or 1, 1, T, 1]
        return context.transpose(1, 2).reshape(batch, tokens, hidden), probs  # [B, N, T, D] -> [B, T, H]


class Unpadded:
    """Only the real tokens, laid out as [R, H]: the padding-free fast path.

    Attention runs per sequence, through the variable-length flash kernel where PyTorch has one for this
    device and dtype, or one unmasked SDPA call per sequence on CPU, otherwise by scattering back to [B, T]
    for a masked SDPA call. Either way the real tokens, read row by row, are the sequences one after
    another, and `cu_seqlens` delimits them.
    """

    def __init__(self, attention_mask: torch.Tensor, sequence_ids: torch.Tensor | None = None):
        batch, tokens = attention_mask.shape
        # Under torch.compile nothing here may depend on the data as a Python value (a host read breaks the
        # graph, and every new value would be compiled anew): no host lengths, and the row length bounds them.
        compiling = torch.compiler.is_compiling()
        self.index = attention_mask.reshape(-1).to(torch.bool).nonzero().squeeze(1)  # [R] positions in [B*T]
        self.batch, self.tokens = batch, tokens
        if sequence_ids is None:
            lengths = attention_mask.to(torch.int32).sum(1)  # [B]
            self._padded = lambda: attention_mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, T]
            contiguous = not attention_mask.is_cuda and not compiling and torch.equal(
                attention_mask.to(torch.bool), torch.arange(tokens) < lengths[:, None])
        else:
            # [R] a number for each real token's (row, sequence), so runs never merge across rows
            rows = torch.arange(batch, device=sequence_ids.device)[:, None] * (tokens + 1)  # [B, 1]
            flat = (sequence_ids + rows).reshape(-1)[self.index]
            # [R] the last token of each run (an empty batch has none)
            ends = F.pad(flat[1:] != flat[:-1], (0, 1), value=True) if compiling or flat.numel() else flat.bool()
            bounds = F.pad(ends.nonzero().squeeze(1) + 1, (1, 0))  # [S + 1] where each run starts, then R
            lengths = (bounds[1:] - bounds[:-1]).to(torch.int32)  # [S]
            self._padded = lambda: packed_mask(sequence_ids)  # [B, 1, T, T]
            contiguous = not sequence_ids.is_cuda and not compiling
            if contiguous and len(lengths) != int(sequence_ids.max(dim=1).values.sum()):
                raise InputError("sequence_ids must number each row's packed sequences 1, 2, ... with every "
                                 "sequence one contiguous run of tokens (0 = padding)")
        self.cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # [S + 1]
        # (an upper bound is enough for the variable-length kernel)
        self.max_len = tokens if compiling else int(lengths.max()) if lengths.numel() else 0
        # Sequence lengths on the host, for the per-sequence CPU path; valid when each sequence is one run of
        # real tokens (left-aligned masks; packed rows).
        self.lengths = lengths.tolist() if contiguous else None

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(0, 1).index_select(0, self.index)  # [B, T, ...] -> [B*T, ...] -> [R, ...]

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(self.batch * self.tokens, *x.shape[1:])  # [B*T, ...], zeros at padding
        return out.index_copy(0, self.index, x).view(self.batch, self.tokens, *x.shape[1:])  # -> [B, T, ...]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, dropout: float,
               return_probs: bool, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q, k, v: [R, H] -> context [R, H]; `window` as `Padded.attend`'s."""
        real, hidden = q.shape
        # Local layers take the masked path below on CUDA: the kernel's own window (`window_size`) is not yet
        # held to the padded path by a test on a device.
        if varlen_attention is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) \
                and dropout == 0.0 and not return_probs and window is None:
            shape = (real, heads, hidden // heads)  # [R, H] -> [R, N, D]
            context = varlen_attention(q.view(shape), k.view(shape), v.view(shape), self.cu_seqlens,
                                       self.cu_seqlens, self.max_len, self.max_len)
            return context.reshape(real, hidden), None  # [R, N, D] -> [R, H]
        if self.lengths is not None and not return_probs and len(self.lengths) <= PER_SEQUENCE_ATTENTION_MAX:
            # CPU, few sequences: one unmasked SDPA call per sequence over its own L tokens (L^2 rather than
            # T^2). Many sequences take the one masked call below instead: per-sequence calls are ~30 small
            # kernels per sequence and layer, each a thread barrier, and on shared cores (other processes
            # running) every barrier waits for a descheduled thread (docs/notes/cpu_inference.md, "Contention").
            contexts = []
            for qs, ks, vs in zip(q.split(self.lengths), k.split(self.lengths), v.split(self.lengths)):
                length = qs.shape[0]
                if computes_band_only(length, window):  # a long sequence of a local layer: the band only
                    contexts.append(banded_attention(qs[None], ks[None], vs[None], heads, window,
                                                     dropout=dropout)[0])  # [1, L, H] -> [L, H]
                    continue
                shape = (1, length, heads, hidden // heads)  # [L, H] -> [1, L, N, D] -> [1, N, L, D]
                local = None if window is None or window >= length - 1 else band(length, window, q.device)
                out = F.scaled_dot_product_attention(qs.view(shape).transpose(1, 2), ks.view(shape).transpose(1, 2),
                                                     vs.view(shape).transpose(1, 2), attn_mask=local,
                                                     dropout_p=dropout)
                contexts.append(out.transpose(1, 2).reshape(length, hidden))  # [1, N, L, D] -> [L, H]
            return torch.cat(contexts), None
        # The masked fallback (holes in the mask, CUDA without varlen): built only when used.
        if not isinstance(self._padded, Padded):
            self._padded = Padded(self._padded())  # once per forward, shared by every layer
        context, probs = self._padded.attend(self.leave(q), self.leave(k), self.leave(v), heads, dropout,
                                           return_probs, window)
        return self.enter(context), probs


def choose_layout(attention_mask: torch.Tensor | None, sequence_ids: torch.Tensor | None, *, unpad: bool,
                  output_attentions: bool) -> Padded | Unpadded:
    """The layout of one forward pass.

    Attention maps ([B, N, T, T]) exist only in the padded layout, so `output_attentions` forces it; packed
    rows get their block-diagonal mask there. Unpadding needs a mask with padding to skip: a CPU batch
    without any padding runs padded and unmasked (on CUDA the check would cost a device sync).
    """
    fast = unpad and not output_attentions
    if sequence_ids is not None:
        return Unpadded(sequence_ids > 0, sequence_ids) if fast else Padded(packed_mask(sequence_ids))
    if attention_mask is None:
        return Padded(None)
    if fast and not attention_mask.is_cuda and not torch.compiler.is_compiling() and bool(attention_mask.all()):
        return Padded(None)  # no padding: nothing to skip, and no mask to apply
    if fast:
        return Unpadded(attention_mask)
    return Padded(attention_mask.to(torch.bool)[:, None, None, :])  # [B, T] -> [B, 1, 1, T]
