"""The chaos soak's quick variant: a SIGKILLed and a SIGSTOPped worker under mixed
/generate and OpenAI load lose no accepted request, and sampled answers are token-exact."""
from __future__ import annotations

import pytest

from benchmarks.soak_chaos import run


@pytest.mark.timeout(300)
async def test_quick_chaos_soak():
    chaos = await run(requests=60, tokens=100, time_scale=20)
    assert chaos.requests == 60 and chaos.lost == 0, chaos
    assert chaos.checked_exact > 0 and chaos.mismatched == 0, chaos
    assert chaos.router_worker_failures > 0, chaos  # the faults did reach the router
