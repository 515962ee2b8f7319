"""Inference: pipelines for people and programs (row 4), the HTTP server (row 5), attention maps, ONNX export.

`pipelines` needs only the core dependencies; `server` needs the `serve` extra (fastapi, uvicorn), the
PNG outputs of `attention` and `plots` the `plot` extra (matplotlib), `export` the `export` extra (onnx,
onnxruntime). Names are imported lazily, so importing this package never requires an extra.
"""

from bertforge.lazy import lazy_getattr

_LAZY = {
    "load_pipeline": "bertforge.inference.pipelines",
    "load_pipelines": "bertforge.inference.pipelines",
    "predict_stream": "bertforge.inference.pipelines",
    "supported_tasks": "bertforge.inference.pipelines",
    "TASKS": "bertforge.inference.pipelines",
    "create_app": "bertforge.inference.server",
    "serve": "bertforge.inference.server",
    "render_attention": "bertforge.inference.attention",
    "export_onnx": "bertforge.inference.export",
    "plot_run": "bertforge.inference.plots",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
