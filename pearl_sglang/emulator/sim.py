"""Virtual-time driver for many in-process engines (benchmarks and tests).

A ``VirtualCluster`` owns a ``ManualClock``, a ``PDRegistry`` and a heap of events:
the next event of every engine plus the caller's own timers (environment steps, trace
events, control-plane actions).  ``run`` jumps the clock from event to event, so hours
of cluster time cost only the CPU the model itself needs.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Optional

from ..clock import ManualClock
from .engine import Engine, EngineConfig
from .pd import PDRegistry
from .profile import PerformanceModel


class VirtualCluster:
    def __init__(self, clock: Optional[ManualClock] = None) -> None:
        self.clock = clock or ManualClock()
        self.registry = PDRegistry()
        self.engines: list[Engine] = []
        self._heap: list[tuple[float, int, Optional[Engine], Optional[Callable[[], None]]]] = []
        self._seq = itertools.count()
        self._pushed: dict[int, float] = {}

    def add_engine(self, profile: PerformanceModel, config: EngineConfig = EngineConfig(),
                   **kwargs: object) -> Engine:
        engine = Engine(profile=profile, clock=self.clock, config=config,
                        rendezvous=self.registry, **kwargs)
        engine.on_wake = lambda e=engine: self._schedule(e)
        self.engines.append(engine)
        return engine

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(t, self.clock.now()), next(self._seq), None, fn))

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.call_at(self.clock.now() + delay, fn)

    def _schedule(self, engine: Engine) -> None:
        t = engine.next_event_time()
        if t is None or self._pushed.get(id(engine)) == t:
            return
        self._pushed[id(engine)] = t
        heapq.heappush(self._heap, (t, next(self._seq), engine, None))

    def run(self, until: Optional[float] = None,
            stop: Optional[Callable[[], bool]] = None) -> float:
        """Process events in time order until none is left, ``until`` or ``stop()``."""
        heap = self._heap
        while heap:
            if stop is not None and stop():
                break
            t, _, engine, fn = heap[0]
            if until is not None and t > until:
                break
            heapq.heappop(heap)
            if t > self.clock.now():
                self.clock.set(t)
            if engine is not None:
                if self._pushed.get(id(engine)) != t:
                    continue  # superseded
                del self._pushed[id(engine)]
                engine.advance()
                self._schedule(engine)
            else:
                fn()
        if until is not None and until > self.clock.now() and (stop is None or not stop()):
            self.clock.set(until)
            for e in self.engines:
                e.advance()
                self._schedule(e)
        return self.clock.now()
