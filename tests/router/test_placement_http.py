"""Placement through the real router over emulated workers: a GRPO group that shares a
prompt spreads over the pool, and per-worker utilization shows in /metrics (labels slot
and role) and /pearl/state."""
from __future__ import annotations

import asyncio

import httpx

from tests.router.conftest import running_router
from tests.support.emulated import emulators


async def test_a_group_spreads_and_utilization_is_exported(admin_headers):
    prompt = list(range(10, 10 + 1024))
    async with emulators(4, "--time-scale", "20") as workers:
        urls = [u for u, _ in workers]
        async with running_router(regular=urls) as (url, app, store):
            async with httpx.AsyncClient(timeout=120) as c:
                async def member(i: int):
                    r = await c.post(url + "/generate", headers={"X-Pearl-Trajectory-Id": f"g-{i}"}, json={
                        "input_ids": prompt, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})
                    assert r.status_code == 200, r.text
                await asyncio.gather(*(member(i) for i in range(8)))
                generated = [w.engine.stats.generation_tokens for _, w in workers]
                assert generated == [128, 128, 128, 128]
                metrics = (await c.get(url + "/metrics")).text
                for slot in range(4):
                    assert f'pearl_worker_generated_tokens_total{{role="colocated",slot="{slot}"}} 128.0' in metrics
                assert 'pearl_worker_busy_seconds_total{role="colocated",slot="0"}' in metrics
                state = (await c.get(url + "/pearl/state", headers=admin_headers)).json()
                totals = state["utilization"]["totals"]
                assert totals["workers_used"] == 4 and totals["generated_busiest_over_mean"] == 1.0
                assert state["routing"]["routing_policy"] == "cost"
                # Finished turns owe their next turn where they ran.
                assert sum(v["owed_trajectories"] for v in state["routing"]["loads"].values()) == 8
