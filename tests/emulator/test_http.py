"""The HTTP shell against real in-process aiohttp servers (SGLang 0.5.23 protocol)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

pytestmark = pytest.mark.asyncio
FAST = ("--time-scale", "20", "--disable-radix-cache")


async def sse(resp: aiohttp.ClientResponse) -> list:
    out = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_generate_single_batch_stream(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), *FAST) as (url, _):
        body = {"text": "The quick brown fox", "rid": "r1",
                "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        async with session.post(f"{url}/generate", json=body) as r:
            assert r.status == 200
            one = await r.json()
        meta = one["meta_info"]
        assert meta["id"] == "r1" and meta["finish_reason"] == {"type": "length", "length": 8}
        assert len(one["output_ids"]) == 8 and meta["completion_tokens"] == 8
        assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 8}]
        assert isinstance(one["text"], str) and "e2e_latency" in meta
        batch = {"input_ids": [[5, 6, 7], [8, 9]], "rid": "b",
                 "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
        async with session.post(f"{url}/generate", json=batch) as r:
            items = await r.json()
        assert [i["meta_info"]["id"] for i in items] == ["b_0", "b_1"]
    # The engine keeps to its clock while the event loop is blocked, and the chunks due
    # meanwhile go out as one: loading the compiled page cache (~0.3-0.7 s) on a first
    # request could be the whole run, so a worker loads it as it is built
    # (test_warm_start.py). Slowed down (30 decode steps over ~0.6 s) for a loaded host.
    async with emu("--model-path", str(model_dir), "--time-scale", "0.1") as (url, _):
        body = {"text": "The quick brown fox", "rid": "s1", "stream": True,
                "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}}
        async with session.post(f"{url}/generate", json=body) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            chunks = await sse(r)
        assert chunks[-1] == "[DONE]"
        data = chunks[:-1]
        lengths = [len(c["output_ids"]) for c in data]
        assert len(data) >= 3 and lengths == sorted(set(lengths)) and lengths[-1] == 30
        final = data[-1]
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
        assert final["output_ids"][:8] == one["output_ids"]  # same tokens as non-streaming
        assert all(final["output_ids"][: len(c["output_ids"])] == c["output_ids"] for c in data)
        assert all(c["meta_info"]["finish_reason"] is None for c in data[:-1])
        assert "e2e_latency" in final["meta_info"] and "e2e_latency" not in data[0]["meta_info"]


async def test_validation_errors(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), *FAST) as (url, _):
        async with session.post(f"{url}/generate", json={"text": "x", "sampling_params": {"foo": 1}}) as r:
            assert r.status == 400
            assert "unknown field `foo`" in (await r.json())["error"]
        async with session.post(f"{url}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 8.0}}) as r:
            assert r.status == 400 and isinstance((await r.json())["error"], str)
        async with session.post(f"{url}/generate", json={"sampling_params": {}}) as r:
            assert r.status == 400 and "message" in (await r.json())["error"]
        async with session.post(f"{url}/generate", json={"text": "x", "sampling_params": {"temperature": 0}}) as r:
            assert r.status == 200
        async with session.get(f"{url}/get_load") as r:
            assert r.status == 404  # not in 0.5.23
        # Found by the malformed-request fuzz: these crashed the handler (a 500, or a
        # stream cut after its first bytes) instead of a 400 before anything started.
        for bad in ({"text": "x", "return_logprob": []}, {"text": ["a", "b"], "return_logprob": [True]}):
            async with session.post(f"{url}/generate", json=bad) as r:
                assert r.status == 400 and "one entry per request" in (await r.json())["error"]["message"]
        bad = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True, "stream_options": "x"}
        async with session.post(f"{url}/v1/chat/completions", json=bad) as r:
            assert r.status == 400 and "stream_options" in (await r.json())["error"]["message"]


async def test_openai_endpoints(model_dir, emu) -> None:
    import openai
    async with emu("--model-path", str(model_dir), *FAST) as (url, _):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
        comp = await client.completions.create(model="m", prompt="Paris is", max_tokens=6,
                                               extra_body={"ignore_eos": True})
        assert comp.choices[0].finish_reason == "length" and comp.usage.completion_tokens == 6
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5,
            extra_body={"ignore_eos": True})
        assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
        assert chat.usage.completion_tokens == 5
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        pieces = [c async for c in stream]
        assert pieces[-1].usage.completion_tokens == 5
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
        assert text == chat.choices[0].message.content
        await client.close()


async def test_abort_by_item_rid_keeps_partial_output(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), "--time-scale", "1") as (url, _):
        body = {"input_ids": [[11, 12, 13], [14, 15]], "rid": "job",
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
        task = asyncio.ensure_future(session.post(f"{url}/generate", json=body))
        await asyncio.sleep(0.2)
        for rid in ("job_0", "job_1"):
            async with session.post(f"{url}/abort_request", json={"rid": rid}) as r:
                assert r.status == 200
        resp = await task
        items = await resp.json()
        assert resp.status == 200
        for it in items:
            fr = it["meta_info"]["finish_reason"]
            assert fr["type"] == "abort" and fr["message"] == "Aborted"
            assert 0 < len(it["output_ids"]) < 3000


async def test_pause_modes_health_and_continue(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), "--time-scale", "50",
                        "--health-timeout", "5") as (url, _):
        async with session.post(f"{url}/pause_generation", json={"mode": "in_place"}) as r:
            assert await r.json() == {"message": "Generation paused successfully.", "status": "ok"}
        async with session.get(f"{url}/health") as r:
            assert r.status == 503  # waited the (scaled) health timeout
        task = asyncio.ensure_future(session.post(
            f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 3}}))
        await asyncio.sleep(0.1)
        assert not task.done()
        async with session.post(f"{url}/continue_generation", json={}) as r:
            assert (await r.json())["message"] == "Generation continued successfully."
        assert (await (await task).json())["meta_info"]["completion_tokens"] <= 3
        async with session.get(f"{url}/health") as r:
            assert r.status == 200


async def test_memory_release_resume_and_weight_sync(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), "--enable-memory-saver", *FAST) as (url, _):
        gen = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
        async with session.post(f"{url}/generate", json=gen) as r:
            ref = (await r.json())["output_ids"]
        async with session.post(f"{url}/release_memory_occupation", json={}) as r:
            assert r.status == 200 and await r.json() is None
        async with session.get(f"{url}/health") as r:
            assert r.status == 503
        async with session.post(f"{url}/generate", json=gen) as r:
            assert r.status == 503
        async with session.post(f"{url}/resume_memory_occupation", json={"tags": None}) as r:
            assert r.status == 200
        async with session.post(f"{url}/resume_memory_occupation", json={"tags": ["weights"]}) as r:
            assert r.status == 400 and "message" in (await r.json())["error"]
        async with session.post(f"{url}/generate", json=gen) as r:
            assert (await r.json())["output_ids"] != ref  # garbage until weights are synced
        async with session.post(f"{url}/update_weights_from_disk",
                                json={"model_path": str(model_dir), "weight_version": "v1"}) as r:
            res = await r.json()
            assert r.status == 200 and res["success"] and "num_paused_requests" in res
        async with session.get(f"{url}/model_info") as r:
            assert (await r.json())["weight_version"] == "v1"
        async with session.post(f"{url}/update_weights_from_disk",
                                json={"model_path": "/nonexistent", "weight_version": "v9"}) as r:
            assert r.status == 400 and not (await r.json())["success"]
        async with session.post(f"{url}/update_weight_version", json={"new_version": "default"}) as r:
            assert (await r.json()) == {"success": True, "message": "Weight version updated to default",
                                        "new_version": "default"}
        async with session.post(f"{url}/generate", json=gen) as r:
            out = await r.json()
        assert out["output_ids"] == ref and out["meta_info"]["weight_version"] == "default"


async def test_distributed_update_protocol(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), *FAST) as (url, _):
        upd = {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[1]], "weight_version": "v2"}
        async with session.post(f"{url}/update_weights_from_distributed", json=upd) as r:
            assert r.status == 400
        for bad in ({"rank_offset": 0, "world_size": 2}, {"rank_offset": 2, "world_size": 2}, {"world_size": 2}):
            async with session.post(f"{url}/init_weights_update_group", json={
                    "master_address": "127.0.0.1", "master_port": 1, **bad}) as r:
                assert r.status == 400 and not (await r.json())["success"], bad
        async with session.post(f"{url}/init_weights_update_group", json={
                "master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
                "group_name": "weight_update_group", "backend": "gloo"}) as r:
            assert (await r.json())["success"]
        async with session.post(f"{url}/update_weights_from_distributed", json=upd) as r:
            assert r.status == 400  # outside begin/end
        await session.post(f"{url}/begin_weight_update", json={})
        async with session.post(f"{url}/update_weights_from_distributed", json={**upd, "dtypes": []}) as r:
            assert r.status == 400  # names, dtypes and shapes must line up
        async with session.post(f"{url}/update_weights_from_distributed", json=upd) as r:
            assert r.status == 200 and (await r.json())["success"]
        await session.post(f"{url}/end_weight_update", json={})
        async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": "a", "max_tokens": 2}) as r:
            assert (await r.json())["metadata"] == {"weight_version": "v2",
                                                    "weight_versions": [{"version": "v2", "start": 0, "end": 2}]}


async def test_info_loads_metrics_flush(model_dir, session, emu) -> None:
    async with emu("--model-path", str(model_dir), "--tp-size", "2", *FAST) as (url, w):
        async with session.get(f"{url}/model_info") as r:
            info = await r.json()
        assert info["disaggregation_mode"] == "null" and info["architectures"] == ["Qwen2ForCausalLM"]
        async with session.get(f"{url}/get_server_info") as r:
            si = await r.json()
        assert si["tp_size"] == 2 and si["version"] == "0.5.23" and si["max_total_num_tokens"] == 16384
        await session.post(f"{url}/generate", json={"text": "abc", "sampling_params": {"max_new_tokens": 4}})
        async with session.get(f"{url}/v1/loads?include=core,disagg") as r:
            load = (await r.json())["loads"][0]
        assert load["num_total_tokens"] == 16384 and load["disaggregation"]["mode"] == "null"
        assert "queues" not in load
        async with session.get(f"{url}/metrics") as r:
            text = await r.text()
        assert "sglang:generation_tokens_total" in text and "sglang:num_running_reqs" in text
        async with session.post(f"{url}/flush_cache") as r:
            assert r.status == 200 and (await r.text()).startswith("Cache flushed.")
