"""The client soak's quick variant: slow peers past the descriptor limit do not stop
normal requests, and two never-reading streams leave the router's memory flat."""
from __future__ import annotations

import pytest

from benchmarks.soak_clients import run


@pytest.mark.timeout(300)
async def test_quick_client_soak():
    soak = await run(nofile=256, slow=300, normal=40, tokens=2000, time_scale=50)
    assert soak.normal_completed == 40 and soak.normal_failed == 0, soak
    # More slow peers than descriptors: the router refused the excess with a 503 (or they
    # were closed) instead of running out of descriptors.
    assert soak.slow_refused_503 + soak.slow_closed_by_router >= 300 - 256, soak
    assert soak.router_rss_growth_mb < 50, soak
