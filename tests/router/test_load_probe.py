"""Workers' own load reaches placement: requests another client sent straight to a
worker make the router place elsewhere; both SGLang load answers are read."""
from __future__ import annotations

import asyncio

import httpx

from pearl_sglang.router.load_probe import requests_in
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import ADMIN_TOKEN, running_router
from pearl_sglang.router.config import RouterConfig, Security
from tests.support.emulated import emulators


def test_requests_in_reads_v1_loads_and_get_load():
    assert requests_in({"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 2}]}) == 5
    assert requests_in([{"num_reqs": 4, "num_waiting_reqs": 1}, {"num_reqs": 1}]) == 6
    assert requests_in({"error": "nope"}) is None and requests_in([{"x": 1}]) is None


async def test_work_sent_around_the_router_counts_in_placement():
    config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600,
                          load_poll_interval_s=0.1)
    async with emulators(2, "--time-scale", "1") as workers:
        (u0, w0), (u1, _) = workers
        async with running_router(regular=[u0, u1], config=config) as (url, app, store):
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
                direct = [asyncio.ensure_future(c.post(u0 + "/generate", json={**body, "rid": f"d{i}"}))
                          for i in range(4)]
                st = app[ROUTER]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while st.loads.snapshot(loop.time()).get(0) is None or \
                        st.loads.snapshot(loop.time())[0].running < 4:
                    assert loop.time() < deadline, "the worker's own load was never read"
                    await asyncio.sleep(0.05)
                for i in range(3):
                    r = await c.post(url + "/generate", json={"input_ids": [9, 9, i], "sampling_params": {
                        "max_new_tokens": 4, "ignore_eos": True}})
                    assert r.status_code == 200
                assert st.utilization.totals.keys() == {1}   # never the worker busy with others' work
                await c.post(u0 + "/abort_request", json={"abort_all": True})
                await asyncio.gather(*direct, return_exceptions=True)
