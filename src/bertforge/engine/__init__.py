"""A model prepared to run (row 4, above the families, below evaluation): one engine per way of running.

- `plan`: `EnginePlan` (device, precision, engine kind, threads, and why) and `plan_precision`, the one rule
  that accepts or refuses a device/precision pair for every command;
- `engine`: `Engine`, model-shaped (a family's forward takes it where it takes a model; attributes are the
  wrapped model's), which knows its plan, describes itself (`/health`) and enters inference mode and autocast
  around a run (`running`); `TorchEngine`, the PyTorch model with its converters applied;
- the converters, one file each, applied to a loaded model in place: `int8` (dynamic int8 linears), `bf16`
  (linears cast and packed once for the CPU), `layer_graph` (the layer stack traced as one graph),
  `row_chunks` (a large CPU batch in chunks of rows); `linears` is the one walk that replaces the encoder's
  linear layers (int8 and bf16 use it), `row_buckets` the row padding their oneDNN kernels need;
- `build`: `ENGINES` (engine kind -> class), `plan_engine` (a user's flags -> a plan), `build_engine` (the only
  place converters and engines are chosen), `as_engine` (what a runner holds) and `check_precision`;
- `onnx_export` (the ONNX graph of a model, parity-checked against PyTorch) and `onnx_graph` (ONNX Runtime's
  fusions and int8 quantization of it): `bertforge export`'s, and what an engine that runs a graph runs.

Names are imported lazily: importing the package loads nothing.
"""

from bertforge.lazy import lazy_getattr

_LAZY = {
    "EnginePlan": "bertforge.engine.plan",
    "Engine": "bertforge.engine.engine",
    "TorchEngine": "bertforge.engine.engine",
    "ENGINES": "bertforge.engine.build",
    "KINDS": "bertforge.engine.build",
    "plan_engine": "bertforge.engine.build",
    "build_engine": "bertforge.engine.build",
    "as_engine": "bertforge.engine.build",
    "check_precision": "bertforge.engine.build",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = list(_LAZY)
