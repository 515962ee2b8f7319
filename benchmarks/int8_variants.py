"""Which int8 projection costs a fine-tuned model its accuracy, and what per-token activation scales buy.

Scores one fine-tuned model on one data file through `bertforge evaluate`'s path (`prepare_evaluation`, the
family's features, decoder and `score`) at fp32 and at int8 variants made of the same `Int8Linear`:

    int8          bertforge's int8 (`quantize_int8`: per tensor, the feed-forward down projection per token)
    per-tensor    every projection per tensor (one activation scale per call)
    per-token     every projection per token
    fp32-qkv, fp32-output, fp32-up, fp32-down
                  bertforge's int8 with that one projection left in fp32

and prints each variant's change against fp32 with its 95% paired-bootstrap interval
(`bertforge.evaluation.intervals`, as `bertforge evaluate --against` and `benchmarks/accuracy_intervals.py`).
docs/cpu_inference.md ("Per-token scales for the down projection") has what it measured on the accuracy
budget's models.

    python -m benchmarks.int8_variants --model runs/budget/stsb-full/best \\
        --data ../shared/data/glue/STS-B/dev.tsv --variants int8 per-tensor fp32-down
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

from benchmarks.scoring_args import add_scoring_arguments, check_scoring_arguments, table
from bertforge.engine.int8 import Int8Linear, quantization_engine, quantize_int8, small_rows
from bertforge.engine.layer_graph import trace_layers
from bertforge.engine.row_chunks import chunk_rows
from bertforge.evaluation.intervals import paired_changes
from bertforge.evaluation.saved_model import prepare_evaluation
from bertforge.families import registry
from bertforge.model.fast_paths import is_layer
from bertforge.storage import write_json

PROJECTIONS = ("qkv", "output", "up", "down")
VARIANTS = ("int8", "per-tensor", "per-token", *(f"fp32-{name}" for name in PROJECTIONS))


def float_projections(layer: nn.Module) -> dict[str, nn.Linear]:
    """A float layer's four projections as `nn.Linear`s, the query/key/value one fused ([3H, H])."""
    attention, ff = layer.attention, layer.feed_forward
    if hasattr(attention, "qkv_weight"):  # fused (`fast_paths.fuse_qkv`, the loaded default)
        weight, bias = attention.qkv_weight, attention.qkv_bias
    else:
        weight = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight])
        bias = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])
    qkv = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        qkv.weight.copy_(weight)
        qkv.bias.copy_(bias)
    return {"qkv": qkv, "output": attention.output, "up": ff.up, "down": ff.down}


def install(layer: nn.Module, name: str, module: nn.Module) -> None:
    owner = layer.attention if name in ("qkv", "output") else layer.feed_forward
    setattr(owner, name, module)


def variant_model(prepared, variant: str) -> nn.Module:
    """The saved model loaded, quantized by `quantize_int8`, then changed as `variant` says (module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    model, _ = registry.load_model(prepared.directory, prepared.family.model_class, device="cpu")
    quantize_int8(model)
    if variant == "int8":
        return chunk_rows(trace_layers(model))
    reference, _ = registry.load_model(prepared.directory, prepared.family.model_class, device="cpu")
    engine = quantization_engine()
    rows, small = small_rows(prepared.directory.config, engine)
    layers = [m for m in model.modules() if is_layer(m)]
    float_layers = [m for m in reference.modules() if is_layer(m)]
    for layer, float_layer in zip(layers, float_layers, strict=True):
        for name, linear in float_projections(float_layer).items():
            if variant in ("per-tensor", "per-token"):
                install(layer, name, Int8Linear(linear.weight, linear.bias, engine, per_token=variant == "per-token",
                                                small_rows=rows, small_engine=small))
            elif variant == f"fp32-{name}":
                install(layer, name, linear.eval())
    return chunk_rows(trace_layers(model))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_scoring_arguments(parser)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args(argv)
    check_scoring_arguments(parser, args)
    torch.set_num_threads(args.threads)
    prepared = prepare_evaluation(args.model, args.data, batch_size=args.batch_size, device="cpu", limit=args.limit)
    reference = prepared.evaluation
    model, _ = registry.load_model(prepared.directory, prepared.family.model_class, device="cpu")
    results = {"fp32": reference.results(model)}
    int8 = reference.at_precision("int8")
    for variant in args.variants:
        results[variant] = int8.results(variant_model(prepared, variant))
    report = paired_changes(reference, results, [(name, "fp32") for name in args.variants],
                            resamples=args.resamples, seed=args.seed)
    if args.out:
        write_json(args.out, {"model": args.model, "data": args.data, "examples": len(reference.examples),
                              "resamples": args.resamples, "seed": args.seed, **report})
    print(json.dumps({metric: round(100 * value, 2) for metric, value in report["scores"]["fp32"].items()}))
    print("\n".join(table(report)))


if __name__ == "__main__":
    main()
