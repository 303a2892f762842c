"""Prometheus series of the router, in a registry per application (no global state).

Worker-state series are computed at scrape time from the state table, so they can never
disagree with it.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pearl_sglang.core.state import StateTable
from pearl_sglang.router.utilization import WorkerUsage

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Memo:
    """``labels()`` that looks each child up once: prometheus_client checks the values and
    takes a lock on every call, and the router's hot path labels its series with the same
    few values on every request. Series are never removed, so a child stays valid."""

    def labels(self, *values: str):
        memo = self.__dict__.setdefault("_memo", {})
        child = memo.get(values)
        if child is None:
            child = memo[values] = super().labels(*values)  # type: ignore[misc]
        return child


class _Counter(_Memo, Counter):
    pass


class _Histogram(_Memo, Histogram):
    pass


class _TableCollector(Collector):
    def __init__(self, table: Callable[[], StateTable]) -> None:
        self._table = table

    def collect(self) -> Iterable[GaugeMetricFamily]:
        table = self._table()
        workers = GaugeMetricFamily("pearl_workers", "Rollout workers by role, activity and zone",
                                    labels=["role", "activity", "zone"])
        counts: dict[tuple[str, str, str], int] = {}
        for w in table.rollout_workers():
            key = (w.role.value, w.activity.value, w.zone.value)
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            workers.add_metric(list(key), n)
        yield workers
        yield GaugeMetricFamily("pearl_state_revision", "Updates applied to the state table",
                                value=table.revision)
        yield GaugeMetricFamily("pearl_training_owns_overlap", "1 while training owns the overlap GPUs",
                                value=1 if table.training_owns_overlap else 0)


class _UtilizationCollector(Collector):
    """Per-worker utilization (labels: slot and role only, both bounded by the table)."""

    SERIES = (("busy_s", "pearl_worker_busy_seconds", "Seconds with at least one request in flight"),
              ("prefill_tokens", "pearl_worker_prefill_tokens", "Prompt tokens computed (cache misses)"),
              ("generated_tokens", "pearl_worker_generated_tokens", "Tokens generated"),
              ("cached_tokens", "pearl_worker_cached_tokens", "Prompt tokens served from the prefix cache"),
              ("requests", "pearl_worker_requests", "Generate items finished"))

    def __init__(self, table: Callable[[], StateTable], usage: Callable[[], Mapping[int, WorkerUsage]]) -> None:
        self._table, self._usage = table, usage

    def collect(self) -> Iterable[CounterMetricFamily]:
        table, usage = self._table(), self._usage()
        for attr, name, doc in self.SERIES:
            family = CounterMetricFamily(name, doc, labels=["slot", "role"])
            for slot, u in sorted(usage.items()):
                role = table.worker(slot).role.value if table.has(slot) else "gone"
                family.add_metric([str(slot), role], getattr(u, attr))
            yield family


class _GateCollector(Collector):
    """The borrowing gate's learned cost and bias, and the last step's predicted and
    observed duration (from the control plane's state; nothing without one)."""

    def __init__(self, control: Callable[[], Mapping | None]) -> None:
        self._control = control

    def collect(self) -> Iterable[GaugeMetricFamily]:
        state = self._control()
        if not state:
            return
        gate = state.get("gate") or {}
        yield GaugeMetricFamily("pearl_gate_toggle_cost_seconds", "Learned toggle cost of borrowing",
                                value=gate.get("toggle_cost_s", 0.0))
        yield GaugeMetricFamily("pearl_gate_model_bias_seconds",
                                "Learned observed-minus-predicted step time without borrowing",
                                value=gate.get("bias_s", 0.0))
        yield GaugeMetricFamily("pearl_gate_explored_steps", "Steps the gate ran unborrowed to learn",
                                value=gate.get("explored", 0))
        usage = gate.get("pool_usage") or {}
        shares = [(zone, usage.get(f"{zone}_busy_share")) for zone in ("dedicated", "borrowed")]
        if any(share is not None for _, share in shares):
            family = GaugeMetricFamily("pearl_gate_busy_share",
                                       "Last rollout step: share of the time a dedicated (median) or "
                                       "borrowed (mean) worker had a request in flight; the gate reads it",
                                       labels=["zone"])
            for zone, share in shares:
                if share is not None:
                    family.add_metric([zone], share)
            yield family
        by_mode = (state.get("mode_correction") or {}).get("by_mode") or {}
        if by_mode:
            ratio = GaugeMetricFamily("pearl_mode_observed_over_predicted",
                                      "Learned observed/predicted step time per PD mode (decisions scale by it)",
                                      labels=["mode"])
            for mode, entry in sorted(by_mode.items()):
                ratio.add_metric([mode], entry["factor"])
            yield ratio
        steps = state.get("step_predictions") or []
        if steps:
            last = steps[-1]
            step = GaugeMetricFamily("pearl_step_seconds", "Last finished step: predicted and observed duration",
                                     labels=["kind"])
            step.add_metric(["predicted"], last["predicted_s"])
            step.add_metric(["observed"], last["observed_s"])
            yield step


class RouterMetrics:
    def __init__(self, table: Callable[[], StateTable],
                 usage: Callable[[], Mapping[int, WorkerUsage]] = dict,
                 control: Callable[[], Mapping | None] = lambda: None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = _Counter("pearl_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.latency = _Histogram("pearl_request_duration_seconds", "Time to the full answer", ["endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = _Counter("pearl_tokens", "Tokens of finished generate items", ["kind"], registry=r)
        self.routed = _Counter("pearl_routed", "Attempts sent to a worker", ["slot", "role"], registry=r)
        self.migrations = Counter("pearl_migrations", "Items resubmitted elsewhere with their partial output",
                                  registry=r)
        self.worker_failures = Counter("pearl_worker_failures", "Failed calls to a worker", ["slot"], registry=r)
        self.inflight = Gauge("pearl_inflight_requests", "Generate items in flight", registry=r)
        self.admission_waiting = Gauge("pearl_admission_waiting", "Requests held by the admission gate",
                                       registry=r)
        self.decisions = Counter("pearl_decisions", "Decisions of the PD decision engine", ["mode", "switch"],
                                 registry=r)
        self.reconfig_seconds = Histogram("pearl_reconfiguration_phase_seconds",
                                          "Duration of reconfiguration phases", ["operation", "phase"],
                                          buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_TableCollector(table))
        r.register(_UtilizationCollector(table, usage))
        r.register(_GateCollector(control))
