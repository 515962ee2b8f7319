"""Inference without the web: pipelines for people and programs, the request scheduler, corpus jobs (embed,
predict), search, attention maps. The HTTP server is `bertforge.serving`, one row above; what runs a model
(PyTorch or ONNX Runtime, and the ONNX export, `export_onnx`) is `bertforge.engine`, below.

`pipelines` needs only the core dependencies; the PNG outputs of `attention` and `plots` the `plot` extra
(matplotlib), `export_onnx` the `export` extra (onnx, onnxruntime). Names are imported lazily, so importing this
package never requires an extra.
"""

from bertforge.lazy import lazy_getattr

_LAZY = {
    "load_pipeline": "bertforge.inference.pipelines",
    "load_pipelines": "bertforge.inference.pipelines",
    "predict_stream": "bertforge.inference.predict_lines",
    "supported_tasks": "bertforge.inference.pipelines",
    "TASKS": "bertforge.inference.pipelines",
    "render_attention": "bertforge.inference.attention",
    "export_onnx": "bertforge.engine.onnx_export",
    "plot_run": "bertforge.inference.plots",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
