"""The traced layer stack (`engine.layer_graph.LayerGraph`) and the int8 layers' kernel choice by row count.

A graph must compute what the eager layers compute, bit for bit, on every shape, on both sides of a row
cutoff and at the precisions that trace (int8, bf16 packed for the CPU, each autocast state); it must be used
only for calls it can stand for, and never travel with a pickled model.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import bertforge.engine.int8 as quantization
from bertforge.engine.build import build_engine, plan_engine
from bertforge.engine.int8 import LINEAR_DYNAMIC, Int8Linear, small_rows
from bertforge.engine.layer_graph import has_layer_graph, trace_layers
from bertforge.engine.row_buckets import bucket_rows
from bertforge.model.bert import BertModel
from bertforge.model.fast_paths import set_fast_paths
from bertforge.runtime import autocast

ENGINES = torch.backends.quantized.supported_engines


def prepared(model: BertModel, precision: str) -> BertModel:
    """`model` converted by the CPU engine built for `precision` (the model itself, not the engine)."""
    return build_engine(model, plan_engine("cpu", precision)).model
needs_both_engines = pytest.mark.skipif(not {"onednn", "x86"} <= set(ENGINES),
                                        reason="needs PyTorch's onednn and x86 quantized engines")


def eager(model: BertModel, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """The model's output with its layer graph set aside (the eager forward)."""
    graph, model.encoder.graph = model.encoder.graph, None
    try:
        return model(ids, **kwargs).last_hidden_state
    finally:
        model.encoder.graph = graph


def int8_model(tiny_config, monkeypatch, cutoff: int | None = None) -> BertModel:
    """A tiny int8 model; with `cutoff`, prepared as on an AMX CPU with x86 kernels up to `cutoff` rows."""
    if cutoff is not None:
        monkeypatch.setattr(quantization, "has_amx", lambda: True)
        monkeypatch.setattr(quantization, "SMALL_WORK",
                            (cutoff + 0.5) * (tiny_config.hidden_size * tiny_config.intermediate_size) ** 0.5)
    torch.manual_seed(0)
    return prepared(set_fast_paths(BertModel(tiny_config)), "int8")


def test_layer_graph_equals_eager_bit_for_bit_on_any_shape(tiny_config, monkeypatch):
    model = int8_model(tiny_config, monkeypatch)
    assert has_layer_graph(model)
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for shape in [(1, 2), (1, 17), (3, 9), (1, 64), (2, 5)]:  # traced once, on the first shape
            ids = torch.randint(5, tiny_config.vocab_size, shape, generator=generator)
            assert torch.equal(model(ids).last_hidden_state, eager(model, ids)), shape
    with torch.no_grad():  # traced under inference mode, run outside it
        assert torch.equal(model(ids).last_hidden_state, eager(model, ids))
    assert len(model.encoder.graph.graphs) >= 1


@needs_both_engines
def test_layer_graph_traces_each_side_of_a_row_cutoff(tiny_config, monkeypatch):
    model = int8_model(tiny_config, monkeypatch, cutoff=6)
    assert model.encoder.graph.cutoffs == [6]
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for shape in [(1, 6), (1, 7), (2, 3), (2, 4), (1, 30), (1, 1)]:  # rows 6 | 7, 6 | 8, 30 | 1
            ids = torch.randint(5, tiny_config.vocab_size, shape, generator=generator)
            assert torch.equal(model(ids).last_hidden_state, eager(model, ids)), shape
    assert sorted(model.encoder.graph.graphs) == [(0, None), (1, None)]  # one graph per interval, traced once


def test_layer_graph_runs_only_calls_it_can_stand_for(tiny_config, monkeypatch):
    model = int8_model(tiny_config, monkeypatch)
    graphs = model.encoder.graph.graphs
    ids = torch.randint(5, tiny_config.vocab_size, (2, 8))
    padded = torch.ones_like(ids)
    padded[1, 5:] = 0
    with torch.inference_mode():
        model(ids, attention_mask=padded)  # padding: the unpadded layout, eager
        model(ids, output_hidden_states=True)
        model(ids, output_attentions=True)
    with torch.no_grad():
        model.train()
        model(ids)  # training mode: eager (dropout)
        model.eval()
    assert not graphs
    with torch.inference_mode():
        model(ids, attention_mask=torch.ones_like(ids))  # no padding: the graph
    assert len(graphs) == 1


def test_layer_graph_is_left_out_of_a_pickled_model(tiny_config, monkeypatch):
    model = int8_model(tiny_config, monkeypatch)
    ids = torch.randint(5, tiny_config.vocab_size, (1, 12))
    with torch.inference_mode():
        expected = model(ids).last_hidden_state  # traced now
        copy = pickle.loads(pickle.dumps(model))
        assert copy.encoder.graph is None
        assert torch.equal(copy(ids).last_hidden_state, expected)


