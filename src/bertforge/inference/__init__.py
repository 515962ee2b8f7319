"""Inference without the web: pipelines for people and programs, the request scheduler, corpus jobs (embed,
predict), search, attention maps, ONNX export. The HTTP server is `bertforge.serving`, one row above.

`pipelines` needs only the core dependencies; the
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
    "render_attention": "bertforge.inference.attention",
    "export_onnx": "bertforge.inference.export",
    "plot_run": "bertforge.inference.plots",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
