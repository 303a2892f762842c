"""Typed application state (aiohttp ``AppKey``s) shared by the router's handlers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from pearl_sglang.clock import Clock
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.staleness import PushLog
from pearl_sglang.router.admission import AdmissionGate
from pearl_sglang.router.client_watch import ClientWatch
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.connections import ConnectionGuard
from pearl_sglang.router.dispatch import Dispatcher
from pearl_sglang.router.health import CircuitBreakers
from pearl_sglang.router.inflight import InFlightRegistry
from pearl_sglang.router.load import LoadModel
from pearl_sglang.router.metrics import RouterMetrics
from pearl_sglang.router.selection import Selector
from pearl_sglang.router.telemetry import TelemetryCollector
from pearl_sglang.router.utilization import Utilization
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import WorkerClient


class ControlView(Protocol):
    """What the data path reads from the control plane, when one runs (attach mode has
    none): the weight-push log that bounds staleness in routing, the fitted profile that
    prices placement (``tracker`` changes identity with each new fit), and its state for
    ``/pearl/state`` and the metrics."""

    pushes: PushLog
    tracker: object

    def profile(self) -> Profile: ...

    def prediction_state(self) -> dict[str, Any]: ...

    def state_report(self) -> dict[str, Any]: ...


@dataclass
class RouterState:
    config: RouterConfig
    store: StateStore
    selector: Selector
    inflight: InFlightRegistry
    loads: LoadModel
    gate: AdmissionGate
    breakers: CircuitBreakers
    metrics: RouterMetrics
    telemetry: TelemetryCollector
    utilization: Utilization
    clock: Clock
    session: aiohttp.ClientSession | None = None
    workers: WorkerClient | None = None  # aborts and engine calls (the router's and the control plane's)
    dispatcher: Dispatcher | None = None
    streams_by_client: dict[str, int] | None = None
    control: ControlView | None = None
    client_watch: ClientWatch | None = None
    connections: ConnectionGuard | None = None

ROUTER = web.AppKey("pearl_router", RouterState)
