"""A stream that does not want every chunk (``every_chunk=False``: the router's client waits
for the end): the engine keeps each chunk's progress instead of waking the stream, and a
stream that breaks still hands over what the last chunk would have held."""
from __future__ import annotations

import asyncio

import pytest

from benchmarks.harness import vtime
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from benchmarks.harness.in_process_transport import InProcessTransport
from pearl_sglang.control.cluster_config import EngineConfig
from pearl_sglang.control.launchers import LaunchSpec
from pearl_sglang.core.state import Role
from pearl_sglang.workers.errors import WorkerUnavailable


async def _stream_broken_at(model_dir, stop_at_s: float, *, every_chunk: bool) -> tuple[list[dict], int]:
    """The chunks a stream yields before its worker stops at ``stop_at_s`` (virtual), and
    the engine events the loop ran."""
    launcher = InProcessEmulatorLauncher(EngineConfig(
        model_path=str(model_dir), emulator={"profile": "tiny", "time_scale": 1, "cold_start": 0}))
    launched = await launcher.launch(LaunchSpec(slot=3, gpus=("d0:0",), role=Role.COLOCATED))
    direct = InProcessTransport(launcher.worker_at)
    body = {"input_ids": list(range(300, 340)), "rid": "long", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "stream_interval": 16}}
    got: list[dict] = []

    async def consume() -> None:
        async for chunk in direct.stream_generate(slot=3, url=launched.endpoint, body=body, every_chunk=every_chunk):
            got.append(chunk)

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(consume())
    await asyncio.sleep(stop_at_s - loop.time())
    await launcher.stop(3)
    with pytest.raises(WorkerUnavailable, match="worker stopped"):
        await task
    await launcher.stop_all()
    return got, loop.stats.steps


@pytest.mark.parametrize("stop_at_s", [3.0, 7.77])
def test_a_broken_stream_keeps_what_its_last_chunk_would_have(model_dir, stop_at_s):
    every, every_steps = vtime.run(_stream_broken_at(model_dir, stop_at_s, every_chunk=True))
    kept, kept_steps = vtime.run(_stream_broken_at(model_dir, stop_at_s, every_chunk=False))
    assert len(every) >= 6                          # many chunk marks passed before the stop
    assert len(kept) == 2                           # the first chunk, then the latest progress
    assert kept[0] == every[0] and kept[-1] == every[-1]
    last = kept[-1]
    n = last["meta_info"]["completion_tokens"]
    assert n == len(last["output_ids"]) == len(last["meta_info"]["output_token_logprobs"]) and n % 16 == 0
    assert kept_steps < every_steps                 # no wake-up per chunk: the decode ran on in stretches
