"""The router loads its compiled kernels as it starts, not on its first requests.

Checked in a fresh process, where nothing has loaded them yet: after the router has
started and served a first round of turns of every kind that reaches a kernel (compact
and spaced ``input_ids``, text, a trajectory's next turn extending its key, a stream),
no kernel of ``router/`` has gained a compiled signature. (The emulator's own check:
``tests/emulator/test_warm_start.py``.)
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import asyncio, json
    import aiohttp
    from numba.core.registry import CPUDispatcher
    from pearl_sglang.router import block_keys, encoded_ids, prefix_map
    from tests.router.conftest import running_router
    from tests.support.emulated import emulator

    def compiled():
        return {f"{m.__name__}.{n}": len(f.signatures) for m in (block_keys, encoded_ids, prefix_map)
                for n, f in vars(m).items() if isinstance(f, CPUDispatcher)}

    async def main():
        before = compiled()
        async with emulator("--time-scale", "50") as (worker, _), running_router(regular=[worker]) as (url, _, _):
            started = compiled()
            ids = list(range(300, 700))
            turns = [
                (json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 4}},
                            separators=(",", ":")), {"X-Pearl-Trajectory-Id": "t"}),
                (json.dumps({"input_ids": ids + list(range(700, 900)), "stream": True,
                             "sampling_params": {"max_new_tokens": 4}}), {"X-Pearl-Trajectory-Id": "t"}),
                (json.dumps({"text": "warm start " * 200, "sampling_params": {"max_new_tokens": 4}}), {}),
            ]
            async with aiohttp.ClientSession() as s:
                for body, headers in turns:
                    async with s.post(url + "/generate", data=body,
                                      headers={"Content-Type": "application/json", **headers}) as r:
                        assert r.status == 200, await r.text()
                        await r.read()
            await asyncio.sleep(0.1)  # the turns' bookkeeping (the loop's next turn) has run
            served = compiled()
        print(json.dumps({"before": before, "started": started, "served": served}))

    asyncio.run(main())
""")


def test_a_started_router_has_loaded_every_kernel_its_turns_use():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert sum(got["before"].values()) == 0  # a fresh process: nothing loaded yet
    assert sum(got["started"].values()) > 0
    newly = {k: v for k, v in got["served"].items() if v != got["started"][k]}
    assert newly == {}, f"first turns loaded kernels the start had not: {newly}"
