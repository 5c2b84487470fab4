"""``/metrics`` in Prometheus text format, read from the engine's counters at scrape time.

A custom collector (no global registry) so two apps in one process, as in the tests, never share or
double-register series. Before the model has loaded every series reads 0.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector:
    def __init__(self, engine: Callable[[], object | None], slots: Callable[[], int] | None = None):
        self.engine = engine        # returns the LLMEngine, or None while it is not loaded
        self.slots = slots          # the server's held request slots (a leak shows here first)

    def collect(self):
        engine = self.engine()
        stats = getattr(engine, "stats", None)
        rates = stats.rates() if stats else {}

        def gauge(name: str, doc: str, value: float):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            return g

        def counter(name: str, doc: str, value: float):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            return c

        if self.slots is not None:
            yield gauge("dlm_server_slots_held", "Request slots the server holds (running, queued or streaming).",
                        self.slots())
        yield gauge("dlm_queue_depth", "Requests waiting to start (those the next step starts included).",
                    engine.num_waiting if engine else 0)
        yield gauge("dlm_queued_requests", "Waiting requests the next step cannot start, for want of a sequence slot "
                    "or KV pages: what --max-waiting bounds.", engine.num_queued if engine else 0)
        yield gauge("dlm_running_requests", "Requests being denoised.", engine.num_running if engine else 0)
        yield gauge("dlm_forward_passes_per_second",
                    "Per-request forward passes per second over the last window (a batch of 8 counts 8).",
                    rates.get("forward_passes_per_second", 0.0))
        yield gauge("dlm_engine_steps_per_second", "Batched model forwards per second over the last window.",
                    rates.get("steps_per_second", 0.0))
        yield gauge("dlm_tokens_per_second", "Generated tokens per second over the last window.",
                    rates.get("tokens_per_second", 0.0))
        yield gauge("dlm_forward_passes_per_token", "Forward passes per generated token since start.",
                    rates.get("forward_passes_per_token", 0.0))
        yield counter("dlm_engine_steps", "Batched model forwards.", stats.steps if stats else 0)
        yield counter("dlm_forward_passes", "Per-request forward passes.", stats.request_passes if stats else 0)
        yield counter("dlm_generated_tokens", "Generated tokens.", stats.generated_tokens if stats else 0)
        yield counter("dlm_requests_rejected", "Requests refused because the queue was full.",
                      stats.rejected if stats else 0)
        kv = getattr(engine, "allocator", None)
        yield gauge("dlm_kv_cache_pages", "KV cache pages in the pool.", kv.num_pages if kv else 0)
        yield gauge("dlm_kv_cache_pages_used", "KV cache pages held by requests (cached prefixes nobody holds "
                    "count as free).", kv.num_used if kv else 0)
        yield counter("dlm_prefix_cache_queries", "Full prompt pages looked up in the prefix cache.",
                      kv.lookups if kv else 0)
        yield counter("dlm_prefix_cache_hits", "Prompt pages found in the prefix cache (their keys and values "
                      "were not computed again).", kv.hits if kv else 0)
        yield gauge("dlm_prefix_cache_hit_rate", "Prefix cache hits / queries since start.", kv.hit_rate if kv else 0.0)
        finished = CounterMetricFamily("dlm_requests_finished", "Finished requests by reason.", labels=["reason"])
        for reason, count in sorted((stats.finished if stats else {}).items()):
            finished.add_metric([reason], count)
        yield finished


def metrics_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def make_registry(engine: Callable[[], object | None], slots: Callable[[], int] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, slots))
    return registry
