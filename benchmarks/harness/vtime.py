"""A virtual-time asyncio event loop: timers fire in order, but waiting costs nothing.

``VirtualTimeLoop`` is a ``SelectorEventLoop`` whose ``time()`` is a virtual clock.  Its
selector first polls real I/O without blocking; when nothing is readable or writable and
the loop has no ready callbacks (asyncio only asks the selector to wait when its ready
queue is empty), the clock jumps to the earliest scheduled timer instead of sleeping.
So ``asyncio.sleep(3600)`` returns at once with ``loop.time()`` one hour later, while
sockets (loopback HTTP between in-process servers) still work: their traffic is real but
takes no virtual time.

Ordering rules that keep the simulation causal:

* the clock only moves when two consecutive non-blocking polls found no I/O event and
  the loop had no ready handle, so bytes already written to a loopback socket are read
  before any later timer fires;
* while a job submitted through ``run_in_executor`` (``asyncio.to_thread``, DNS
  look-ups) is running, the clock stands still and the loop waits for it in real time:
  thread work takes no virtual time and cannot be overtaken by timers;
* with nothing scheduled at all the loop blocks on real I/O, as a normal loop would.

Discrete-event components (the emulator's engines) can register as *steppers*
(``loop.add_stepper``): an object with ``next_time()`` (the loop time of its next internal
event, or None) and ``step()`` (process the events due at the loop's time).  The loop keeps
each stepper's next time until it steps or says otherwise: a stepper whose next time moves
for any other reason (a request arrived) must call ``loop.stepper_changed(stepper)``.  When the loop
would jump, it first runs the steppers' events that come before the earliest timer, in
time order, straight from the selector, and returns to asyncio as soon as one of them made
a callback ready (a request finished, a stream chunk is due).  Events nobody waits for,
such as most decode iterations, then cost no trip through the event loop; the result is
the same as waking at every event, because nothing else can happen between two of them.

Caveats: CPU time is free (a callback that computes for a real second takes no virtual
time), so only code that *waits* through the loop is timed; anything that reads the
wall clock (``time.monotonic()``, ``time.time()``) or blocks the thread
(``time.sleep``) does not follow the virtual clock.  Everything in one process must run
on this loop: another thread's loop keeps real time.
"""
from __future__ import annotations

import asyncio
import selectors
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, Optional, Protocol, TypeVar

T = TypeVar("T")

_NEVER = float("inf")

# While an executor job runs, wait for it in slices of this many real seconds.
_EXECUTOR_POLL_S = 0.05


@dataclass
class LoopStats:
    polls: int = 0            # non-blocking I/O polls
    io_batches: int = 0       # polls that returned events
    jumps: int = 0            # times the clock jumped to the next timer
    jumped_s: float = 0.0     # virtual seconds skipped by jumps
    executor_waits: int = 0   # real waits for executor jobs
    blocking_waits: int = 0   # real blocking selects (nothing scheduled)
    steps: int = 0            # stepper events run between timers


class Stepper(Protocol):
    def next_time(self) -> Optional[float]: ...

    def step(self) -> None: ...


class StepperQueue:
    """Discrete-event components in the order of their next events: the one virtual-time
    driver under both ``VirtualTimeLoop`` (between asyncio's timers) and the harness's
    synchronous ``VirtualCluster`` (between its own). Each stepper's next time is kept until
    it steps or is marked ``changed``; ties go to the stepper added first."""

    def __init__(self) -> None:
        self._next: dict[Stepper, float] = {}  # stepper -> its next time as last asked
        self._stale: set[Stepper] = set()      # steppers to ask again

    def __bool__(self) -> bool:
        return bool(self._next)

    def add(self, stepper: Stepper) -> None:
        self._next[stepper] = _NEVER
        self._stale.add(stepper)

    def remove(self, stepper: Stepper) -> None:
        self._next.pop(stepper, None)
        self._stale.discard(stepper)

    def changed(self, stepper: Stepper) -> None:
        """``stepper``'s next time may have moved: ask it again before the next choice."""
        if stepper in self._next:
            self._stale.add(stepper)

    def run_due(self, limit: float, at: Callable[[float], None], done: Callable[[], bool]) -> bool:
        """Run the events due before ``limit``, earliest first, calling ``at(t)`` before each
        (the driver moves its clock to ``t``); True as soon as ``done()`` after one, False
        when none is left before ``limit``. A stepper stuck at one time is a bug."""
        due, stale = self._next, self._stale
        last: tuple[Any, float] = (None, _NEVER)
        repeats = 0
        while True:
            while stale:
                s = stale.pop()
                t = s.next_time()
                due[s] = _NEVER if t is None else t
            if not due:
                return False
            best = min(due, key=due.__getitem__)
            best_t = due[best]
            if best_t >= limit:
                return False
            repeats = repeats + 1 if (best, best_t) == last else 0
            if repeats > 1000:
                raise RuntimeError(f"stepper {best!r} makes no progress at {best_t}")
            last = (best, best_t)
            at(best_t)
            stale.add(best)
            best.step()
            if done():
                return True


