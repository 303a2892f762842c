"""Typed application state (aiohttp ``AppKey``s) shared by the router's handlers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from pearl_sglang.state_store import StateStore
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
    session: aiohttp.ClientSession | None = None
    dispatcher: Dispatcher | None = None
    streams_by_client: dict[str, int] | None = None
    control: "Orchestrator | None" = None
    client_watch: ClientWatch | None = None
    connections: ConnectionGuard | None = None


if TYPE_CHECKING:
    from pearl_sglang.control.orchestrator import Orchestrator

ROUTER = web.AppKey("pearl_router", RouterState)
