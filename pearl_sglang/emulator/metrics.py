"""``/metrics`` in SGLang's Prometheus names (``sglang:*``), read from the engine at scrape."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from .worker import Worker


class _EngineCollector:
    def __init__(self, worker: "Worker") -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        e, labels = w.engine, ["model_name", "engine_type"]
        values = [w.served_model_name, e.role.value if e.role.value != "null" else "unified"]
        s, st = e.loads(), e.stats

        def gauge(name: str, doc: str, v: float) -> Metric:
            m = GaugeMetricFamily(f"sglang:{name}", doc, labels=labels)
            m.add_metric(values, v)
            return m

        def counter(name: str, doc: str, v: float) -> Metric:
            m = CounterMetricFamily(f"sglang:{name}", doc, labels=labels)
            m.add_metric(values, v)
            return m
        yield gauge("num_running_reqs", "The number of running requests.", s.num_running_reqs)
        yield gauge("num_queue_reqs", "The number of requests in the waiting queue.", s.num_waiting_reqs)
        yield gauge("num_used_tokens", "The number of used tokens.", s.num_used_tokens)
        yield gauge("max_total_num_tokens", "Maximum total number of tokens.", s.num_total_tokens)
        yield gauge("token_usage", "The token usage.", s.token_usage)
        yield gauge("gen_throughput", "The generation throughput (token/s).", s.gen_throughput)
        yield gauge("cache_hit_rate", "The prefix cache hit rate.", s.cache_hit_rate)
        yield gauge("num_prefill_bootstrap_queue_reqs", "PD prefill bootstrap queue.",
                    s.prefill_bootstrap_queue_reqs)
        yield gauge("num_prefill_inflight_queue_reqs", "PD prefill in-flight queue.",
                    s.prefill_inflight_queue_reqs)
        yield gauge("num_decode_prealloc_queue_reqs", "PD decode prealloc queue.",
                    s.decode_prealloc_queue_reqs)
        yield gauge("num_decode_transfer_queue_reqs", "PD decode transfer queue.",
                    s.decode_transfer_queue_reqs)
        yield counter("prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        yield counter("generation_tokens", "Number of generation tokens processed.", st.generation_tokens)
        yield counter("cached_tokens", "Number of cached prompt tokens.", st.cached_tokens)
        yield counter("num_requests", "Number of requests processed.", st.requests)
        yield counter("num_aborted_requests", "Number of requests aborted.", st.aborted)
        yield counter("num_retracted_reqs", "Number of retractions.", s.retracted_reqs)
        yield counter("kv_transfer_bytes", "Bytes of KV sent by this prefill.", st.kv_bytes)


def render_metrics(worker: "Worker") -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(worker))
    return generate_latest(registry)
