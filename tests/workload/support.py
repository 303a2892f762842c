"""Shared pieces of the workload tests: a tiny workload, hooks that record their calls,
and a scripted in-process /generate server (real HTTP) for failure paths."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from aiohttp import web

from pearl_sglang.workload import EmulatedTime, SweWorkload, TrainHooks

SCALE = 50.0
HANG = 0
TINY = SweWorkload(batch_size=8, group_size=4, turns_median=3, turns_sigma=0.3, turns_min=2,
                   turns_max=4, initial_prompt_tokens=(64, 128), observation_tokens=(16, 32),
                   response_tokens=(8, 16), max_trajectory_tokens=1024, env_latency_median_s=1.0,
                   env_latency_p90_s=3.0, env_latency_cut_s=10.0, vocab=(300, 1000), seed=1)


def scaled_time() -> EmulatedTime:
    return EmulatedTime(time_scale=SCALE)


@dataclass
class HookLog:
    """Records ``(name, step, emulated time)`` for every hook call."""

    time: EmulatedTime
    calls: list[tuple[str, int, float]] = field(default_factory=list)
    begin_s: float = 0.0  # how long train_begin takes to answer

    def hooks(self) -> TrainHooks:
        async def begin(step: int) -> None:
            self.calls.append(("train_begin", step, self.time.now()))
            await self.time.wait(self.begin_s)

        async def finished(step: int) -> None:
            self.calls.append(("train_finished", step, self.time.now()))

        async def push(step: int) -> str:
            self.calls.append(("push_weights", step, self.time.now()))
            return f"v{step}"

        return TrainHooks(train_begin=begin, train_finished=finished, push_weights=push)

    def order(self) -> list[tuple[str, int]]:
        return [(name, step) for name, step, _ in self.calls]


def expected_order(steps: int) -> list[tuple[str, int]]:
    return [(h, s) for s in range(steps) for h in ("train_begin", "train_finished", "push_weights")]


@dataclass
class Scripted:
    """A /generate server that answers the i-th call with ``statuses[i]`` (200 after);
    status ``HANG`` never answers until the server closes."""

    statuses: list[int]
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    closing: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        i = len(self.bodies) - 1
        status = self.statuses[i] if i < len(self.statuses) else 200
        if status == HANG:
            await self.closing.wait()
        if status != 200:
            return web.json_response({"error": {"message": f"scripted {status}"}}, status=status)
        n = body["sampling_params"]["max_new_tokens"]
        return web.json_response({"text": "", "output_ids": list(range(500, 500 + n)),
                                  "meta_info": {"prompt_tokens": len(body["input_ids"]),
                                                "cached_tokens": 0, "completion_tokens": n}})


@contextlib.asynccontextmanager
async def scripted_server(script: Scripted):
    app = web.Application()
    app.router.add_post("/generate", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp exposes no getter
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        script.closing.set()
        await runner.cleanup()
