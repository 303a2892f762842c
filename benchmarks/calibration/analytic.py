"""Closed-form facts of a workload, for the calibration to solve before it spends replays.

Two of the paper's facts follow from the workload alone, near enough to solve for a
parameter by bisection: the mean trajectory with unlimited GPUs (``floor.mean_alone_s``)
and Figure 2(b)'s prefill share of tokens.  The replays then measure both again, with
contention and placement, and the fit is judged on the measured values.
"""
from __future__ import annotations

from typing import Callable

from pearl_sglang.workload.swe import SweSampler, SweWorkload


def prefill_token_share(workload: SweWorkload, steps: range) -> float:
    """Computed prompt tokens over all tokens, with every trajectory's prefix cached on its
    worker (so a turn prefills its rewritten tail plus the previous response and
    observation) and each first prompt prefilled once per trajectory (a group spread over
    the pool misses it on every worker; an upper bound on that part)."""
    sampler = SweSampler(workload)
    prefill = generated = 0
    for step in steps:
        for i in range(workload.batch_size):
            index = step * workload.batch_size + i
            ctx = len(sampler.initial_prompt(index))
            prefill += ctx
            for k in range(sampler.turn_count(index)):
                plan = sampler.turn(index, k)
                if not sampler.fits(ctx, plan):
                    break
                generated += plan.response_tokens
                if k:
                    prefill += sampler.rewritten_tokens(ctx_before) + added
                ctx_before, added = ctx, plan.response_tokens + len(plan.observation_ids)
                ctx += added
    return prefill / max(prefill + generated, 1)


def bisect(f: Callable[[float], float], target: float, low: float, high: float, *, rounds: int = 12) -> float:
    """The x in [low, high] where increasing ``f`` reaches ``target`` (a bound if it never does)."""
    if f(high) < target:
        return high
    if f(low) > target:
        return low
    for _ in range(rounds):
        mid = (low + high) / 2
        low, high = (mid, high) if f(mid) < target else (low, mid)
    return (low + high) / 2
