"""The server's Prometheus metrics: what they are named and measure, and their text for `GET /metrics`.

Written with `prometheus_client` (the `serve` extra), in a registry of each app's own, so several apps in
one process (the tests) count apart. The names, types and labels are a contract with whoever scrapes the
server; `METRIC_NAMES` lists every name the text carries and a test holds the output to it:

- `bertforge_requests_total{route,status}` (counter) and `bertforge_request_latency_seconds{route}`
  (histogram): every HTTP request, counted by the guards (`guards.Guards`) once its answer is sent, whatever
  answered it (a route, a guard's 401/413/415, a 404 or 422): `route` is the route's template
  (`/models/{model}/embed`, never the raw path, so the label's values are bounded), `guards.UNMATCHED` for a
  path no route has; with several models, the model that answered (or the one the path names) counts it
  (`RequestMetrics`, and `""` for a request no model is named by);
- `bertforge_batch_size`, `bertforge_batch_tokens` (histograms of windows and of tokens per model call),
  `bertforge_model_calls_total`, `bertforge_windows_total`, `bertforge_inputs_total{task}`,
  `bertforge_cancelled_total{reason}`, `bertforge_dropped_windows_total` (counters), reported by the
  scheduler through its `SchedulerEvents`;
- `bertforge_queue_depth` (gauge), read from the scheduler at each scrape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from bertforge.inference.scheduler import CANCEL_REASONS, Failure, SchedulerEvents

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the Prometheus text format `generate_latest` writes

# Every sample name /metrics carries, and its type (the histograms' `_bucket`, `_sum`, `_count` each).
METRIC_TYPES = {
    "bertforge_requests_total": "counter",
    "bertforge_request_latency_seconds": "histogram",
    "bertforge_batch_size": "histogram",
    "bertforge_batch_tokens": "histogram",
    "bertforge_inputs_total": "counter",
    "bertforge_model_calls_total": "counter",
    "bertforge_windows_total": "counter",
    "bertforge_cancelled_total": "counter",
    "bertforge_dropped_windows_total": "counter",
    "bertforge_queue_depth": "gauge",
}
METRIC_NAMES = frozenset(
    f"{name}{suffix}" for name, kind in METRIC_TYPES.items()
    for suffix in (("_bucket", "_sum", "_count") if kind == "histogram" else ("",)))


def powers_of_two(low: int, high: int) -> tuple[float, ...]:
    """Bucket bounds 2**low .. 2**high."""
    return tuple(2.0 ** i for i in range(low, high + 1))


class WithoutCreated(Collector):
    """A registry's metrics without the `<name>_created` series prometheus_client adds to each counter and
    histogram (the time it was made): the scrape keeps exactly the names of `METRIC_NAMES`. The switch the
    library offers for this (`disable_created_metrics`) is process-wide; this view touches only our registry."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if s.name != family.name + "_created"]
            yield kept


class RequestMetrics:
    """HTTP requests by route template and status, and their latency, in a registry of their own (or `registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("bertforge_requests", "HTTP requests by route and status code.",
                                ("route", "status"), registry=self.registry)
        self.latency = Histogram("bertforge_request_latency_seconds", "Time from request arrival to response.",
                                 ("route",), buckets=LATENCY_BUCKETS, registry=self.registry)
        self.exposed = WithoutCreated(self.registry)

    def record_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)


class ServingMetrics(RequestMetrics, SchedulerEvents):
    """The metrics of one served model: its HTTP requests (`RequestMetrics`), the scheduler's work by its events."""

    def __init__(self, max_batch_size: int, max_batch_tokens: int, queue_depth: Callable[[], int]):
        super().__init__()
        registry = self.registry
        # Bucket bounds cover the configured limits with room above (a window over the token budget runs alone).
        self.batch_size = Histogram("bertforge_batch_size", "Windows (model inputs) per model call.",
                                    buckets=powers_of_two(0, int(math.log2(max_batch_size)) + 3), registry=registry)
        self.batch_tokens = Histogram("bertforge_batch_tokens", "Tokens per model call (at most max_batch_tokens).",
                                      buckets=powers_of_two(4, int(math.log2(max_batch_tokens)) + 1),
                                      registry=registry)
        self.inputs = Counter("bertforge_inputs", "Inputs answered by task.", ("task",), registry=registry)
        self.model_calls = Counter("bertforge_model_calls", "Model calls made by the worker.", registry=registry)
        self.windows = Counter("bertforge_windows", "Windows run by the model.", registry=registry)
        self.cancelled_requests = Counter(
            "bertforge_cancelled", "Requests given up before their answer (client gone, timeout).", ("reason",),
            registry=registry)
        for reason in CANCEL_REASONS:  # both reasons are reported from the start, at 0
            self.cancelled_requests.labels(reason=reason)
        self.dropped_windows = Counter("bertforge_dropped_windows",
                                       "Windows of given-up requests that were never run.", registry=registry)
        depth = Gauge("bertforge_queue_depth", "Requests waiting for the worker.", registry=registry)
        depth.set_function(lambda: float(queue_depth()))

    # --- SchedulerEvents -------------------------------------------------------------------------------
    def model_call(self, windows: int, tokens: int) -> None:
        self.model_calls.inc()
        self.windows.inc(windows)
        self.batch_size.observe(windows)
        self.batch_tokens.observe(tokens)

    def answered(self, task: str, inputs: int) -> None:
        self.inputs.labels(task=task).inc(inputs)

    def cancelled(self, reason: Failure) -> None:
        self.cancelled_requests.labels(reason=reason).inc()

    def dropped(self, windows: int) -> None:
        self.dropped_windows.inc(windows)

    def render(self) -> bytes:
        """The Prometheus text of every metric (`CONTENT_TYPE`)."""
        return generate_latest(self.exposed)
