"""Replay a preemptible-GPU trace against PEARL's admin API (``POST /pearl/gpus``).

Each scaled trace change becomes joins of new TP2 workers (two GPU ids on a new spot
node) or leaves of the most recently joined ones, issued at the change's emulated time.
A join answers when its workers are admitted, so joins run as tasks and a leave of a
node first waits for that node's join.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from pearl_rl_adapter import AsyncPearlClient, PearlError
from pearl_sglang.workload.timebase import EmulatedTime
from pearl_sglang.workload.trace import WorkerTarget

log = logging.getLogger("pearl.demo")


@dataclass
class TraceReplayer:
    client: AsyncPearlClient
    targets: list[WorkerTarget]
    time: EmulatedTime
    leave_deadline_s: float = 30.0
    joined: list[tuple[str, asyncio.Task]] = field(default_factory=list)
    events: list[tuple[float, str, int]] = field(default_factory=list)
    _next_node: int = 0

    async def run(self) -> None:
        start = self.time.now()
        for target in self.targets:
            await self.time.wait(target.t_s - (self.time.now() - start))
            while len(self.joined) < target.workers:
                await self._join()
            while len(self.joined) > target.workers:
                await self._leave()
            self.events.append((target.t_s, "target", target.workers))

    async def _join(self) -> None:
        node = f"spot{self._next_node}"
        self._next_node += 1
        task = asyncio.ensure_future(self.client.join_gpus([f"{node}:0", f"{node}:1"]))
        self.joined.append((node, task))

    async def _leave(self) -> None:
        node, task = self.joined.pop()
        try:
            await task
        except PearlError as e:
            log.warning("join of %s failed: %s", node, e)
        try:
            await self.client.leave_gpus([f"{node}:0", f"{node}:1"], deadline_s=self.leave_deadline_s)
        except PearlError as e:
            log.warning("leave of %s failed: %s", node, e)

    async def drain(self) -> None:
        await asyncio.gather(*(t for _, t in self.joined), return_exceptions=True)
