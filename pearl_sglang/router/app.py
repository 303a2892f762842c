"""Build the router's aiohttp application (the data path) over a state store.

The application owns one ``ClientSession`` (created and closed by ``cleanup_ctx``), the
dispatcher and the health probe task. A control plane, when the composition root
(``pearl_sglang.server``) adds one, shares the same ``StateStore``: the router reads the
table from it on every request, and reads the rest through ``RouterState.control``.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from pearl_sglang.clock import Clock, LoopClock
from pearl_sglang.core.placement import CostRates
from pearl_sglang.core.straggler_isolation import IsolationConfig
from pearl_sglang.router import admin_routes, block_keys, encoded_ids, inference_routes, prefix_map
from pearl_sglang.router.activity import WorkerActivity
from pearl_sglang.router.admission import AdmissionGate
from pearl_sglang.router.client_watch import ClientWatch
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.connections import ConnectionGuard
from pearl_sglang.router.dispatch import Completed, Dispatcher
from pearl_sglang.router.generate_lane import GenerateLane
from pearl_sglang.router.health import CircuitBreakers, probe_loop
from pearl_sglang.router.inflight import InFlightRegistry
from pearl_sglang.router.load import LoadModel
from pearl_sglang.router.load_probe import load_probe_loop
from pearl_sglang.router.metrics import RouterMetrics
from pearl_sglang.router.middleware import auth_middleware, errors_middleware
from pearl_sglang.router.selection import DEFAULT_RATES, Selector
from pearl_sglang.router.state import ROUTER, RouterState
from pearl_sglang.router.stragglers import borrowed_serving, isolation_for, no_isolation
from pearl_sglang.router.telemetry import TelemetryCollector, TurnObservation, full_sequence_key
from pearl_sglang.router.utilization import Utilization
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import TransportFactory, WorkerClient


@web.middleware
async def _count_requests(request: web.Request, handler) -> web.StreamResponse:
    """Outermost: counts every answer, the error replies built from raised errors too."""
    route = request.match_info.route.resource
    endpoint = route.canonical if route is not None else "unmatched"
    request.app[ROUTER].connections.request_started(request.protocol)
    try:
        resp = await handler(request)
    except asyncio.CancelledError:
        if request.transport is None or request.transport.is_closing():
            # The client hung up (the handler was cancelled for it): nginx's "client closed".
            request.app[ROUTER].metrics.requests.labels(endpoint, "499").inc()
        raise
    except web.HTTPException as e:
        request.app[ROUTER].metrics.requests.labels(endpoint, str(e.status)).inc()
        raise
    request.app[ROUTER].metrics.requests.labels(endpoint, str(resp.status)).inc()
    return resp


def _record_completion(st: RouterState, rates: "_ProfileRates"):
    def on_complete(done: Completed) -> None:
        meta = done.final["meta_info"]
        rates.observe_generated(meta.get("completion_tokens") or 0)
        st.metrics.tokens.labels("prompt").inc(meta.get("prompt_tokens") or 0)
        st.metrics.tokens.labels("cached").inc(meta.get("cached_tokens") or 0)
        st.metrics.tokens.labels("completion").inc(meta.get("completion_tokens") or 0)
        if done.target is not None:
            # Prefill and cache hits on the prefix holder, generation on the generating worker.
            holder, main = done.target.prefix_holder.slot, done.target.main.slot
            prompt, cached = meta.get("prompt_tokens") or 0, meta.get("cached_tokens") or 0
            generated = meta.get("completion_tokens") or 0
            if holder == main:
                st.utilization.completed(main, prompt_tokens=prompt, cached_tokens=cached,
                                         generated_tokens=generated)
            else:
                st.utilization.completed(holder, prompt_tokens=prompt, cached_tokens=cached, generated_tokens=0)
                st.utilization.completed(main, prompt_tokens=0, cached_tokens=0, generated_tokens=generated)
        for slot in done.target.slots if done.target else ():
            st.breakers.success(slot)
            st.metrics.routed.labels(str(slot), st.store.table.worker(slot).role.value
                                     if st.store.table.has(slot) else "gone").inc()
        if done.attempts > 1:
            st.metrics.migrations.inc(done.attempts - 1)
        full_key = full_sequence_key(done.prompt_ids, done.final["output_ids"], done.key)
        if done.target is not None:
            # Its KV stays where it generated and its next turn is coming: work owed there.
            ref = done.trajectory if done.trajectory is not None else (full_key[-1] if full_key else None)
            st.loads.turn_ended(ref, done.target.main.slot, done.ended)
        st.telemetry.observe(TurnObservation(
            trajectory=done.trajectory, turn=done.turn, key=done.key,
            full_key=full_key,
            prompt_tokens=meta.get("prompt_tokens") or 0, cached_tokens=meta.get("cached_tokens") or 0,
            generated_tokens=meta.get("completion_tokens") or 0, arrived_at=done.started,
            first_chunk_at=done.first_chunk_at, finished_at=done.ended, first_chunk_tokens=done.first_chunk_tokens,
            queued_prefill_tokens=done.queued_prefill_tokens, decode_window=done.decode_window))
    return on_complete


def _on_failure(st: RouterState):
    def on_failure(slot: int) -> None:
        st.breakers.failure(slot)
        st.metrics.worker_failures.labels(str(slot)).inc()
    return on_failure


def _on_stall(st: RouterState):
    def on_stall(slot: int) -> None:
        st.breakers.trip(slot)
        st.metrics.worker_failures.labels(str(slot)).inc()
    return on_stall


class _ProfileRates:
    """The cost policy's rates from the control plane's current profile (fitted by
    telemetry), so placement and the decision engine use the same numbers. Without a
    control plane (attach mode): the preset's hardware costs, with ``r`` (tokens a turn
    generates) measured here as a moving average of finished items, so the decode side
    is weighed with this workload's turns, not the preset's."""

    ALPHA = 0.05

    def __init__(self, st: RouterState) -> None:
        self.st = st
        self._tracker = None
        self._rates = DEFAULT_RATES
        self._attached = DEFAULT_RATES
        self._mean_generated: float | None = None

    def observe_generated(self, tokens: int) -> None:
        m = self._mean_generated
        self._mean_generated = float(tokens) if m is None else m + self.ALPHA * (tokens - m)
        self._attached = replace(DEFAULT_RATES, r=max(1.0, self._mean_generated))

    def __call__(self) -> CostRates:
        control = self.st.control
        if control is None:
            return self._attached
        if control.tracker is not self._tracker:  # a new fit (immutable tracker: a new object)
            self._tracker, self._rates = control.tracker, CostRates.from_profile(control.profile())
        return self._rates


def build_router(config: RouterConfig, store: StateStore, *, access: Callable[[web.Request], str],
                 transport_factory: TransportFactory = WorkerClient, default_routing: str | None = None,
                 wait_for_workers: bool = False, clock: Clock | None = None) -> web.Application:
    """``access`` classes each request for the auth middleware (public, inference or admin);
    ``default_routing``: the cluster's routing policy, unless the router's flag names one;
    ``wait_for_workers``: requests wait for a first worker (a launched cluster is starting)
    rather than fail at once. ``clock``: the event loop's unless given."""
    config.validate()
    routing = config.routing_policy or default_routing or "cost"
    clock = clock or LoopClock()
    utilization = Utilization(clock=clock.now)
    activity = WorkerActivity(clock.now)
    inflight = InFlightRegistry(on_count=utilization.occupancy)
    st = RouterState(
        config=config, store=store,
        selector=Selector(pushes=lambda: st.control.pushes if st.control else None, routing=routing,
                          rates=lambda: rates()),
        inflight=inflight, loads=LoadModel(inflight, report_ttl_s=max(5.0, 3 * config.load_poll_interval_s)),
        gate=AdmissionGate(max_waiting=config.admission_max_waiting, wait_timeout_s=config.admission_wait_s),
        breakers=CircuitBreakers(failures_to_open=config.failures_to_open, cooldown_s=config.breaker_cooldown_s,
                                 clock=clock),
        metrics=RouterMetrics(lambda: store.table, utilization.current_totals,
                              lambda: st.control.prediction_state() if st.control is not None else None),
        telemetry=TelemetryCollector(), utilization=utilization, clock=clock, streams_by_client={},
        connections=ConnectionGuard(config.connections))
    app = web.Application(
        client_max_size=config.limits.max_body_bytes,
        middlewares=[_count_requests, errors_middleware,
                     auth_middleware(admin_token=config.security.admin_token,
                                     api_key=config.security.api_key, access=access)])
    app[ROUTER] = st
    rates = _ProfileRates(st)
    if config.generate_lane:
        lane = GenerateLane(st)
        st.connections.lane = lane

        async def stop_lane(app: web.Application) -> None:
            await lane.shutdown()

        app.on_shutdown.append(stop_lane)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        block_keys.warm()
        encoded_ids.warm()
        prefix_map.warm()
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        st.session = aiohttp.ClientSession(connector=connector)
        st.workers = WorkerClient(st.session, config.timeouts)
        st.dispatcher = Dispatcher(
            transport=transport_factory(st.session, config.timeouts), store=store, selector=st.selector,
            inflight=st.inflight, gate=st.gate, config=config.dispatch, unavailable=st.breakers.open_slots,
            on_worker_failure=_on_failure(st), on_worker_stalled=_on_stall(st),
            on_complete=_record_completion(st, rates), loads=st.loads, activity=activity,
            wait_for_workers=wait_for_workers,
            on_turn_start=st.telemetry.turn_began, on_turn_end=st.telemetry.turn_left,
            isolation=(isolation_for(st.telemetry, share=config.straggler_share,
                                     config=IsolationConfig(tail_share=config.straggler_tail_share,
                                                           weight=config.straggler_isolation_weight,
                                                           home_margin=config.straggler_home_margin),
                                     when=(borrowed_serving(lambda: store.table)
                                           if config.straggler_isolation_scope == "borrowed" else None))
                       if config.straggler_isolation else no_isolation))
        probe = asyncio.ensure_future(probe_loop(st.session, store, st.breakers, config.health_interval_s,
                                                 timeout_s=min(20.0, config.timeouts.chunk_s), clock=clock))
        load_probe = (asyncio.ensure_future(load_probe_loop(st.session, store, st.loads, config.load_poll_interval_s))
                      if config.load_poll_interval_s > 0 else None)
        st.client_watch = ClientWatch(config.client_check_s)
        watch = asyncio.ensure_future(st.client_watch.run())
        yield
        for task in (probe, load_probe, watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await st.dispatcher.transport.close()
        await st.workers.close()
        await st.session.close()

    app.cleanup_ctx.append(session_ctx)
    r = app.router
    r.add_post("/generate", inference_routes.generate)
    r.add_put("/generate", inference_routes.generate)
    r.add_post("/v1/completions", inference_routes.openai_proxy)
    r.add_post("/v1/chat/completions", inference_routes.openai_proxy)
    r.add_post("/abort_request", inference_routes.abort_request)
    r.add_get("/v1/models", admin_routes.models)
    for prefix in ("/", "/get_"):  # SGLang answers both spellings
        r.add_get(prefix + "model_info", admin_routes.model_info)
        r.add_get(prefix + "server_info", admin_routes.server_info)
    r.add_get("/health_generate", admin_routes.health_generate)
    r.add_get("/health", admin_routes.health)
    r.add_get("/liveness", admin_routes.health)
    r.add_get("/readiness", admin_routes.readiness)
    r.add_get("/metrics", admin_routes.metrics)
    r.add_post("/flush_cache", admin_routes.flush_cache)
    r.add_get("/pearl/state", admin_routes.pearl_state)
    return app
