"""The row-chunks converter: a large CPU inference batch runs through the encoder in chunks of rows.

`chunk_rows(model)` turns every encoder inside `model` (`BertModel`) into a `ChunkedRows` variant, whose forward
splits a batch of more than `tokens` tokens into consecutive chunks of `rows_per_chunk` rows, encodes each, and
joins the outputs (`concatenate`): rows never see each other, so every row gets its own result (an int8 model's
per-tensor activation ranges are then each chunk's own). Only calls without gradients are split (an engine's
runs; training keeps its batch whole), and never while being compiled or traced (a graph keeps one
shape-independent path). Applied by `engine.build.build_engine` on the CPU.

Why: the chunk's largest intermediate, the [tokens, I] feed-forward activation, stays within `ROW_CHUNK_BYTES`
in fp32: 2,048 tokens for MiniLM (I = 1,536), 1,024 for BERT-base (3,072), 768 for BERT-large. In one piece, a
32 x 512 batch makes fresh 100-200 MB tensors in every layer, above glibc's 32 MB mmap threshold: each is new
memory the kernel faults in and zeroes page by page, and none of it is in cache. Measured on the 2-core EPYC,
int8, one 32 x 512 batch (docs/notes/cpu_inference.md, "Row chunks"): MiniLM 2.93 s in chunks of 4,096 tokens,
2.44 at 2,048, 2.45 at 1,024, 2.66 at 512; BERT-base 14.1 s at 2,048, 13.2-13.5 at 1,024 and 512.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from bertforge.model.bert import BertOutput
from bertforge.model.fast_paths import Variant, is_encoder, variant

ROW_CHUNK_BYTES = 12 * 2**20


def row_chunk_tokens(config) -> int:
    """The token budget of one row chunk for a model of this config (`ROW_CHUNK_BYTES`)."""
    return max(1, ROW_CHUNK_BYTES // (4 * config.intermediate_size))


def concatenate(parts: list[BertOutput]) -> BertOutput:
    """The outputs of consecutive row chunks as one batch's (every field joined along its first axis)."""
    def join(tensors):
        return None if tensors[0] is None else torch.cat(tensors)

    def join_each(tuples):
        return None if tuples[0] is None else tuple(torch.cat(layer) for layer in zip(*tuples))

    return type(parts[0])(last_hidden_state=join([p.last_hidden_state for p in parts]),
                          pooled_output=join([p.pooled_output for p in parts]),
                          hidden_states=join_each([p.hidden_states for p in parts]),
                          attentions=join_each([p.attentions for p in parts]))


class ChunkedRows(Variant):
    """An encoder that runs a large batch in chunks of rows (module docstring); `row_chunk_tokens` is its
    budget (0: one piece)."""

    prefix = "Chunked"

    def rows_per_chunk(self, input_ids: torch.Tensor) -> int:
        """Rows per chunk when this batch runs in row chunks (0: in one piece)."""
        batch, tokens = input_ids.shape[0], input_ids.shape[-1]
        budget = self.__dict__.get("row_chunk_tokens", 0)
        if not budget or batch * tokens <= budget or torch.is_grad_enabled() or input_ids.device.type != "cpu" \
                or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return 0
        return max(1, budget // tokens)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                sequence_ids: torch.Tensor | None = None, compute_masked: bool = False) -> BertOutput:
        step = self.rows_per_chunk(input_ids) if input_ids.dim() == 2 else 0
        # (passed on only when asked: a wrapped encoder need not take it)
        forward = partial(super().forward, **({"compute_masked": True} if compute_masked else {}))
        if not step:
            return forward(input_ids, token_type_ids, attention_mask, position_ids, output_hidden_states,
                           output_attentions, sequence_ids)
        batch = input_ids.shape[0]

        def rows(t: torch.Tensor | None, start: int) -> torch.Tensor | None:
            # [B, T] inputs are split; None, and position ids shared by every row ([T] or [1, T]), are not.
            return t[start:start + step] if t is not None and t.dim() == 2 and t.shape[0] == batch else t

        return concatenate([forward(rows(input_ids, i), rows(token_type_ids, i), rows(attention_mask, i),
                                    rows(position_ids, i), output_hidden_states, output_attentions,
                                    rows(sequence_ids, i)) for i in range(0, batch, step)])


def chunk_rows(model: nn.Module, tokens: int | None = None) -> nn.Module:
    """Make every encoder inside `model` run large batches in row chunks of `tokens` tokens (default
    `row_chunk_tokens(config)`; 0 turns chunking off). In place; idempotent."""
    for module in model.modules():
        if is_encoder(module):
            if not isinstance(module, ChunkedRows):
                module.__class__ = variant(ChunkedRows, type(module))
            module.__dict__["row_chunk_tokens"] = row_chunk_tokens(module.config) if tokens is None else tokens
    return model


def chunks_rows(model: nn.Module) -> bool:
    """Whether every encoder inside `model` runs large batches in row chunks."""
    encoders = [m for m in model.modules() if is_encoder(m)]
    return bool(encoders) and all(isinstance(m, ChunkedRows) and m.__dict__.get("row_chunk_tokens") for m in encoders)


__all__ = ["ChunkedRows", "ROW_CHUNK_BYTES", "chunk_rows", "chunks_rows", "concatenate", "row_chunk_tokens"]
