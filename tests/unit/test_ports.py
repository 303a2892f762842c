"""The ports between the control plane and the router are structural (``typing.Protocol``),
so nothing but these checks notices when an implementation drifts from its port: every
member the port declares is implemented, with the same signature, and the clocks keep
the ``Clock`` contract."""
from __future__ import annotations

import asyncio
import inspect

import pytest

from pearl_sglang.clock import Clock, LoopClock, ManualClock, WallClock
from pearl_sglang.control.data_plane import DataPlane
from pearl_sglang.control.orchestrator import Orchestrator
from pearl_sglang.router.data_plane import RouterDataPlane
from pearl_sglang.router.state import ControlView


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("port, implementation", [(DataPlane, RouterDataPlane), (ControlView, Orchestrator),
                                                  (Clock, LoopClock), (Clock, WallClock), (Clock, ManualClock)])
def test_each_implementation_has_its_ports_methods_with_their_signatures(port, implementation):
    methods = _methods(port)
    assert methods, f"{port.__name__} declares no method"
    for name, signature in methods.items():
        member = getattr(implementation, name, None)
        assert member is not None, f"{implementation.__name__} lacks {port.__name__}.{name}"
        assert inspect.signature(member) == signature, f"{implementation.__name__}.{name} drifted from the port"
        assert inspect.iscoroutinefunction(member) == inspect.iscoroutinefunction(getattr(port, name)), name


def test_control_view_attributes_are_what_the_orchestrator_sets():
    source = inspect.getsource(Orchestrator.__init__)
    for name in ControlView.__annotations__:
        is_property = isinstance(getattr(Orchestrator, name, None), property)
        assert is_property or f"self.{name} = " in source, f"Orchestrator sets no {name}"


async def test_a_manual_clock_moves_only_when_it_sleeps_or_is_told():
    clock = ManualClock(5.0)
    await asyncio.sleep(0.01)
    assert clock.now() == 5.0
    await clock.sleep(2.5)
    assert clock.now() == 7.5 == clock.epoch()
    with pytest.raises(ValueError):
        clock.advance(-1)


async def test_the_loop_clock_is_the_event_loops():
    clock = LoopClock()
    loop = asyncio.get_running_loop()
    before = loop.time()
    await clock.sleep(0.01)
    assert before + 0.01 <= clock.now() <= loop.time()
