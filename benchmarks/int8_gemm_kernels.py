"""The int8 matmul kernel alone: PyTorch's `quantized::linear_dynamic` (what bertforge int8 runs) against ONNX
Runtime's dynamically quantized MatMul (what ONNX Runtime int8 runs), on BERT-base's or MiniLM's four
projection shapes. A third column times `torch._int_mm` (int8 x int8 -> int32, nothing around it: no
quantizing of the input, no scaling back): the floor a PyTorch int8 linear could reach with that kernel.

Each shape is one ONNX graph (MatMul + Add) quantized with `quantize_dynamic` (int8 weights per channel,
activations quantized at run time: the same scheme as ours) and one packed PyTorch weight; both get the same
input and 2 intra-op threads. ONNX Runtime's spinning threads are turned off and the two kernels are timed
in turn with a pause between, so neither steals the other's cores; each figure is the better of two rounds.
Our linear is built as `quantize_int8` builds it (with its small-rows pack on an AMX CPU), so each row count
runs on the engine the model would use. Run with `--threads 1` and `--threads 2` to see which kernels use a
second core at batch-1 sizes.

    python -m benchmarks.int8_gemm_kernels [--model base|minilm] [--tokens 16,95,512,2048] [--threads 2] [--json FILE]

It tells whether a gap between bertforge int8 and ONNX Runtime int8 on a whole model lies in the matmul
kernel (which bertforge does not own) or in the code around it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

PROJECTIONS = ("QKV", "attention output", "feed-forward up", "feed-forward down")
SIZES = {"base": (768, 3072), "minilm": (384, 1536)}  # (hidden, intermediate)


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """(in, out) of the model's four encoder projections."""
    hidden, inner = SIZES[model]
    return dict(zip(PROJECTIONS, [(hidden, 3 * hidden), (hidden, hidden), (hidden, inner), (inner, hidden)]))


def best_ms(call, calls: int) -> float:
    for _ in range(5):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1000


def ort_session(weight: np.ndarray, bias: np.ndarray, work: Path, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    inputs, outputs = weight.shape[1], weight.shape[0]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])], "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", outputs])],
        [numpy_helper.from_array(np.ascontiguousarray(weight.T), "w"), numpy_helper.from_array(bias, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), work / "fp32.onnx")
    quantize_dynamic(work / "fp32.onnx", work / "int8.onnx", weight_type=QuantType.QInt8, per_channel=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(work / "int8.onnx"), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SIZES), default="base", help="whose projection shapes")
    parser.add_argument("--tokens", default="16,95,512,2048", help="rows of the activation (comma list)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice to pre-process
    from bertforge.engine.int8 import Int8Linear, quantization_engine, small_rows
    from bertforge.model.config import BertConfig

    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        hidden, inner = SIZES[args.model]
        engine = quantization_engine()
        few_rows, few_engine = small_rows(BertConfig(hidden_size=hidden, intermediate_size=inner,
                                                     num_attention_heads=hidden // 64), engine)
        for name, (inputs, outputs) in shapes(args.model).items():
            weight = torch.randn(outputs, inputs, generator=generator) * 0.05
            bias = torch.randn(outputs, generator=generator) * 0.1
            ours = Int8Linear(weight, bias, engine, small_rows=few_rows, small_engine=few_engine)
            int8_weight_t = ours.int8_weight().t()  # [in, out] int8, a view: _int_mm's fastest layout here
            session = ort_session(weight.numpy(), bias.numpy(), Path(tmp), args.threads)
            for tokens in (int(t) for t in args.tokens.split(",")):
                x = torch.randn(tokens, inputs, generator=generator)
                x_int8 = torch.randint(-127, 128, (tokens, inputs), generator=generator, dtype=torch.int8)
                feed = {"x": x.numpy()}
                calls = max(5, 4000 // tokens)
                torch_ms, ort_ms, int_mm_ms = [], [], []
                for _ in range(2):
                    torch_ms.append(best_ms(lambda x=x, ours=ours: ours(x), calls))
                    time.sleep(0.2)
                    ort_ms.append(best_ms(lambda s=session, f=feed: s.run(None, f), calls))
                    time.sleep(0.2)
                    int_mm_ms.append(best_ms(lambda a=x_int8, b=int8_weight_t: torch._int_mm(a, b), calls))
                    time.sleep(0.2)
                ops = 2 * tokens * inputs * outputs / 1e9
                engine_used = few_engine if tokens <= ours.small_rows else engine
                row = {"projection": name, "tokens": tokens, "in": inputs, "out": outputs, "engine": engine_used,
                       "torch_ms": min(torch_ms), "ort_ms": min(ort_ms), "int_mm_ms": min(int_mm_ms),
                       "torch_gops": ops / min(torch_ms) * 1000, "ort_gops": ops / min(ort_ms) * 1000}
                rows.append(row)
                print(f"{name:18s} {tokens:5d} x {inputs:4d} -> {outputs:4d}: torch ({engine_used}) "
                      f"{row['torch_ms']:7.3f} ms ({row['torch_gops']:4.0f} GOP/s)  ONNX Runtime {row['ort_ms']:7.3f} ms "
                      f"({row['ort_gops']:4.0f} GOP/s)  torch / ORT speed {row['ort_ms'] / row['torch_ms']:.2f}  "
                      f"_int_mm alone {row['int_mm_ms']:7.3f} ms", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "threads": args.threads, "torch": torch.__version__,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
