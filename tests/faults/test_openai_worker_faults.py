"""OpenAI chat requests survive a worker SIGKILLed under them, streaming and not: they run
as token ids through the dispatcher, so the answer is the one an undisturbed worker gives
(same content, usage and finish reason), not a dropped connection or an error event."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from benchmarks.harness.servers import wait_all_healthy
from pearl_sglang.core.state import Role
from pearl_sglang.router.state import ROUTER
from tests.faults.support import collect_sse, fault_config, until
from tests.router.conftest import ADMIN_TOKEN, running_router
from tests.support.workers import WorkerLauncher

KINDS = [pytest.param("emulator", marks=pytest.mark.timeout(60)),
         pytest.param("sglang", marks=[pytest.mark.realsglang, pytest.mark.timeout(900)])]
# Real SGLang decodes a few tokens a second on a shared CPU: fewer, still well past the kill.
TOKENS = {"emulator": 600, "sglang": 400}


def _chat(tokens: int = TOKENS["emulator"], **extra) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": "You are terse."},
                                       {"role": "user", "content": "The quick brown fox jumps over the lazy dog"}],
            "max_tokens": tokens, "temperature": 0, "ignore_eos": True, **extra}


def _content(events: list) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if isinstance(e, dict) and e.get("choices"))


async def _reference(survivor_url: str, tokens: int = TOKENS["emulator"]) -> dict:
    """Asked after the run, so the survivor's cache cannot draw the request to it."""
    async with httpx.AsyncClient(timeout=600) as c:
        r = await c.post(survivor_url + "/v1/chat/completions", json=_chat(tokens))
    assert r.status_code == 200, r.text
    return r.json()


def _usage_triple(usage: dict) -> tuple[int, int, int]:
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


@pytest.mark.parametrize("kind", KINDS)
async def test_worker_sigkilled_mid_chat_stream_completes_elsewhere_exact(kind, worker_sets, tiny_model_dir,
                                                                           tmp_path):
    survivor, _ = worker_sets(kind)
    tokens = TOKENS[kind]
    launcher = WorkerLauncher(kind, tmp_path)
    victim = launcher.start("victim", tiny_model_dir, Role.COLOCATED)
    try:
        await asyncio.to_thread(wait_all_healthy, [victim], 240)
        # The stream starts while the victim is the router's only worker, so it runs there
        # whatever placement would prefer (the shared survivor may hold the prompt in its
        # prefix cache from earlier tests); the survivor joins once tokens flow, and the
        # victim is killed only after it has.
        async with running_router(regular=[victim.url], config=fault_config(chunk_s=30.0)) as (url, app, store):
            st = app[ROUTER]
            seen: list[int] = []
            killed_at: list[int] = []
            joined = asyncio.Event()
            tasks: list[asyncio.Task] = []

            def joined_yet() -> bool:
                return any(w.endpoint == survivor.url for w in store.table.active())

            async def join_survivor(c: httpx.AsyncClient) -> None:
                # The victim's generation is held in place while the survivor joins: on a
                # quiet machine real SGLang generated all 400 tokens before the join ended.
                paused = await c.post(victim.url + "/pause_generation", json={"mode": "in_place"})
                assert paused.status_code == 200, paused.text
                try:
                    r = await c.post(url + "/workers", json={"url": survivor.url},
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                    assert r.status_code == 202, r.text
                    await until(joined_yet, timeout=120, what="the survivor to join")
                    joined.set()
                finally:
                    resumed = await c.post(victim.url + "/continue_generation", json={})
                    assert resumed.status_code == 200, resumed.text

            def kill(event):
                if not (event.get("choices") and event["choices"][0]["delta"].get("content")):
                    return
                seen.append(1)
                if len(seen) == 1:
                    assert st.inflight.load().get(0), "the stream is not on the victim"
                    tasks.append(asyncio.ensure_future(join_survivor(c)))
                if len(seen) >= 20 and joined.is_set() and not killed_at:
                    killed_at.append(len(seen))
                    victim.kill()

            async with httpx.AsyncClient(timeout=600) as c:
                events = await collect_sse(c, url + "/v1/chat/completions",
                                           _chat(tokens, stream_options={"include_usage": True}), on_chunk=kill)
                await asyncio.gather(*tasks)
            assert killed_at, f"the stream ended ({len(seen)} chunks) before the survivor joined"
            assert len(st.inflight) == 0
            assert st.dispatcher.migrations >= 1
    finally:
        launcher.stop_all()
    expected = await _reference(survivor.url, tokens)
    assert events[-1] == "[DONE]"
    assert not any("error" in e for e in events[:-1] if isinstance(e, dict)), events[-3:]
    reasons = [e["choices"][0]["finish_reason"] for e in events[:-1] if e.get("choices")]
    assert [r for r in reasons if r] == ["length"] and reasons[-1] == "length"
    assert _content(events) == expected["choices"][0]["message"]["content"]
    usage = [e["usage"] for e in events[:-1] if e.get("usage")]
    assert [_usage_triple(u) for u in usage] == [_usage_triple(expected["usage"])]
    assert expected["usage"]["completion_tokens"] == tokens


async def test_worker_sigkilled_mid_chat_request_completes_elsewhere_exact(worker_sets, tiny_model_dir, tmp_path):
    survivor, _ = worker_sets("emulator")
    launcher = WorkerLauncher("emulator", tmp_path)
    victim = launcher.start("victim", tiny_model_dir, Role.COLOCATED)
    try:
        await asyncio.to_thread(wait_all_healthy, [victim], 240)
        async with running_router(regular=[victim.url, survivor.url],
                                  config=fault_config(chunk_s=30.0)) as (url, app, _):
            async with httpx.AsyncClient(timeout=120) as c:
                call = asyncio.ensure_future(c.post(url + "/v1/chat/completions", json=_chat()))
                st = app[ROUTER]
                await until(lambda: st.inflight.load().get(0), what="the request to reach the victim")
                # Let tokens flow (the dispatcher streams from the worker), then kill it.
                await asyncio.sleep(0.2)
                victim.kill()
                r = await asyncio.wait_for(call, 60)
            assert len(st.inflight) == 0
            assert st.dispatcher.migrations == 1
    finally:
        launcher.stop_all()
    expected = await _reference(survivor.url)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "length"
    assert _usage_triple(answer["usage"]) == _usage_triple(expected["usage"])
