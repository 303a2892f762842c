"""The HTTP shell: an aiohttp app that drives one ``Engine`` in scaled real time.

``ScaledClock`` maps real time to emulated time (``--time-scale`` emulated seconds per
real second) and ``RealtimeDriver`` sleeps until the engine's next event.  Handlers
translate JSON into engine calls and wait on per-request events; nothing here decides
timing.  A PD instance that may act as prefill also serves the bootstrap port.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator, Optional

import aiohttp
from aiohttp import web

from .codec import ModelMeta, TextCodec
from .config import EmulatorArgs
from . import http_control, http_generate, prefix_cache, stretch_draws
from .engine import Engine
from .http_bootstrap import HttpRendezvous, create_bootstrap_app
from .pd import Rendezvous
from .profile import PerformanceModel, load_profile
from .request import DisaggregationMode
from .worker import WORKER, ScaledClock, Worker


_WAKE_SLACK_S = 1e-6


class RealtimeDriver:
    """Advances the engine at its event times, in real time."""

    def __init__(self, engine: Engine, clock: ScaledClock) -> None:
        self.engine, self.clock = engine, clock
        self._wake = asyncio.Event()
        engine.on_wake = self._wake.set

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        if hasattr(loop, "add_stepper"):  # a discrete-event loop runs the engine itself
            stepper = _EngineStepper(self.engine, self.clock)
            loop.add_stepper(stepper)
            self.engine.on_wake = lambda: loop.stepper_changed(stepper)
            try:
                await loop.create_future()
            finally:
                loop.remove_stepper(stepper)
                self.engine.on_wake = self._wake.set
        engine, wake = self.engine, self._wake
        while True:
            engine.advance()
            t = engine.next_event_time()
            wake.clear()
            if t is None:
                await wake.wait()
                continue
            delay = self.clock.real_delay(t - self.clock.now())
            if delay <= 0:
                await asyncio.sleep(0)
                continue
            # Wake a hair late: on a virtual-time loop the clock lands exactly on the timer,
            # and float rounding of (loop time - start) could leave the engine a few ulps
            # short of its event, spinning forever. Events are processed at their own model
            # time, so lateness never changes results.  (A timer that sets the event, not
            # ``wait_for``: on Python 3.11 ``wait_for`` swallows a cancellation that comes
            # with a wake-up, and the app's cleanup then waits for this task forever.)
            timer = loop.call_later(delay + _WAKE_SLACK_S, wake.set)
            try:
                await wake.wait()
            finally:
                timer.cancel()


class _EngineStepper:
    """The engine as a stepper of a virtual-time loop (``benchmarks.harness.vtime``): the
    loop asks when its next event is due and runs it then, between its own timers.  The
    engine's ``on_wake`` (every outside call) tells the loop to ask again."""

    def __init__(self, engine: Engine, clock: ScaledClock) -> None:
        self.engine, self.clock = engine, clock
        self._due: Optional[float] = None

    def next_time(self) -> Optional[float]:
        self._due = self.engine.next_event_time()
        return None if self._due is None else self.clock.source_time(self._due)

    def step(self) -> None:
        self.engine.advance(until=self._due)


def build_worker(args: EmulatorArgs, *, profile: Optional[PerformanceModel] = None,
                 rendezvous: Optional[Rendezvous] = None) -> Worker:
    """``rendezvous``: how a decode reaches its prefill; by default over the prefill's
    bootstrap server (HTTP), as across processes. The engine's compiled kernels are loaded
    here, before the worker serves (once per process; ~0.16 s from numba's disk cache, a
    compile on a machine's first start): otherwise its first requests wait for them."""
    prefix_cache.warm()
    stretch_draws.warm()
    profile = profile or load_profile(args.profile)
    meta = ModelMeta.load(args.model_path)
    codec = TextCodec(args.tokenizer_path or args.model_path)
    vocab = meta.vocab_size or profile.vocab_size
    if codec.uses_tokenizer:
        vocab = min(vocab, codec.vocab_size)
    eos = meta.eos_token_id
    if eos is None and codec.token_id("<|im_end|>") is not None:
        eos = codec.token_id("<|im_end|>")
    if eos is None and not codec.uses_tokenizer:
        eos = 258
    clock = ScaledClock(args.time_scale)
    config = args.engine_config(vocab_size=vocab, eos_token_id=eos, special_ids=codec.special_ids,
                                context_length=meta.context_length,
                                token_low=0 if codec.uses_tokenizer else 259,
                                virtual_time=_on_virtual_time())
    engine = Engine(profile=profile, clock=clock, config=config, rendezvous=rendezvous or HttpRendezvous(),
                    stop_text=lambda ids: codec.decode(ids))
    return Worker(args=args, profile=profile, engine=engine, codec=codec, meta=meta,
                  clock=clock, started_wall=time.time())


def _on_virtual_time() -> bool:
    """Whether the worker is built on a discrete-event loop (``benchmarks.harness.vtime``)."""
    try:
        return hasattr(asyncio.get_running_loop(), "add_stepper")
    except RuntimeError:
        return False


def serves_bootstrap(args: EmulatorArgs) -> bool:
    return args.role == DisaggregationMode.PREFILL or (
        args.role != DisaggregationMode.NULL and args.enable_pd_role_switch)


def create_app(worker: Worker) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[WORKER] = worker

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        worker.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        rv = worker.engine.rendezvous
        if isinstance(rv, HttpRendezvous):
            rv.session = worker.session
        driver = RealtimeDriver(worker.engine, worker.clock)
        task = asyncio.create_task(driver.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if isinstance(rv, HttpRendezvous):
            await rv.close()
        await worker.session.close()

    app.cleanup_ctx.append(lifecycle)
    http_generate.add_routes(app)
    http_control.add_routes(app)
    return app


# Bursts of hundreds of connections must queue, not be reset.
BACKLOG = 4096


async def start(worker: Worker, *, host: str, port: int,
                bootstrap_port: Optional[int] = None) -> tuple[web.AppRunner, list[web.AppRunner], int, Optional[int]]:
    """Start the API (and bootstrap) servers; returns runners and the bound ports."""
    runner = web.AppRunner(create_app(worker), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=BACKLOG)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    extra: list[web.AppRunner] = []
    bport = None
    if serves_bootstrap(worker.args):
        b = web.AppRunner(create_bootstrap_app(worker.engine, worker.clock), handler_cancellation=True,
                          access_log=None)
        await b.setup()
        await web.TCPSite(b, host, worker.args.disaggregation_bootstrap_port
                          if bootstrap_port is None else bootstrap_port, backlog=BACKLOG).start()
        bport = b.addresses[0][1]
        extra.append(b)
    return runner, extra, bound, bport
