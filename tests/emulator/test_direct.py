"""The in-process worker transport against the HTTP one, on the same emulated workers."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from benchmarks.harness.in_process_transport import InProcessTransport
from pearl_sglang.control.cluster_config import EngineConfig
from pearl_sglang import fastjson
from pearl_sglang.control.launchers import LaunchSpec
from pearl_sglang.core.state import Role
from pearl_sglang.router.encoded_ids import EncodedIds
from pearl_sglang.workers.client import Timeouts, WorkerClient
from pearl_sglang.workers.errors import WorkerFailed, WorkerRejected, WorkerUnavailable

pytestmark = pytest.mark.asyncio
FAST = ("--time-scale", "20", "--disable-radix-cache")


def _comparable(chunk: dict) -> dict:
    """A chunk without what depends on when it was made."""
    meta = {k: v for k, v in chunk["meta_info"].items() if k not in ("id", "e2e_latency")}
    return {**chunk, "meta_info": meta}


async def _chunks(transport, url: str, body: dict) -> list[dict]:
    return [c async for c in transport.stream_generate(slot=0, url=url, body=body)]


async def test_streams_and_one_document_answers_match_http(model_dir, emu) -> None:
    async with emu("--model-path", str(model_dir), *FAST) as (url, worker), aiohttp.ClientSession() as session:
        http, direct = WorkerClient(session, Timeouts()), InProcessTransport({url: worker}.get)
        body = {"input_ids": list(range(300, 340)),
                "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "stream_interval": 8}}
        over_http = await _chunks(http, url, {**body, "rid": "h"})
        in_process = await _chunks(direct, url, {**body, "rid": "d"})
        # How many tokens a chunk holds depends on when the engine ran (real time here);
        # what each holds does not.
        final = in_process[-1]
        assert _comparable(final) == _comparable(over_http[-1])
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
        sizes = [len(c["output_ids"]) for c in in_process]
        assert len(sizes) >= 2 and all(b - a >= 8 for a, b in zip(sizes, sizes[1:-1]))
        for chunk in in_process:
            n = len(chunk["output_ids"])
            assert chunk["output_ids"] == final["output_ids"][:n] and chunk["meta_info"]["completion_tokens"] == n
        # The non-streaming call a PD prefill gets: the final chunk as one document.
        one = await direct.post_json(slot=0, url=url, path="/generate", body={**body, "rid": "p"})
        assert _comparable(one) == _comparable(over_http[-1])
        assert not worker.direct_runs and not worker.engine.sched.running


async def test_ids_the_router_kept_as_text_answer_as_a_list_does(model_dir, emu) -> None:
    """The router hands over a checked prompt as ``EncodedIds``; the engine hashes its
    uint64 array instead of a tuple of ints, and answers token for token the same,
    prompt ids and input logprobs included. A second turn extending the first hits the
    same cached prefix either way."""
    async with emu("--model-path", str(model_dir), "--time-scale", "20") as (url, worker):
        direct = InProcessTransport({url: worker}.get)
        sp = {"max_new_tokens": 12, "ignore_eos": True}
        answers = {}
        for form in ("list", "text"):
            assert worker.engine.flush_cache()
            for turn, prompt in enumerate((list(range(300, 500)), list(range(300, 600)))):
                ids = prompt if form == "list" else EncodedIds(fastjson.dumps(prompt)[1:-1])
                body = {"input_ids": ids, "rid": f"{form}{turn}", "sampling_params": sp,
                        "return_logprob": True, "return_prompt_token_ids": True}
                answers[form, turn] = _comparable(await direct.post_json(slot=0, url=url, path="/generate",
                                                                         body=body))
        for turn in (0, 1):
            assert answers["text", turn] == answers["list", turn]
        assert answers["text", 1]["prompt_token_ids"] == list(range(300, 600))
        assert answers["text", 1]["meta_info"]["cached_tokens"] > 0


async def test_bad_input_is_the_same_rejection(model_dir, emu) -> None:
    async with emu("--model-path", str(model_dir), *FAST) as (url, worker), aiohttp.ClientSession() as session:
        http, direct = WorkerClient(session, Timeouts()), InProcessTransport({url: worker}.get)
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4, "bogus": 1}}
        rejections = []
        for transport in (http, direct):
            with pytest.raises(WorkerRejected) as e:
                await _chunks(transport, url, body)
            rejections.append((e.value.status, json.loads(e.value.body)))
        assert rejections[0] == rejections[1] and rejections[0][0] == 400
        assert "unknown field `bogus`" in rejections[1][1]["error"]
        with pytest.raises(ValueError, match="/generate only"):
            await direct.post_json(slot=0, url=url, path="/flush_cache", body=None)
        with pytest.raises(WorkerUnavailable):
            await _chunks(direct, "http://127.0.0.1:1", body)


async def test_a_stopped_worker_breaks_its_streams_and_aborts_them(model_dir) -> None:
    launcher = InProcessEmulatorLauncher(EngineConfig(
        model_path=str(model_dir), emulator={"profile": "tiny", "time_scale": 1, "cold_start": 0}))
    launched = await launcher.launch(LaunchSpec(slot=3, gpus=("d0:0",), role=Role.COLOCATED))
    worker = launcher.worker(3)
    direct = InProcessTransport(launcher.worker_at)
    body = {"input_ids": list(range(300, 340)), "rid": "long",
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "stream_interval": 4}}
    got: list[dict] = []

    async def consume() -> None:
        async for chunk in direct.stream_generate(slot=3, url=launched.endpoint, body=body):
            got.append(chunk)
            if len(got) == 2:
                stopping.set()

    stopping = asyncio.Event()
    task = asyncio.ensure_future(consume())
    try:
        await asyncio.wait_for(stopping.wait(), 30)
        await launcher.stop(3)
        with pytest.raises(WorkerUnavailable, match="worker stopped"):
            await asyncio.wait_for(task, 30)
    finally:
        task.cancel()
        await launcher.stop_all()
    assert len(got[-1]["output_ids"]) >= 8          # the partial output the router keeps
    assert launcher.worker_at(launched.endpoint) is None and not worker.direct_runs
    assert not worker.engine.sched.running           # the request was aborted, not left running
    assert await direct.abort(url=launched.endpoint, rid="long") is False


async def test_in_process_pd_hands_the_kv_over_and_a_stopped_prefill_is_unreachable(model_dir) -> None:
    """The harness's in-process KV handoff (``in_process_pd``): a decode gets its prefill's
    KV through the registry, and once the prefill stops its address is gone, so a decode
    that names it fails at once, as over HTTP, instead of waiting on an engine nobody steps."""
    launcher = InProcessEmulatorLauncher(EngineConfig(
        model_path=str(model_dir), emulator={"profile": "tiny", "time_scale": 20, "cold_start": 0}),
        in_process_pd=True)
    prefill = await launcher.launch(LaunchSpec(slot=0, gpus=("d0:0",), role=Role.PREFILL))
    decode = await launcher.launch(LaunchSpec(slot=1, gpus=("d0:1",), role=Role.DECODE))
    direct = InProcessTransport(launcher.worker_at)

    def body(room: int) -> dict:
        return {"input_ids": list(range(300, 340)), "bootstrap_host": "127.0.0.1",
                "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": room,
                "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}

    try:
        _, answer = await asyncio.wait_for(asyncio.gather(
            direct.post_json(slot=0, url=prefill.endpoint, path="/generate", body=body(1)),
            direct.post_json(slot=1, url=decode.endpoint, path="/generate", body=body(1))), 30)
        assert len(answer["output_ids"]) == 16 and answer["meta_info"]["finish_reason"]["type"] == "length"
        await launcher.stop(0)
        with pytest.raises(WorkerFailed, match="unreachable"):
            await asyncio.wait_for(direct.post_json(slot=1, url=decode.endpoint, path="/generate", body=body(2)), 30)
    finally:
        await launcher.stop_all()
