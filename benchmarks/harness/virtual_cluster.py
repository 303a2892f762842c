"""Many in-process engines on virtual time, driven synchronously (engine tests, benchmarks).

A ``VirtualCluster`` owns a ``ManualClock``, a ``PDRegistry``, its engines as steppers of
the harness's one virtual-time driver (``vtime.StepperQueue``) and the caller's own timers
(environment steps, trace events, control-plane actions).  ``run`` jumps the clock from
event to event, so hours of cluster time cost only the CPU the model itself needs.  At
one instant the caller's timers run before the engines' events.
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable, Optional

from benchmarks.harness.vtime import StepperQueue
from pearl_sglang.clock import ManualClock
from pearl_sglang.emulator.engine import Engine, EngineConfig
from pearl_sglang.emulator.pd import PDRegistry
from pearl_sglang.emulator.profile import PerformanceModel

_NEVER = float("inf")


class _EngineStepper:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def next_time(self) -> Optional[float]:
        return self.engine.next_event_time()

    def step(self) -> None:
        self.engine.advance()


class VirtualCluster:
    def __init__(self, clock: Optional[ManualClock] = None) -> None:
        self.clock = clock or ManualClock()
        self.registry = PDRegistry()
        self._steppers = StepperQueue()
        self._engine_steppers: list[_EngineStepper] = []
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def add_engine(self, profile: PerformanceModel, config: EngineConfig = EngineConfig(),
                   **kwargs: object) -> Engine:
        engine = Engine(profile=profile, clock=self.clock, config=config,
                        rendezvous=self.registry, **kwargs)
        stepper = _EngineStepper(engine)
        engine.on_wake = lambda: self._steppers.changed(stepper)
        self._steppers.add(stepper)
        self._engine_steppers.append(stepper)
        return engine

    @property
    def engines(self) -> list[Engine]:
        return [s.engine for s in self._engine_steppers]

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (max(t, self.clock.now()), next(self._seq), fn))

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.call_at(self.clock.now() + delay, fn)

    def _at(self, t: float) -> None:
        if t > self.clock.now():
            self.clock.set(t)

    def run(self, until: Optional[float] = None,
            stop: Optional[Callable[[], bool]] = None) -> float:
        """Process events in time order until none is left, ``until`` or ``stop()``."""
        stopped = stop if stop is not None else (lambda: False)
        timers = self._timers
        while not stopped():
            next_timer = timers[0][0] if timers else _NEVER
            # Engine events up to ``until`` itself (``run_due`` stops at the limit).
            limit = next_timer if until is None else min(next_timer, math.nextafter(until, _NEVER))
            # An engine's callback may set a timer before ``limit``: it then runs first.
            if self._steppers.run_due(limit, self._at, lambda: stopped() or (timers and timers[0][0] < limit)):
                continue
            if not timers or (until is not None and next_timer > until):
                break
            t, _, fn = heapq.heappop(timers)
            self._at(t)
            fn()
        if until is not None and until > self.clock.now() and not stopped():
            self.clock.set(until)
            for stepper in self._engine_steppers:
                stepper.engine.advance()
                self._steppers.changed(stepper)
        return self.clock.now()
