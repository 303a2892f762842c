"""Build PEARL's aiohttp application: the router, and the control plane when a cluster is
given (launched workers), joined through their ports.

The control plane is built once the router's ``ClientSession`` exists (a ``cleanup_ctx``),
and bootstraps the cluster in the background while the router already serves.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.control.executor import PlanExecutor
from pearl_sglang.control.launchers import Launcher, LocalLauncher
from pearl_sglang.control.orchestrator import Orchestrator
from pearl_sglang.control.persistence import StateFile
from pearl_sglang.control.phases import PhaseLog
from pearl_sglang.control.registration import Registrar
from pearl_sglang.router.app import build_router
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.data_plane import RouterDataPlane
from pearl_sglang.router.middleware import ADMIN, INFERENCE, PUBLIC
from pearl_sglang.router.state import ROUTER, RouterState
from pearl_sglang.server import engine_control_routes, worker_api
from pearl_sglang.server.control_routes import CONTROL, add_control_routes
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import TransportFactory, WorkerClient

log = logging.getLogger("pearl.control")

LauncherFactory = Callable[[ClusterConfig, aiohttp.ClientSession], Launcher]
PUBLIC_PATHS = frozenset({"/health", "/readiness", "/liveness", "/metrics"})
ADMIN_PREFIXES = ("/pearl/", "/flush_cache", "/train_begin", "/train_finished", "/update_weights")


def access_class(request: web.Request) -> str:
    path = request.path
    if path in PUBLIC_PATHS:
        return PUBLIC
    if path in engine_control_routes.PATHS:
        # Open as on an SGLang server unless an admin token is set (AReaL sends none).
        return ADMIN if request.app[ROUTER].config.security.admin_token else INFERENCE
    if path.startswith(ADMIN_PREFIXES):
        return ADMIN
    if path.startswith(worker_api.PATHS) and request.app[ROUTER].config.security.admin_token:
        return ADMIN  # without an admin token, open like sglang-router's (API key if set)
    return INFERENCE


def _log_failed_start(boot: asyncio.Future) -> None:
    if not boot.cancelled() and boot.exception() is not None:
        log.error("the control plane did not start: no worker will be launched", exc_info=boot.exception())


def _control_ctx(st: RouterState, cluster: ClusterConfig, launcher_factory: LauncherFactory,
                 given_state_file: StateFile | None):
    """Build the control plane once the application's session exists; bootstrap the
    cluster in the background (the router serves while workers start)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        launcher = launcher_factory(cluster, st.session)
        phases = PhaseLog(on_record=lambda r: st.metrics.reconfig_seconds.labels(r.operation, r.phase)
                          .observe(r.seconds))
        executor = PlanExecutor(store=st.store, data_plane=RouterDataPlane(st), launcher=launcher,
                                ops=st.workers, phases=phases, deadlines=cluster.deadlines,
                                snapshot=lambda: control.snapshot,
                                launch_version=cluster.engine.weight_version,
                                weights_cpu_backup=cluster.engine.weights_cpu_backup)
        state_file = given_state_file or (StateFile(cluster.state_dir) if cluster.state_dir else None)
        control = Orchestrator(config=cluster, executor=executor, state_file=state_file,
                               on_decision=lambda d: st.metrics.decisions
                               .labels(d.get("choice", {}).get("mode", "none"), str(d.get("switch"))).inc())
        app[CONTROL].orchestrator = st.control = control  # the admin routes' and the data path's view
        boot = asyncio.ensure_future(control.start())
        boot.add_done_callback(_log_failed_start)
        yield
        boot.cancel()
        (outcome,) = await asyncio.gather(boot, return_exceptions=True)
        await control.shutdown()
        stop_all = getattr(launcher, "stop_all", None)
        if stop_all is not None:
            await stop_all()
            if state_file is not None and not isinstance(outcome, Exception):
                state_file.path.unlink(missing_ok=True)  # an orderly stop leaves nothing to recover
        if state_file is not None:
            state_file.close()

    return ctx


def _registrar(app: web.Application) -> Registrar:
    """Registered workers sync to the control plane's latest snapshot (none in attach
    mode) and drain through the dispatcher's migration."""
    st, control = app[ROUTER], app[CONTROL]
    return Registrar(store=st.store, ops=st.workers,
                     snapshot=lambda: control.orchestrator.snapshot if control.orchestrator is not None else None,
                     drain=RouterDataPlane(st).drain, config=st.config.registration)


def local_launcher(cluster: ClusterConfig, session: aiohttp.ClientSession) -> Launcher:
    """Processes on this host, or Ray actors; with a state dir, workers outlive a crashed
    router so that the restarted one can adopt them."""
    if cluster.launcher.kind == "ray":
        from pearl_sglang.control.ray_launcher import RayLauncher

        return RayLauncher(cluster.engine, cluster.launcher, session)
    return LocalLauncher(cluster.engine, cluster.launcher, session, outlive=cluster.state_dir is not None)


def build_app(config: RouterConfig, store: StateStore, cluster: ClusterConfig | None = None,
              launcher_factory: LauncherFactory = local_launcher,
              transport_factory: TransportFactory = WorkerClient,
              state_file: StateFile | None = None) -> web.Application:
    """``state_file``: the crash-safe record, already locked by the caller (the CLI takes the
    lock before serving so that a second router on the same directory fails at once);
    without it, one is opened from ``cluster.state_dir``."""
    app = build_router(config, store, access=access_class, transport_factory=transport_factory,
                       default_routing=cluster.routing_policy if cluster is not None else None,
                       wait_for_workers=cluster is not None)
    st = app[ROUTER]
    if cluster is not None:
        app.cleanup_ctx.append(_control_ctx(st, cluster, launcher_factory, state_file))
    app.cleanup_ctx.append(worker_api.worker_api_ctx(_registrar))
    add_control_routes(app)
    engine_control_routes.add_engine_control_routes(app)
    worker_api.add_worker_routes(app)
    return app
