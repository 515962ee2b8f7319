"""HTTP serving, and nothing else: the app, routes in three dialects (ours, OpenAI's embeddings,
text-embeddings-inference's), the guards around every request, the wire schemas, the error envelopes and the
Prometheus metrics. The only package that imports the web framework; what it serves comes from `inference`
(pipelines, the scheduler). Needs the `serve` extra; names are imported lazily, so importing this package
does not.
"""

from bertforge.lazy import lazy_getattr

_LAZY = {
    "create_app": "bertforge.serving.app",
    "serve": "bertforge.serving.app",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
