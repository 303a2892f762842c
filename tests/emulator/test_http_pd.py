"""PD over HTTP: an emulated prefill and decode rendezvous through the bootstrap port;
role switch over HTTP; the CLI as a launcher would run it."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import pytest

from pearl_sglang.emulator.config import parse_args

PD = ("--disaggregation-transfer-backend", "mooncake", "--enable-pd-role-switch",
      "--time-scale", "20", "--disable-radix-cache")


async def pd_generate(session, p_url, d_url, bport, room, rid, n=6):
    body = {"input_ids": list(range(40, 90)), "rid": rid, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bport, "bootstrap_room": room,
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
    pr, dr = await asyncio.gather(session.post(f"{p_url}/generate", json=body),
                                  session.post(f"{d_url}/generate", json=body))
    return (pr.status, await pr.json()), (dr.status, await dr.json())


@pytest.mark.asyncio
async def test_pd_rendezvous_and_role_switch(model_dir, session, emu, port_factory) -> None:
    bp, bd = port_factory(), port_factory()
    model = ("--model-path", str(model_dir))
    async with emu(*model, *PD, "--disaggregation-mode", "prefill", bootstrap_port=bp) as (p_url, _), \
            emu(*model, *PD, "--disaggregation-mode", "decode", bootstrap_port=bd) as (d_url, _), \
            emu(*model, "--time-scale", "20") as (c_url, _):
        async with session.get(f"http://127.0.0.1:{bp}/health") as r:
            assert r.status == 200
        (ps, pj), (ds, dj) = await pd_generate(session, p_url, d_url, bp, 123, "pd1")
        assert ps == ds == 200
        assert len(pj["output_ids"]) == 1 and pj["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert dj["output_ids"][0] == pj["output_ids"][0] and len(dj["output_ids"]) == 6
        async with session.post(f"{c_url}/generate", json={
                "input_ids": list(range(40, 90)), "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}) as r:
            assert (await r.json())["output_ids"] == dj["output_ids"]
        async with session.post(f"{d_url}/generate", json={"input_ids": [1, 2]}) as r:
            assert r.status == 400
            assert "without bootstrap room" in (await r.json())["error"]["message"]
        # swap roles: decode needs decode_cuda_graph_memory_gb when it never captured graphs
        async with session.post(f"{p_url}/pd_role_switch", json={"new_role": "decode"}) as r:
            assert r.status == 400 and not (await r.json())["success"]
        async with session.post(f"{p_url}/pd_role_switch",
                                json={"new_role": "decode", "decode_cuda_graph_memory_gb": 0}) as r:
            res = await r.json()
            assert r.status == 200 and res["success"] and res["old_role"] == "prefill"
        async with session.post(f"{d_url}/pd_role_switch", json={"new_role": "prefill"}) as r:
            assert (await r.json())["new_role"] == "prefill"
        async with session.get(f"{p_url}/model_info") as r:
            assert (await r.json())["disaggregation_mode"] == "decode"
        async with session.get(f"{p_url}/server_info") as r:
            assert (await r.json())["disaggregation_mode"] == "prefill"  # launch role
        (ps, pj), (ds, dj2) = await pd_generate(session, d_url, p_url, bd, 7, "pd2")
        assert ps == ds == 200 and dj2["output_ids"] == dj["output_ids"]


def test_cli_accepts_sglang_flags() -> None:
    args, unknown = parse_args([
        "--model-path", "/m", "--device", "cpu", "--load-format", "dummy", "--host", "127.0.0.1",
        "--port", "1234", "--max-total-tokens", "16384", "--sleep-on-idle",
        "--disable-overlap-schedule", "--disable-radix-cache", "--dtype", "float32",
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-bootstrap-port", "8999", "--disaggregation-decode-retraction-backup",
        "cpu_tensor", "--enable-pd-role-switch", "--tp-size", "2", "--enable-memory-saver",
        "--weight-version", "v0", "--profile", "qwen3-8b-h800-tp2", "--time-scale", "50",
        "--seed", "3", "--brand-new-flag", "x"])
    assert unknown == ["--brand-new-flag", "x"]
    assert (args.disaggregation_mode, args.tp_size, args.max_total_tokens) == ("decode", 2, 16384)
    assert args.disable_radix_cache and args.enable_pd_role_switch and args.load_format == "dummy"
    cfg = args.engine_config(vocab_size=None, eos_token_id=None, special_ids=frozenset(),
                             context_length=None)
    assert cfg.max_total_tokens == 16384 and not cfg.prefix_cache and cfg.seed == 3


@pytest.mark.asyncio
async def test_module_entry_point_serves(model_dir, port_factory) -> None:
    port = port_factory()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pearl_sglang.emulator", "--model-path", str(model_dir), "--host",
         "127.0.0.1", "--port", str(port), "--device", "cpu", "--sleep-on-idle", "--unknown-x"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None
                await asyncio.sleep(0.2)
            async with s.post(f"http://127.0.0.1:{port}/generate",
                              json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}) as r:
                assert r.status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and b"--unknown-x" in err
