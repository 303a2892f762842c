"""The replay harness's in-process ``/generate``: the same answers and errors as the
router's HTTP endpoint, against a real router over an emulated worker."""
from __future__ import annotations

import aiohttp
import numpy as np
import pytest

from benchmarks.harness.in_process_front_door import InProcessFrontDoor
from pearl_rl_adapter.telemetry import tag_headers
from pearl_sglang import fastjson
from pearl_sglang.router.state import ROUTER
from pearl_sglang.workload.client import GenerateClient
from pearl_sglang.workload.errors import GenerateFailed
from pearl_sglang.workload.timebase import EmulatedTime
from tests.router.conftest import running_router
from tests.support.emulated import emulator

_SAMPLING = {"max_new_tokens": 4, "ignore_eos": True}


def _ids(n: int, first: int) -> np.ndarray:
    return np.arange(first, first + n, dtype=np.int64)


def _answered(app, status: int) -> float:
    """``pearl_requests_total`` of /generate with ``status``, as /metrics reports it."""
    return app[ROUTER].metrics.registry.get_sample_value(
        "pearl_requests_total", {"endpoint": "/generate", "status": str(status)})


async def _http(session: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> tuple[int, bytes]:
    async with session.post(url + "/generate", data=fastjson.dumps(body),
                            headers={**fastjson.JSON_HEADERS, **headers}) as resp:
        return resp.status, await resp.read()


# Each case once through the door and once over HTTP; the bodies' prompts differ between
# the two sends only where a cached prefix would change the answer.
_REFUSED = [
    ({"input_ids": _ids(40, 7), "sampling_params": {"max_new_tokens": -1}}, {}),
    ({"input_ids": np.array([5, -3, 9], dtype=np.int64), "sampling_params": _SAMPLING}, {}),
    ({"input_ids": np.array([], dtype=np.int64), "sampling_params": _SAMPLING}, {}),
    ({"input_ids": np.array([1.5, 2.0]), "sampling_params": _SAMPLING}, {}),
    ({"input_ids": _ids(40, 7), "sampling_params": _SAMPLING}, {"x-pearl-turn": "-1"}),  # any case, as in HTTP
    ({"input_ids": _ids(40, 7), "sampling_params": {**_SAMPLING, "tempreature": 0.5}}, {}),
]


@pytest.mark.parametrize("body,headers", _REFUSED)
async def test_a_refused_turn_gets_the_http_status_and_body(body, headers):
    async with emulator() as (worker, _), running_router(regular=(worker,)) as (url, app, _store):
        door = InProcessFrontDoor(app)
        async with aiohttp.ClientSession() as session:
            expected = await _http(session, url, body, headers)
        assert 400 <= expected[0] < 500, expected
        assert await door.post_generate(body, headers) == expected
        assert _answered(app, expected[0]) == 2  # the door counts its answers as the HTTP endpoint does


async def test_a_turn_through_the_door_is_the_turn_over_http():
    async with emulator() as (worker, _), running_router(regular=(worker,)) as (url, app, _store):
        door = InProcessFrontDoor(app)
        headers = tag_headers("traj-1", 0)
        status, answer = await door.post_generate({"input_ids": _ids(300, 11), "sampling_params": _SAMPLING}, headers)
        async with aiohttp.ClientSession() as session:
            http_status, raw = await _http(session, url, {"input_ids": _ids(300, 5000), "sampling_params": _SAMPLING},
                                           tag_headers("traj-2", 0))
        over_http = fastjson.loads(raw)
        assert status == http_status == 200
        assert set(answer) == set(over_http) and set(answer["meta_info"]) == set(over_http["meta_info"])
        assert len(answer["output_ids"]) == 4 and answer["meta_info"]["prompt_tokens"] == 300
        # the trajectory's second turn finds its first turn's prefix where that ran
        status, second = await door.post_generate(
            {"input_ids": np.concatenate([_ids(300, 11), answer["output_ids"], _ids(50, 90)]),
             "sampling_params": _SAMPLING}, tag_headers("traj-1", 1))
        assert status == 200 and second["meta_info"]["cached_tokens"] >= 256
        assert _answered(app, 200) == 3


async def test_the_rollout_client_through_the_door_gets_typed_answers():
    async with emulator() as (worker, _), running_router(regular=(worker,)) as (url, app, _store):
        async with aiohttp.ClientSession() as session:
            client = GenerateClient(session, url, time=EmulatedTime(), front_door=InProcessFrontDoor(app))
            gen = await client.generate(_ids(100, 3), max_new_tokens=6, trajectory_id="t-1", turn=0)
            assert len(gen.output_ids) == 6 and gen.prompt_tokens == 100 and gen.attempts == 1
            with pytest.raises(GenerateFailed) as e:  # a 400 is not retried
                await client.generate(np.array([1, -1], dtype=np.int64), max_new_tokens=6, trajectory_id="t-2", turn=0)
    assert e.value.attempts == 1 and e.value.errors[0].startswith("HTTP 400")
