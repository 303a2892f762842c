"""/pearl/state names the step's predicted stragglers, through the router over emulated workers."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.state import ROUTER
from tests.router.conftest import ADMIN_TOKEN, running_router
from tests.support.emulated import emulators


ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _trajectory(c, url, tid, prompt, turns, env_s, expected=None):
    ctx = list(prompt)
    for turn in range(turns):
        headers = {"X-Pearl-Trajectory-Id": tid, "X-Pearl-Turn": str(turn)}
        if expected is not None:
            headers["X-Pearl-Expected-Turns"] = str(expected)
        r = await c.post(url + "/generate", headers=headers,
                         json={"input_ids": ctx, "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})
        assert r.status_code == 200, r.text
        ctx = ctx + r.json()["output_ids"] + [5] * 20
        await asyncio.sleep(env_s)


async def _two_steps(expected: dict[str, int] | None = None) -> tuple[dict, dict]:
    """The critical path before and during a step: a finished step where every trajectory
    took four turns, then three trajectories three turns in and one ("behind") only one;
    ``expected``: X-Pearl-Expected-Turns for some of them."""
    expected = expected or {}
    config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600,
                          straggler_share=0.25)
    async with emulators(2, "--time-scale", "20") as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u for u, _ in workers], config=config) as (url, app, _):
                await asyncio.gather(*(_trajectory(c, url, f"old-{i}", [20 + i] * 64, 4, 0.01)
                                       for i in range(4)))
                app[ROUTER].telemetry.drain()
                before = (await c.get(url + "/pearl/state", headers=ADMIN)).json()["critical_path"]
                await asyncio.gather(*(_trajectory(c, url, f"new-{i}", [40 + i] * 64, 3, 0.01,
                                                   expected=expected.get(f"new-{i}")) for i in range(3)),
                                     _trajectory(c, url, "behind", [50] * 64, 1, 0.01))
                during = (await c.get(url + "/pearl/state", headers=ADMIN)).json()["critical_path"]
    return before, during


async def test_state_lists_the_trajectories_expected_to_finish_last():
    before, state = await _two_steps()
    assert before == {"running": 0, "share": 0.25, "history_trajectories": 4, "stragglers": []}
    assert state["running"] == 4 and state["history_trajectories"] == 4
    [top] = state["stragglers"]
    assert top["trajectory"] == "behind" and top["turns_done"] == 1 and top["expected_turns"] is None
    assert top["remaining_turns"] == 3 and top["remaining_tokens"] == 48
    assert top["remaining_s"] > 0


async def test_an_expected_turn_count_ranks_a_trajectory_as_the_client_says():
    """The client says one of the trajectories three turns in will take ten: it is the
    straggler, not "behind"."""
    _, state = await _two_steps({"new-0": 4, "new-1": 10, "new-2": 4})
    [top] = state["stragglers"]
    assert top["trajectory"] == "new-1" and top["turns_done"] == 3 and top["remaining_turns"] == 7
    assert top["expected_turns"] == 10


async def test_a_chat_turn_carries_its_expected_turn_count_too():
    """The OpenAI routes read X-Pearl-Expected-Turns like /generate: a chat turn of a
    trajectory the client expects to take 12 turns is listed with it."""
    config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600, straggler_share=1.0)
    headers = {"X-Pearl-Trajectory-Id": "chat-1", "X-Pearl-Turn": "0", "X-Pearl-Expected-Turns": "12"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True}
    async with emulators(1, "--time-scale", "20") as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u for u, _ in workers], config=config) as (url, _, _):
                r = await c.post(url + "/v1/chat/completions", headers=headers, json=body)
                assert r.status_code == 200, r.text
                state = (await c.get(url + "/pearl/state", headers=ADMIN)).json()["critical_path"]
    [only] = state["stragglers"]
    assert only["trajectory"] == "chat-1" and only["expected_turns"] == 12 and only["remaining_turns"] == 11


def test_straggler_flags_build_the_config_and_are_validated():
    import argparse

    parser = argparse.ArgumentParser()
    RouterConfig.add_cli_args(parser)
    default = RouterConfig.from_cli_args(parser.parse_args([]))
    assert (default.straggler_share, default.straggler_priority) == (0.1, False)
    on = RouterConfig.from_cli_args(parser.parse_args(["--straggler-share", "0.2", "--straggler-priority"]))
    assert (on.straggler_share, on.straggler_priority) == (0.2, True)
    with pytest.raises(ValueError, match="straggler-share"):
        RouterConfig(straggler_share=0).validate()


async def _wait_waiting(c, worker_url, n, what="num_waiting_reqs"):
    for _ in range(1200):
        loads = (await c.get(worker_url + "/v1/loads")).json()["loads"]
        if sum(e[what] for e in loads) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{n} requests never waited")


@pytest.mark.parametrize("on", [True, False])
async def test_a_stragglers_turn_jumps_the_workers_queue(on):
    """One worker, one running request at a time, priority scheduling on: with
    --straggler-priority the predicted straggler's turn, queued after another's, runs first."""
    config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600,
                          straggler_share=0.3, straggler_priority=on)
    # Real time: at a faster scale the blocker can end before a loaded machine sees the queue.
    async with emulators(1, "--time-scale", "1", "--enable-priority-scheduling",
                         "--max-running-requests", "1") as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u for u, _ in workers], config=config) as (url, app, _):
                await asyncio.gather(*(_trajectory(c, url, f"old-{i}", [20 + i] * 64, 4, 0.01)
                                       for i in range(3)))
                app[ROUTER].telemetry.drain()
                await asyncio.gather(_trajectory(c, url, "a", [40] * 64, 3, 0.01),
                                     _trajectory(c, url, "b", [41] * 64, 3, 0.01),
                                     _trajectory(c, url, "late", [42] * 64, 1, 0.01))
                blocker = asyncio.create_task(c.post(url + "/generate", json={
                    "input_ids": [9] * 32, "rid": "blocker",
                    "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}))
                finished: list[str] = []

                async def turn(tid, n):
                    r = await c.post(url + "/generate", headers={"X-Pearl-Trajectory-Id": tid,
                                                                 "X-Pearl-Turn": str(n)},
                                     json={"input_ids": [50 + n] * 64,
                                           "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})
                    assert r.status_code == 200, r.text
                    finished.append(tid)

                await _wait_waiting(c, workers[0][0], 1, what="num_running_reqs")
                first = asyncio.create_task(turn("a", 3))
                await _wait_waiting(c, workers[0][0], 1)
                second = asyncio.create_task(turn("late", 1))
                await _wait_waiting(c, workers[0][0], 2)
                await c.post(url + "/abort_request", json={"rid": "blocker"})
                await asyncio.gather(first, second)
                assert (await blocker).json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert finished == (["late", "a"] if on else ["a", "late"])


@pytest.mark.parametrize("on", [True, False])
async def test_held_turns_reach_a_worker_without_priority_scheduling_stragglers_first(on):
    """The router's own order: turns held while a reconfiguration finishes are released
    predicted stragglers first, so a FCFS worker (no priority scheduling, one running
    request at a time) serves the straggler's turn first although it arrived second."""
    config = RouterConfig(security=Security(admin_token=ADMIN_TOKEN), health_interval_s=3600,
                          straggler_share=0.3, straggler_priority=on)
    async with emulators(1, "--time-scale", "1", "--max-running-requests", "1") as workers:
        async with httpx.AsyncClient(timeout=60) as c:
            async with running_router(regular=[u for u, _ in workers], config=config) as (url, app, _):
                await asyncio.gather(*(_trajectory(c, url, f"old-{i}", [20 + i] * 64, 4, 0.01)
                                       for i in range(3)))
                app[ROUTER].telemetry.drain()
                await asyncio.gather(_trajectory(c, url, "a", [40] * 64, 3, 0.01),
                                     _trajectory(c, url, "b", [41] * 64, 3, 0.01),
                                     _trajectory(c, url, "late", [42] * 64, 1, 0.01))
                gate = app[ROUTER].gate
                finished: list[str] = []

                async def turn(tid, n):
                    r = await c.post(url + "/generate", headers={"X-Pearl-Trajectory-Id": tid,
                                                                 "X-Pearl-Turn": str(n)},
                                     json={"input_ids": [50 + n] * 64,
                                           "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})
                    assert r.status_code == 200, r.text
                    finished.append(tid)

                async with gate.closed("adding a worker"):
                    first = asyncio.create_task(turn("a", 3))
                    while gate.waiting < 1:
                        await asyncio.sleep(0.01)
                    second = asyncio.create_task(turn("late", 1))
                    while gate.waiting < 2:
                        await asyncio.sleep(0.01)
                await asyncio.gather(first, second)
    assert finished == (["late", "a"] if on else ["a", "late"])
