"""Where a cell's requests went: each worker's own counters, read from its ``/metrics``.

SGLang (and the emulator, in the same names) counts the requests it served and the prompt
tokens it took and found cached (``sglang:num_requests_total``, ``sglang:prompt_tokens_total``,
``sglang:cached_tokens_total``). Read before and after a cell, they say how the router
spread the requests over the workers and how much of the prompts the workers' prefix
caches held: the parts behind a worker's CPU share and a router's throughput.
"""
from __future__ import annotations

import asyncio
from typing import Mapping, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pearl_sglang.router.utilization import busiest_over_mean

COUNTERS = {"sglang:num_requests_total": "requests", "sglang:prompt_tokens_total": "prompt_tokens",
            "sglang:cached_tokens_total": "cached_tokens"}


def parse_counters(text: str) -> dict[str, float]:
    """The counters above from a Prometheus text exposition, summed over label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = COUNTERS.get(sample.name)
            if field is not None:
                out[field] = out.get(field, 0.0) + sample.value
    return out


async def read_counters(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[dict[str, float] | None]:
    """Each worker's counters now (None for one that did not answer)."""
    async def one(url: str) -> dict[str, float] | None:
        try:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return parse_counters(await resp.text()) if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
    return list(await asyncio.gather(*(one(u) for u in urls)))


def spread(before: Sequence[Mapping[str, float] | None],
           after: Sequence[Mapping[str, float] | None]) -> dict[str, float | list[float]]:
    """Between two readings: the busiest worker's requests over the workers' mean (1.00:
    spread evenly), each worker's share of them, and the share of prompt tokens found in
    the workers' caches. Empty where a worker could not be read or none was served."""
    if not before or len(before) != len(after) or any(c is None for c in (*before, *after)):
        return {}

    def delta(field: str) -> list[float]:
        return [a.get(field, 0.0) - b.get(field, 0.0) for b, a in zip(before, after)]  # type: ignore[union-attr]

    served = delta("requests")
    busiest = busiest_over_mean(served)
    if busiest is None:
        return {}
    out: dict[str, float | list[float]] = {"workers_requests_busiest_over_mean": busiest,
                                           "workers_request_shares": [s / sum(served) for s in served]}
    prompt = sum(delta("prompt_tokens"))
    if prompt > 0:
        out["workers_cache_hit_share"] = sum(delta("cached_tokens")) / prompt
    return out
