"""A worker loads its compiled kernels as it is built, not on its first requests.

Numba loads (or, on a machine's first start, compiles) a kernel on its first call, and a
worker served in a benchmark's process used to do that inside its first burst of
requests: in the placement benchmark the first router measured paid ~0.1 s more wait per
first turn than the rest, whichever router it was. Checked in a fresh process, where
nothing has loaded them yet: after ``build_worker`` and a first request through the HTTP
shell (text and ids, a prefix hit, a stream), no kernel has gained a compiled signature.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import asyncio, json, sys
    import aiohttp
    from numba.core.registry import CPUDispatcher
    from pearl_sglang.emulator import prefix_cache, stretch_draws
    from pearl_sglang.emulator.config import parse_args
    from pearl_sglang.emulator.server import build_worker, start

    def compiled():
        return {f"{m.__name__}.{n}": len(f.signatures) for m in (prefix_cache, stretch_draws)
                for n, f in vars(m).items() if isinstance(f, CPUDispatcher)}

    async def main():
        before_build = compiled()
        args, _ = parse_args(["--host", "127.0.0.1", "--port", "0", "--time-scale", "50"])
        worker = build_worker(args)
        built = compiled()
        runner, extra, port, _ = await start(worker, host="127.0.0.1", port=0)
        url = f"http://127.0.0.1:{port}/generate"
        async with aiohttp.ClientSession() as s:
            for body in ({"text": "warm start " * 40, "sampling_params": {"max_new_tokens": 8}},
                         {"text": "warm start " * 40, "stream": True, "sampling_params": {"max_new_tokens": 8}},
                         {"input_ids": list(range(300, 700)), "sampling_params": {"max_new_tokens": 8}}):
                async with s.post(url, json=body) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
        served = compiled()
        for r in extra:
            await r.cleanup()
        await runner.cleanup()
        print(json.dumps({"before_build": before_build, "built": built, "served": served}))

    asyncio.run(main())
""")


def test_a_built_worker_has_loaded_every_kernel_its_requests_use():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert sum(got["before_build"].values()) == 0  # a fresh process: nothing loaded yet
    assert sum(got["built"].values()) > 0
    newly = {k: v for k, v in got["served"].items() if v != got["built"][k]}
    assert newly == {}, f"first requests loaded kernels the build had not: {newly}"
