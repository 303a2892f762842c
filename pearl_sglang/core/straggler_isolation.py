"""Isolation of stragglers: a cost term on top of placement for the step's tail.

A rollout step ends when its slowest trajectories end. Once the tail has begun, every
second a predicted straggler spends decoding beside other requests (a larger batch) or
stalled by their prefills lengthens the step; the others have slack. So while the tail
lasts, placement changes in two ways:

* a straggler's next turn stays on the worker that holds its prefix unless another one
  finishes it much sooner (the placement cost: queued prefill, its own prefill and the
  decode concurrency it joins, below ``1 / (1 + home_margin)`` of the holder's): a move
  pays a re-prefill and lands on a worker the estimate calls idle, but measured, the moves
  of a looser margin bought nothing in a busy pool and cost throughput there;
* any other request pays, on a worker that holds stragglers, the delay it would impose on
  them: its prefill stalls their decode (``t_prefill`` per token) and its decode adds a
  sequence to their batch (``r * b``), counted once per straggler there and scaled by
  ``weight`` (a straggler's second is worth ``weight`` of another request's second).

So the rest of the step's turns stay off the stragglers' workers while other workers can
take them, and a straggler leaves its worker only for a clearly less contended one. Pure:
the caller passes which trajectory is a straggler and how many stragglers each worker holds.

Invariants (tested): with no straggler anywhere the costs are the placement costs; a
straggler's choice costs at most ``1 + home_margin`` times the cheapest and is its prefix
holder whenever that is within it; another request's cost never falls when a straggler is
added to a worker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.placement import CostRates, Option, cheapest, colocated_costs, decode_seconds, prefill_seconds


@dataclass(frozen=True)
class IsolationConfig:
    """``tail_share``: isolation starts once this share of the step's trajectories has
    finished; ``weight``: a straggler's delay over another request's own.

    The defaults are measured (swe-paper, Qwen3-8B, batch 64, colocated, 8 and 16 reserved
    GPUs with PEARL's borrowing of 16 training GPUs, one replay each, rollout over latency
    floor, share of ``off``'s distance to 1.0 removed, 8 / 16 GPUs): tail share 0.5 and
    weight 2 removed 16% / 0%; weight 8 with tail shares 0.1, 0.2 and 0.3 removed 28-34% /
    20-33%, +2.4-5.9% step throughput; weight 4 or 16, or a straggler share of 0.2, did worse.
    Starting early matters because a trajectory is predicted to be a straggler well before
    the batch's last tenth (``benchmarks/README.md``, stragglers). ``home_margin``: with
    none (a straggler's turn to the cheapest worker whatever holds its prefix) isolation
    cost 1.2% of throughput in a fixed pool busy 94-98% of the rollout (8 GPUs; -4% / 32% of
    the distance removed, fixed / with borrowing); margins of 0.05, 0.3, 0.6, 1.5 and never
    moving: -4% / 26%, -2% / 36%, +1% / 31%, +1% / 37%, +0% / 36%; 1.5 on 16 GPUs: 33% / 36%
    (30% / 28% without). All on one workload draw (seed 0); on two other draws isolation
    removes 5-7% with borrowing and costs 5.3% of throughput in the busy fixed pool
    (``benchmarks/README.md``), so differences of a few points in one draw are its luck."""

    tail_share: float = 0.2
    weight: float = 8.0
    home_margin: float = 1.5

    def validate(self) -> None:
        if not 0 <= self.tail_share < 1:
            raise InvalidConfig(f"straggler tail share must be in [0, 1), got {self.tail_share}",
                                key="straggler_tail_share")
        if not self.weight >= 0:
            raise InvalidConfig(f"isolation weight must be >= 0, got {self.weight}", key="weight")
        if not self.home_margin >= 0:
            raise InvalidConfig(f"straggler home margin must be >= 0, got {self.home_margin}", key="home_margin")


@dataclass(frozen=True)
class Isolation:
    """What placement needs to know for one request: whether it is a straggler's turn,
    and how many stragglers each worker holds (by slot)."""

    straggler: bool
    stragglers_on: Mapping[int, int]
    weight: float = IsolationConfig.weight
    home_margin: float = IsolationConfig.home_margin


def interference_s(rates: CostRates, option: Option, context_tokens: int) -> float:
    """The delay a request placed on ``option`` imposes on each sequence decoding there:
    its prefill (decode waits for it) and one more sequence in their batch for its turn."""
    own = max(0, context_tokens - option.matched_tokens)
    return rates.t_prefill * own + rates.r * rates.b


def isolated_costs(rates: CostRates, options: Sequence[Option], *, context_tokens: int,
                   isolation: Isolation) -> list[float]:
    base = colocated_costs(rates, options, context_tokens)
    if isolation.straggler:
        return base
    return [c + isolation.weight * isolation.stragglers_on.get(o.slot, 0) * interference_s(rates, o, context_tokens)
            for c, o in zip(base, options)]


def choose_colocated_isolated(rates: CostRates, options: Sequence[Option], *, context_tokens: int,
                              isolation: Isolation, margin: float = 0.0, holder: int | None = None) -> int:
    """Index of the option to use; a straggler's prefix holder keeps it within ``home_margin``."""
    costs = isolated_costs(rates, options, context_tokens=context_tokens, isolation=isolation)
    return cheapest(options, costs, margin=isolation.home_margin if isolation.straggler else margin, holder=holder)


def choose_pair_isolated(rates: CostRates, prefills: Sequence[Option], decodes: Sequence[Option], *,
                         context_tokens: int, isolation: Isolation, margin: float = 0.0,
                         holder: int | None = None) -> tuple[int, int]:
    """PD: a straggler's prefill goes to the prefill worker that finishes it soonest (idle
    ones first) and its decode to the least contended decode worker; others' decode
    choice pays for the stragglers decoding there."""
    p = cheapest(prefills, [prefill_seconds(rates, o, context_tokens) for o in prefills],
                 margin=margin, holder=None if isolation.straggler else holder)
    d_costs = [decode_seconds(rates, o) for o in decodes]
    if not isolation.straggler:
        d_costs = [c + isolation.weight * isolation.stragglers_on.get(o.slot, 0) * rates.r * rates.b
                   for c, o in zip(d_costs, decodes)]
    return p, cheapest(decodes, d_costs)
