"""``python -m pearl_sglang.router``: PEARL's router in front of SGLang workers.

Launched workers (PEARL starts, reshapes and stops them; see docs/admin-api.md)::

    python -m pearl_sglang.router --policy pearl --config cluster.yaml

Attach mode (pre-launched workers, routing only), like sglang-router::

    python -m pearl_sglang.router --worker-urls http://w1:30000 http://w2:30000
    python -m pearl_sglang.router --prefill http://p1:30000 8998 --decode http://d1:30001
    python -m pearl_sglang.router      # none yet: engines register through POST /workers

``--policy static`` keeps a launched cluster colocated and never borrows training GPUs
(the fixed-deployment baseline); ``--policy pearl`` lets the decision engine and the
borrowing gate act.

The admin token is read from the environment (``PEARL_ADMIN_TOKEN`` by default), never
from the command line, so it does not show in process lists.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import signal
import sys

from aiohttp import web

from pearl_sglang.control.attach import attached_table
from pearl_sglang.control.cluster_config import ClusterConfig, apply_policy
from pearl_sglang.control.persistence import StateDirInUse, StateFile
from pearl_sglang.control.processes import free_port
from pearl_sglang.core.state import StateTable
from pearl_sglang.router.config import RouterConfig
from pearl_sglang.router.connections import CannotListen, raise_descriptor_limit, start_site
from pearl_sglang.router.state import ROUTER
from pearl_sglang.router.stall import stall_bound_s
from pearl_sglang.server.compose import build_app
from pearl_sglang.server.stopping import stop_serving
from pearl_sglang.state_store import StateStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pearl_sglang.router", description=__doc__.splitlines()[0])
    RouterConfig.add_cli_args(parser)
    parser.add_argument("--config", help="cluster configuration (YAML or JSON) for launched workers")
    parser.add_argument("--state-dir", help="crash-safe control record: a restarted router reconciles from it "
                                            "(overrides the config's state_dir)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = RouterConfig.from_cli_args(args)
        config.validate()
        a = config.attached
        cluster, state_file = None, None
        if args.config:
            if a.regular or a.prefill:
                raise ValueError("give either --config or attached workers, not both")
            cluster = apply_policy(ClusterConfig.load(args.config), config.policy)
            if cluster.launcher.kind == "local":
                free_port(cluster.launcher.host)  # the host workers start on resolves and is this machine's
            if args.state_dir:
                cluster = dataclasses.replace(cluster, state_dir=args.state_dir)
            if args.stall_s is None:
                bound = stall_bound_s(cluster.profile, config.dispatch.internal_stream_interval,
                                      time_scale=cluster.time_scale)
                config = dataclasses.replace(config, timeouts=dataclasses.replace(config.timeouts, chunk_s=bound))
            table = StateTable.create(tp_size=cluster.engine.tp_size, dedicated_gpus=cluster.zones.dedicated,
                                      overlap_gpus=cluster.zones.overlap)
            if cluster.state_dir:
                state_file = StateFile(cluster.state_dir)  # held until the process ends
                state_file.load()  # an unreadable record stops the start here, with its reason
        else:
            # Attach mode; with no workers given, engines register through the worker API
            # (POST /workers), as RL frameworks do with sglang-router.
            table = attached_table(regular=a.regular, prefill=a.prefill, decode=a.decode, tp_size=config.tp_size)
    except (ValueError, OSError, StateDirInUse) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    raise_descriptor_limit()
    app = build_app(config, StateStore(table), cluster, state_file=state_file)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        try:
            runner.run(_serve(app, config.host, config.port))
        except CannotListen as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


def _loop_factory():
    """uvloop (a dependency of SGLang) where it is installed: the router's work per
    request is mostly socket I/O and callbacks, which it runs in C."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# Python's collector, as configured by default, runs a young collection every 700 net
# allocations and now and then walks every object the process holds; the router starts
# with ~110,000 long-lived ones (aiohttp, numpy, numba, prometheus_client) and allocates
# hundreds per request, nearly all freed by reference counting. Measured on tiny requests
# (~20,000): 0.64-0.97 CPU-s in the collector, 6-10% of the router's CPU; with the
# start-up objects frozen and these thresholds, 0.04 s (7 young collections; a young
# threshold of 50,000 measured the same, so the smaller one is kept).
GC_THRESHOLDS = (20_000, 10, 10)
# Once the grace is over and what ran is aborted, handlers have this long to answer.
CLOSE_S = 5.0


def settle_heap() -> None:
    """Once the router is up: keep the collector off what start-up built (it lives as long
    as the process) and collect young objects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _serve(app: web.Application, host: str, port: int) -> None:
    """Like ``web.run_app``, through the connection guard; SIGINT/SIGTERM stop it cleanly."""
    runner, _ = await start_site(app, app[ROUTER].connections, host, port, close_s=CLOSE_S)
    settle_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await stop_serving(runner, app[ROUTER].config.connections.shutdown_grace_s)

