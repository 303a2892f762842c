"""Where a benchmark cell's requests went, from the workers' own ``/metrics``."""
from __future__ import annotations

import aiohttp
import pytest

from benchmarks.harness.worker_counters import parse_counters, read_counters, spread
from benchmarks.router_agentic import Workload, closed_loop, request_body
from tests.support.emulated import emulators


def test_counters_are_summed_over_label_sets_and_other_series_are_left_out():
    text = "\n".join([
        "# TYPE sglang:num_requests counter",
        'sglang:num_requests_total{model_name="m",engine_type="prefill"} 3.0',
        'sglang:num_requests_total{model_name="m",engine_type="decode"} 4.0',
        'sglang:num_requests_created{model_name="m",engine_type="decode"} 1.7e9',
        "# TYPE sglang:cached_tokens counter",
        'sglang:cached_tokens_total{model_name="m",engine_type="decode"} 64.0',
        "# TYPE sglang:token_usage gauge",
        'sglang:token_usage{model_name="m",engine_type="decode"} 0.5', ""])
    assert parse_counters(text) == {"requests": 7.0, "cached_tokens": 64.0}


def test_spread_is_the_busiest_workers_requests_over_the_mean_and_the_cached_share():
    before = [{"requests": 10, "prompt_tokens": 100, "cached_tokens": 0},
              {"requests": 5, "prompt_tokens": 50, "cached_tokens": 0}]
    after = [{"requests": 40, "prompt_tokens": 400, "cached_tokens": 200},
             {"requests": 15, "prompt_tokens": 150, "cached_tokens": 0}]
    got = spread(before, after)
    assert got["workers_requests_busiest_over_mean"] == pytest.approx(30 / 20)
    assert got["workers_request_shares"] == pytest.approx([0.75, 0.25])
    assert got["workers_cache_hit_share"] == pytest.approx(200 / 400)
    assert spread(before, [after[0], None]) == {}  # a worker not read: nothing claimed
    assert spread(before, before) == {}  # nothing served


async def test_a_closed_loop_cell_says_where_its_requests_went_on_real_workers():
    """Two emulated workers, the loop taking them in turn: each counts half of the
    requests, and a prompt sent again is found in the cache."""
    async with emulators(2, "--time-scale", "50") as ws, aiohttp.ClientSession() as session:
        urls = [u for u, _ in ws]
        prompt = list(range(3, 3 + 256))
        w = Workload("t", "nonstream", ((request_body(prompt, False, 4),),), trajectory=False)
        assert [c is not None for c in await read_counters(session, urls)] == [True, True]
        cell = await closed_loop(session, urls, w, 2, max_requests=40, max_s=30, expect={}, max_new=4,
                                 worker_urls=urls)
        assert cell["n"] == 40
        assert cell["workers_request_shares"] == pytest.approx([0.5, 0.5])
        assert cell["workers_requests_busiest_over_mean"] == pytest.approx(1.0)
        assert 0.5 < cell["workers_cache_hit_share"] < 1.0  # all but each worker's first prefill
        missing = await read_counters(session, [urls[0], "http://127.0.0.1:9"])
        assert missing[1] is None
