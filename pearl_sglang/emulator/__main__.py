"""``python -m pearl_sglang.emulator``: an emulated worker with SGLang's command line."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Optional

from .config import parse_args
from .server import build_worker, start

log = logging.getLogger("pearl_sglang.emulator")


async def _serve(argv: Optional[list[str]]) -> None:
    args, unknown = parse_args(argv)
    if unknown:
        log.warning("ignoring unsupported sglang flags: %s", " ".join(unknown))
    worker = build_worker(args)
    cold = worker.profile.lifecycle.cold_start_s if args.cold_start is None else args.cold_start
    if cold > 0:
        log.info("emulating a %.1f s cold start (%.2f s real)", cold, worker.clock.real_delay(cold))
        await asyncio.sleep(worker.clock.real_delay(cold))
    runner, extra, port, bport = await start(worker, host=args.host, port=args.port)
    log.info("emulated SGLang worker (%s, profile %s, x%g) on http://%s:%d%s",
             args.disaggregation_mode, worker.profile.name, args.time_scale, args.host, port,
             f", bootstrap :{bport}" if bport else "")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for r in extra:
        await r.cleanup()
    await runner.cleanup()


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s %(message)s")
    try:
        asyncio.run(_serve(argv))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the address is in use, not this host's, or does not resolve
        print(f"error: cannot listen: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during the cold start, before the signal handlers
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