def test_layer_graph_of_a_bf16_model_equals_eager_bit_for_bit(tiny_config):
    torch.manual_seed(0)
    model = prepared(set_fast_paths(BertModel(tiny_config)), "bf16")  # packed where oneDNN has bf16
    assert has_layer_graph(model)
    generator = torch.Generator().manual_seed(3)
    with torch.inference_mode(), autocast(torch.device("cpu"), "bf16"):
        for shape in [(1, 9), (1, 2), (1, 33), (2, 7)]:  # row counts on and off a row bucket's size
            ids = torch.randint(5, tiny_config.vocab_size, shape, generator=generator)
            out = model(ids).last_hidden_state
            assert out.dtype == torch.float32 and torch.equal(out, eager(model, ids)), shape
    assert list(model.encoder.graph.graphs) == [(0, torch.bfloat16)]


def test_layer_graph_keeps_a_graph_per_autocast_state(tiny_config):
    torch.manual_seed(0)
    model = trace_layers(set_fast_paths(BertModel(tiny_config)))  # fp32 weights: autocast casts them
    ids = torch.randint(5, tiny_config.vocab_size, (1, 11))
    with torch.inference_mode():
        with autocast(torch.device("cpu"), "bf16"):
            low = model(ids).last_hidden_state
            assert torch.equal(low, eager(model, ids))
        full = model(ids).last_hidden_state  # not the graph traced under autocast
        assert torch.equal(full, eager(model, ids))
    assert not torch.equal(low, full)
    assert sorted(model.encoder.graph.graphs, key=str) == [(0, None), (0, torch.bfloat16)]


def test_trace_layers_is_idempotent_and_keeps_weights_shared(tiny_config):
    torch.manual_seed(0)
    model = trace_layers(set_fast_paths(BertModel(tiny_config)))
    graph = model.encoder.graph
    assert trace_layers(model).encoder.graph is graph
    assert not model.training and all(p.requires_grad for p in model.parameters())  # gradients: the caller's
    ids = torch.randint(5, tiny_config.vocab_size, (1, 10))
    with torch.inference_mode():
        assert torch.equal(model(ids).last_hidden_state, eager(model, ids))  # fp32 traces too
    with torch.no_grad():  # the weights are the module's own: an in-place update reaches the graph
        model.encoder.layers[0].feed_forward.up.weight.mul_(0.5)
        assert torch.equal(model(ids).last_hidden_state, eager(model, ids))


def test_build_engine_gives_an_fp32_cpu_model_its_layer_graph(tiny_config):
    torch.manual_seed(0)
    model = prepared(set_fast_paths(BertModel(tiny_config)), "fp32")
    assert has_layer_graph(model)
    ids = torch.randint(5, tiny_config.vocab_size, (1, 13))
    with torch.inference_mode():
        assert torch.equal(model(ids).last_hidden_state, eager(model, ids))
    assert list(model.encoder.graph.graphs) == [(0, None)]


def test_set_fast_paths_makes_a_traced_stack_trace_again(tiny_config):
    torch.manual_seed(0)
    model = trace_layers(set_fast_paths(BertModel(tiny_config)))
    ids = torch.randint(5, tiny_config.vocab_size, (1, 10))
    with torch.inference_mode():
        model(ids)  # traced with the fused QKV projection
        set_fast_paths(model, unpad=False, fused_qkv=False)  # replaces the attention modules the graph held
        assert not model.encoder.graph.graphs
        with torch.no_grad():
            model.encoder.layers[0].attention.query.weight.zero_()  # a change only the new modules see
        assert torch.equal(model(ids).last_hidden_state, eager(model, ids))


@needs_both_engines
def test_int8_linear_runs_few_rows_on_the_small_pack(tiny_config):
    torch.manual_seed(3)
    weight, bias = torch.randn(48, 32) * 0.1, torch.randn(48)
    linear = Int8Linear(weight, bias, "onednn", small_rows=4, small_engine="x86")
    assert linear.small_rows == 4 and "x86 up to 4 rows" in repr(linear)
    for rows in (1, 4, 5, 9):
        x = torch.randn(rows, 32)
        if rows <= 4:  # fbgemm's pack, called as is
            expected = LINEAR_DYNAMIC(x, linear._small, quantization.REDUCE_RANGE)
        else:  # oneDNN's pack, called on the rows padded to their bucket (quantization.bucket_rows)
            padded = torch.nn.functional.pad(x, [0, 0, 0, bucket_rows(rows) - rows])
            expected = LINEAR_DYNAMIC(padded, linear._packed, quantization.REDUCE_RANGE)[:rows]
        assert torch.equal(linear(x), expected), rows
    single = Int8Linear(weight, bias, "x86", small_rows=4, small_engine="x86")  # one engine: one pack
    assert single._small is None and single.small_rows == 0


def test_small_rows_follows_the_feed_forward_shape(tiny_config):
    config = tiny_config.replace(hidden_size=384, intermediate_size=1536, num_attention_heads=12)
    rows, engine = small_rows(config, "onednn")
    if "x86" in ENGINES:
        assert (rows, engine) == (int(quantization.SMALL_WORK / 768), "x86") and rows == 42
    assert small_rows(config, "x86") == (0, None)  # no AMX: fbgemm serves every call already
