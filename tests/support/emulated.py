"""Emulated SGLang workers run inside the test's event loop (real HTTP on loopback)."""
from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager
from typing import AsyncIterator

from pearl_sglang.emulator.config import parse_args
from pearl_sglang.emulator.server import build_worker, start


@asynccontextmanager
async def emulator(*flags: str, bootstrap_port: int | None = None) -> AsyncIterator[tuple[str, object]]:
    """Run an emulated worker in this event loop; yields (base_url, worker)."""
    argv = ["--host", "127.0.0.1", "--port", "0", *flags]
    if bootstrap_port is not None:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    args, _ = parse_args(argv)
    worker = build_worker(args)
    runner, extra, port, _ = await start(worker, host="127.0.0.1", port=0)
    try:
        yield f"http://127.0.0.1:{port}", worker
    finally:
        for r in extra:
            await r.cleanup()
        await runner.cleanup()


@asynccontextmanager
async def emulators(count: int, *flags: str) -> AsyncIterator[list[tuple[str, object]]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(emulator(*flags)) for _ in range(count)]
