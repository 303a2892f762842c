"""The rollout client against a scripted in-process server: bounded retries that resend
the same context, permanent errors that are not retried, and a timeout that ends a turn."""
from __future__ import annotations

import aiohttp
import pytest

from pearl_rl_adapter.telemetry import TRAJECTORY_HEADER, TURN_HEADER
from pearl_sglang.workload.client import GenerateClient
from pearl_sglang.workload.errors import GenerateFailed
from tests.workload.support import HANG, Scripted, scaled_time, scripted_server


async def _generate(url, **kw):
    async with aiohttp.ClientSession() as s:
        client = GenerateClient(s, url, time=scaled_time(), retry_delays_s=(0.1, 0.1), **kw)
        return await client.generate([301, 302, 303], max_new_tokens=5, trajectory_id="t-7", turn=2)


async def test_transient_errors_are_retried_with_the_same_context():
    script = Scripted([503, 500])
    async with scripted_server(script) as url:
        gen = await _generate(url)
    assert gen.attempts == 3 and len(gen.errors) == 2 and "503" in gen.errors[0]
    assert gen.output_ids == tuple(range(500, 505)) and gen.prompt_tokens == 3
    assert all(b == script.bodies[0] for b in script.bodies)
    assert script.bodies[0]["sampling_params"] == {"max_new_tokens": 5, "ignore_eos": True}
    assert script.headers[0][TRAJECTORY_HEADER] == "t-7" and script.headers[0][TURN_HEADER] == "2"


async def test_retries_are_bounded():
    script = Scripted([503] * 10)
    async with scripted_server(script) as url:
        with pytest.raises(GenerateFailed) as e:
            await _generate(url)
    assert e.value.attempts == 3 and len(script.bodies) == 3


async def test_bad_request_is_not_retried():
    script = Scripted([400])
    async with scripted_server(script) as url:
        with pytest.raises(GenerateFailed) as e:
            await _generate(url)
    assert e.value.attempts == 1 and len(script.bodies) == 1


async def test_a_hanging_router_times_out():
    script = Scripted([HANG] * 3)
    async with scripted_server(script) as url:
        with pytest.raises(GenerateFailed) as e:
            await _generate(url, request_timeout_s=0.2)
    assert e.value.attempts == 3 and "timed out" in e.value.errors[0]