class _VirtualSelector(selectors.BaseSelector):
    """Delegates to the default selector; ``select`` never sleeps while a timer is pending."""

    def __init__(self, loop: "VirtualTimeLoop") -> None:
        self._sel = selectors.DefaultSelector()
        self._loop = loop

    # -- delegation -------------------------------------------------------------------
    def register(self, fileobj, events, data=None):
        return self._sel.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._sel.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._sel.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self._sel.get_key(fileobj)

    def get_map(self):
        return self._sel.get_map()

    def close(self) -> None:
        self._sel.close()

    # -- the virtual part -------------------------------------------------------------
    def select(self, timeout: Optional[float] = None):
        loop, sel, stats = self._loop, self._sel, self._loop.stats
        stats.polls += 1
        events = sel.select(0)
        if events:
            stats.io_batches += 1
            return events
        if timeout is not None and timeout <= 0:
            return events
        # Nothing ready and the loop would sleep: poll once more (a loopback peer's
        # bytes must never be overtaken by a timer), then jump instead of sleeping.
        events = sel.select(0)
        if events:
            stats.io_batches += 1
            return events
        if loop._executor_jobs:  # noqa: SLF001 - thread work takes no virtual time
            stats.executor_waits += 1
            return sel.select(_EXECUTOR_POLL_S)
        timer_at = None if timeout is None else loop.time() + timeout
        if loop._run_steppers(timer_at):  # noqa: SLF001 - a stepper's event made a callback ready
            return []
        if timer_at is None:
            stats.blocking_waits += 1
            return sel.select(None)
        loop._jump(timer_at)  # noqa: SLF001
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock that starts at ``start`` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        self._vnow = float(start)
        self._executor_jobs = 0
        self._steppers = StepperQueue()
        self.stats = LoopStats()
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._vnow

    def _jump(self, target: float) -> None:
        scheduled = self._scheduled  # asyncio's timer heap, head is the earliest
        if scheduled:
            when = scheduled[0]._when  # noqa: SLF001 - exact, avoids float drift
            if when > self._vnow and abs(when - target) <= 1e-6 * max(1.0, abs(when)):
                target = when
        if target > self._vnow:
            self.stats.jumps += 1
            self.stats.jumped_s += target - self._vnow
            self._vnow = target

    def add_stepper(self, stepper: Stepper) -> None:
        self._steppers.add(stepper)

    def remove_stepper(self, stepper: Stepper) -> None:
        self._steppers.remove(stepper)

    def stepper_changed(self, stepper: Stepper) -> None:
        """``stepper``'s next time may have moved: ask it again before the next jump."""
        self._steppers.changed(stepper)

    def _run_steppers(self, timer_at: Optional[float]) -> bool:
        """Run stepper events due before the next timer (at ``timer_at``; None: no timer),
        earliest first; True as soon as one made a callback ready."""
        if not self._steppers:
            return False
        return self._steppers.run_due(_NEVER if timer_at is None else timer_at, self._step_at, self._has_ready)

    def _step_at(self, t: float) -> None:
        if t > self._vnow:
            self._vnow = t
        self.stats.steps += 1

    def _has_ready(self) -> bool:
        return bool(self._ready)

    def advance(self, seconds: float) -> None:
        """Move the clock forward by hand (tests); timers due by then fire next."""
        if seconds < 0:
            raise ValueError("time cannot move backwards")
        self._vnow += seconds

    def run_in_executor(self, executor, func, *args):
        fut = super().run_in_executor(executor, func, *args)
        self._executor_jobs += 1
        fut.add_done_callback(self._executor_done)
        return fut

    def _executor_done(self, _fut: Any) -> None:
        self._executor_jobs -= 1


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0, debug: bool = False) -> T:
    """``asyncio.run`` on a fresh ``VirtualTimeLoop``."""
    with asyncio.Runner(debug=debug, loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)


def wall_time(fn: Callable[[], Awaitable[T]] | Coroutine[Any, Any, T]) -> tuple[T, float, float]:
    """Run a coroutine on a virtual loop; return (result, real seconds, virtual seconds)."""
    loop_box: list[VirtualTimeLoop] = []

    def factory() -> VirtualTimeLoop:
        loop_box.append(VirtualTimeLoop())
        return loop_box[-1]

    coro = fn() if callable(fn) else fn
    t0 = time.perf_counter()
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(coro)
        virtual = loop_box[0].time()
    return result, time.perf_counter() - t0, virtual
