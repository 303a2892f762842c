"""Where one request should run: per-worker time estimates from the runtime profile.

The router asks this module, for each worker that may take a request, how long the
request would take there, and picks the cheapest.  The estimate uses the same paper
symbols (``profile``) that the decision engine uses, so placement and the choice of mode
and ratio agree about what prefill and decode cost:

* prefill: the request's context minus the prefix the worker already holds, plus the
  prefill tokens already queued there, times ``t_prefill``;
* decode: ``r`` tokens at the worker's concurrency once this request joins it,
  ``r * (A + b * (sequences + 1))``, where the sequences are the running ones plus the
  trajectories that are between turns there (their KV is resident and their next turn
  is coming: work the worker still owes).

A group of requests that share a prompt therefore spreads while a copy of the prompt's
prefill costs less than queueing behind the group's decodes, and a trajectory stays
where its prefix is while that worker stays the cheapest (its home, the ``holder`` the
caller names, wins within a relative ``margin``, so near-equal workers do not make it
hop; the router names a trajectory's previous worker, never a shared prompt's server).  Ties go to the worker that was assigned least
recently, so sequential requests on an idle pool rotate instead of piling on one slot.

Invariants (tested with Hypothesis): the choice costs at most ``1 + margin`` times the
cheapest worker's; the prefix holder is kept whenever it is within that; among workers of
equal cost the least recently assigned wins.  Pure: no I/O,
no clock; the caller passes snapshots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.profile import Profile


@dataclass(frozen=True)
class CostRates:
    """The profile symbols placement needs (seconds per token / iteration / sequence)."""

    t_prefill: float
    A: float
    b: float
    r: float

    @classmethod
    def from_profile(cls, p: Profile) -> "CostRates":
        return cls(t_prefill=p.t_prefill, A=p.A, b=p.b, r=max(p.r, 1.0))


class WorkerLoad(NamedTuple):
    """What one worker has to do already, as the router sees it.

    ``owed`` counts trajectories between turns whose next turn is expected there
    (fractional weights allowed: the caller may discount ones likely to have ended).
    A named tuple, not a dataclass: the router builds one per worker per request.
    """

    queued_prefill_tokens: int = 0
    running: int = 0
    owed: float = 0.0

    @property
    def sequences(self) -> float:
        return self.running + self.owed

    @property
    def idle(self) -> bool:
        return self.queued_prefill_tokens == 0 and self.running == 0 and self.owed == 0


IDLE = WorkerLoad()


class Option(NamedTuple):
    """One worker that may take the request.

    ``matched_tokens``: the prefix of the request's context this worker holds (learned
    block map); ``last_assigned``: a sequence number of its latest assignment (-1: never),
    the tie-break; ``cached_blocks``: prefix blocks it holds in all (the size of its tree,
    for sglang-router's rule). The request's own trajectory is not in ``load.owed`` (it
    does not queue behind itself).
    """

    slot: int
    load: WorkerLoad
    matched_tokens: int = 0
    last_assigned: int = -1
    cached_blocks: int = 0


def prefill_seconds(rates: CostRates, option: Option, context_tokens: int) -> float:
    """Queued prefill plus what this request must compute there."""
    own = max(0, context_tokens - option.matched_tokens)
    return rates.t_prefill * (option.load.queued_prefill_tokens + own)


def decode_seconds(rates: CostRates, option: Option) -> float:
    """This request's ``r`` tokens at the concurrency it would join."""
    return rates.r * (rates.A + rates.b * (option.load.sequences + 1))


def colocated_cost(rates: CostRates, option: Option, context_tokens: int) -> float:
    return prefill_seconds(rates, option, context_tokens) + decode_seconds(rates, option)


def cheapest(options: Sequence[Option], costs: Sequence[float], *, margin: float = 0.0,
             holder: int | None = None) -> int:
    """Index of the minimum-cost option; the prefix ``holder`` wins while its cost is within
    ``1 + margin`` times the minimum; equal costs go to the least recently assigned (slot
    only orders workers never assigned, once)."""
    if not options:
        raise InvalidConfig("no worker to choose from", key="options")
    best = min(range(len(options)), key=lambda i: (costs[i], options[i].last_assigned, options[i].slot))
    if holder is not None and holder != options[best].slot:
        for i, o in enumerate(options):
            if o.slot == holder and costs[i] <= costs[best] * (1.0 + margin):
                return i
    return best


def colocated_costs(rates: CostRates, options: Sequence[Option], context_tokens: int) -> list[float]:
    """``colocated_cost`` of every option (one pass: this runs on every request)."""
    tp, r, a, b = rates.t_prefill, rates.r, rates.A, rates.b
    out = []
    for o in options:
        load = o.load
        own = context_tokens - o.matched_tokens
        out.append(tp * (load.queued_prefill_tokens + (own if own > 0 else 0))
                   + r * (a + b * (load.running + load.owed + 1)))
    return out


def choose_colocated(rates: CostRates, options: Sequence[Option], *, context_tokens: int,
                     margin: float = 0.0, holder: int | None = None) -> int:
    """Index of the option to use."""
    return cheapest(options, colocated_costs(rates, options, context_tokens), margin=margin, holder=holder)


def choose_pair(rates: CostRates, prefills: Sequence[Option], decodes: Sequence[Option], *,
                context_tokens: int, margin: float = 0.0,
                holder: int | None = None) -> tuple[int, int]:
    """PD: indexes of the prefill (by its prefill time, its prefix included) and of the
    decode (by the concurrency it would join); the two are independent."""
    p = cheapest(prefills, [prefill_seconds(rates, o, context_tokens) for o in prefills],
                 margin=margin, holder=holder)
    d = cheapest(decodes, [decode_seconds(rates, o) for o in decodes])
    return p, d
