"""Replay a preemptible-GPU trace against PEARL's admin API (``POST /pearl/gpus``).

Each scaled trace change becomes joins of new TP2 workers (two GPU ids on a new spot
node) or leaves of the most recently joined ones, issued at the change's emulated time.
A join answers when its workers are admitted, so joins run as tasks and a leave of a
node first waits for that node's join. Every join and leave answer is checked against
``/pearl/state`` read right after it (``answers.py``); ``answers.wrong`` lists the
answers that were not true, and a failed call counts as one.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from pearl_rl_adapter import AsyncPearlClient, PearlError
from pearl_sglang.aio import cancel_all, gather_settled
from pearl_sglang.demo.answers import AnswerLog, check_join, check_leave
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
    answers: AnswerLog = field(default_factory=AnswerLog)
    _next_node: int = 0

    async def run(self) -> None:
        """Issue the trace's changes, then wait for the joins' answers. Cancelled (the
        replay ended), it cancels the joins still waiting for admission: they have no
        answer to check."""
        start = self.time.now()
        try:
            for target in self.targets:
                await self.time.wait(target.t_s - (self.time.now() - start))
                while len(self.joined) < target.workers:
                    await self._join()
                while len(self.joined) > target.workers:
                    await self._leave()
                self.events.append((target.t_s, "target", target.workers))
            await gather_settled(*(task for _, task in self.joined))
        except asyncio.CancelledError:
            await cancel_all([task for _, task in self.joined])
            raise

    async def _join(self) -> None:
        node = f"spot{self._next_node}"
        self._next_node += 1
        self.joined.append((node, asyncio.ensure_future(self._join_checked(node))))

    async def _join_checked(self, node: str) -> None:
        gpus = [f"{node}:0", f"{node}:1"]
        try:
            answer = await self.client.join_gpus(gpus)
            self.answers.joins += 1
            self.answers.superseded_joins += bool(answer.superseded_by)
            self._note(check_join(answer, gpus, (await self.client.state())["table"]))
        except PearlError as e:
            self._note(f"join of {node} failed: {e}")

    async def _leave(self) -> None:
        node, task = self.joined.pop()
        await task
        gpus = [f"{node}:0", f"{node}:1"]
        try:
            answer = await self.client.leave_gpus(gpus, deadline_s=self.leave_deadline_s)
            self.answers.leaves += 1
            self._note(check_leave(answer, gpus, (await self.client.state())["table"]))
        except PearlError as e:
            self._note(f"leave of {node} failed: {e}")

    def _note(self, wrong: str | None) -> None:
        if wrong is not None:
            log.warning("wrong answer: %s", wrong)
            self.answers.wrong.append(wrong)
