"""A router started as its own process (``python -m pearl_sglang.router``) in a test."""
from __future__ import annotations

import asyncio
import subprocess

import httpx


async def wait_answering(client: httpx.AsyncClient, url: str, proc: subprocess.Popen,
                         timeout_s: float = 60.0) -> None:
    """Until ``url`` answers 200; fails at once if the process ended (with its stderr)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            if (await client.get(url)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else proc.returncode
        assert loop.time() < deadline, f"{url} did not answer within {timeout_s:.0f}s"
        await asyncio.sleep(0.2)
