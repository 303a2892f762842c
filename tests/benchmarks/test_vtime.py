"""The virtual-time loop: waits cost nothing, timers keep their order, loopback HTTP works."""
from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from benchmarks.harness import vtime

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def test_long_sleep_is_instant():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - t0

    real = time.perf_counter()
    virtual = vtime.run(main())
    assert abs(virtual - 3600) < 1e-6
    assert time.perf_counter() - real < 1.0


def test_timers_fire_in_order_at_their_time():
    async def main():
        loop = asyncio.get_running_loop()
        seen = []

        async def at(t, name):
            await asyncio.sleep(t)
            seen.append((name, round(loop.time(), 9)))

        await asyncio.gather(at(30, "c"), at(10, "a"), at(20, "b"), at(20.5, "b2"))
        return seen

    assert vtime.run(main()) == [("a", 10), ("b", 20), ("b2", 20.5), ("c", 30)]


def test_wait_for_times_out_in_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 900)
        except asyncio.TimeoutError:
            return loop.time() - t0

    assert abs(vtime.run(main()) - 900) < 1e-6


def test_thread_work_takes_no_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        timer = asyncio.ensure_future(asyncio.sleep(1))
        await asyncio.to_thread(time.sleep, 0.2)  # real work in a thread
        done_early = timer.done()
        await timer
        return loop.time() - t0, done_early

    elapsed, done_early = vtime.run(main())
    assert not done_early  # the clock stood still while the thread ran
    assert abs(elapsed - 1) < 1e-6


def test_http_between_in_process_servers_under_virtual_time():
    """A server that sleeps 60 s per request, called through a second (proxy) server:
    the answer arrives after exactly 60 virtual seconds, in well under a real second."""

    async def main():
        async def slow(request):
            await asyncio.sleep(60)
            return web.json_response({"t": asyncio.get_running_loop().time()})

        async def proxy(request):
            async with request.app[SESSION].get(request.app[UPSTREAM] + "/slow") as r:
                return web.json_response(await r.json())

        backend = web.Application()
        backend.router.add_get("/slow", slow)
        b_runner = web.AppRunner(backend)
        await b_runner.setup()
        b_site = web.TCPSite(b_runner, "127.0.0.1", 0)
        await b_site.start()
        b_port = b_runner.addresses[0][1]

        front = web.Application()
        front[UPSTREAM] = f"http://127.0.0.1:{b_port}"
        front.router.add_get("/p", proxy)
        async with aiohttp.ClientSession() as session:
            front[SESSION] = session
            f_runner = web.AppRunner(front)
            await f_runner.setup()
            await web.TCPSite(f_runner, "127.0.0.1", 0).start()
            f_port = f_runner.addresses[0][1]
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            results = await asyncio.gather(*(session.get(f"http://127.0.0.1:{f_port}/p") for _ in range(20)))
            bodies = [await r.json() for r in results]
            elapsed = loop.time() - t0
            await f_runner.cleanup()
        await b_runner.cleanup()
        return elapsed, bodies

    real = time.perf_counter()
    elapsed, bodies = vtime.run(main())
    assert abs(elapsed - 60) < 1e-3
    assert all(abs(b["t"] - 60) < 1e-3 for b in bodies)
    assert time.perf_counter() - real < 5.0


class _Ticker:
    """A stepper with events every ``period`` s; calls ``on_event`` for every ``notify_every``-th."""

    def __init__(self, loop, period, notify_every, on_event):
        self.loop, self.period, self.notify_every, self.on_event = loop, period, notify_every, on_event
        self.next_at, self.count, self.times = period, 0, []

    def next_time(self):
        return self.next_at

    def step(self):
        self.times.append(self.loop.time())
        self.count += 1
        self.next_at += self.period
        if self.count % self.notify_every == 0:
            self.on_event(self.count)


def test_steppers_run_between_timers_in_time_order_and_wake_the_loop():
    async def main():
        loop = asyncio.get_running_loop()
        seen = []
        event = asyncio.Event()

        def notify(n):
            seen.append(("notify", n, round(loop.time(), 9)))
            event.set()

        ticker = _Ticker(loop, 0.5, 10, notify)
        loop.add_stepper(ticker)

        async def timer(t):
            await asyncio.sleep(t)
            seen.append(("timer", round(loop.time(), 9)))

        task = asyncio.ensure_future(timer(2.25))
        await event.wait()  # the 10th event, at 5.0 s, wakes this coroutine at its own time
        woke_at = loop.time()
        await task
        loop.remove_stepper(ticker)
        await asyncio.sleep(100)  # a removed stepper no longer runs
        return seen, woke_at, ticker, loop.stats

    seen, woke_at, ticker, stats = vtime.run(main())
    assert woke_at == 5.0
    assert seen[0] == ("timer", 2.25) and seen[1] == ("notify", 10, 5.0)
    # every event ran at its own time, in order, without a trip through asyncio each
    assert ticker.times[:10] == [0.5 * i for i in range(1, 11)]
    assert ticker.count == 10 and stats.steps == 10


def test_a_stepper_whose_next_time_moves_says_so_and_runs_at_the_new_time():
    async def main():
        loop = asyncio.get_running_loop()
        ticker = _Ticker(loop, 100.0, 1, lambda n: None)
        loop.add_stepper(ticker)
        await asyncio.sleep(1.0)  # the loop asked once: next event at 100 s
        ticker.next_at = 2.0      # a request arrived: the next event is sooner
        loop.stepper_changed(ticker)
        await asyncio.sleep(5.0)
        loop.remove_stepper(ticker)
        return ticker.times

    times = vtime.run(main())
    assert times == [2.0]  # asked again after the change; stale, it would not run before 100 s
