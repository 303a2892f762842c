"""Properties of cost-aware placement (``core.placement``): the choice is never worse than
the cheapest worker by more than the margin, so no worker is left idle while another
holds more than the margin of queued work; a trajectory stays where its prefix is while
that worker is within the margin of the cheapest; ties rotate by recency, never by slot."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from pearl_sglang.core.placement import (CostRates, Option, WorkerLoad, choose_colocated, choose_pair,
                                         colocated_cost, colocated_costs)
from pearl_sglang.core.presets import qwen3_8b_tp2

RATES = CostRates.from_profile(qwen3_8b_tp2())
MARGIN = 0.05

loads = st.builds(WorkerLoad, queued_prefill_tokens=st.integers(0, 50_000), running=st.integers(0, 64),
                  owed=st.integers(0, 32).map(float))


@st.composite
def options(draw, min_size=1):
    n = draw(st.integers(min_size, 12))
    slots = draw(st.lists(st.integers(0, 99), min_size=n, max_size=n, unique=True))
    recency = draw(st.lists(st.integers(-1, 1000), min_size=n, max_size=n, unique=True))
    return [Option(slot=s, load=draw(loads), matched_tokens=draw(st.integers(0, 40_000)), last_assigned=r)
            for s, r in zip(slots, recency)]


@settings(max_examples=300, deadline=None)
@given(opts=options(), context=st.integers(0, 40_000), data=st.data())
def test_no_worker_idle_while_the_choice_costs_more_than_the_margin(opts, context, data):
    holder = data.draw(st.sampled_from([None] + [o.slot for o in opts]))
    chosen = opts[choose_colocated(RATES, opts, context_tokens=context, margin=MARGIN, holder=holder)]
    cost = colocated_cost(RATES, chosen, context)
    assert all(cost <= colocated_cost(RATES, o, context) * (1 + MARGIN) + 1e-12 for o in opts)
    # In particular an idle worker, which would do it for its own prefill and decode only,
    # is passed over only for a worker whose queued work costs less than that plus the margin.
    for o in opts:
        if o.load.idle and chosen.slot != o.slot:
            idle_cost = colocated_cost(RATES, o, context)
            queued = cost - RATES.t_prefill * max(0, context - chosen.matched_tokens) - RATES.r * (RATES.A + RATES.b)
            own_here = RATES.t_prefill * max(0, context - o.matched_tokens)
            own_there = RATES.t_prefill * max(0, context - chosen.matched_tokens)
            assert queued <= own_here - own_there + MARGIN * idle_cost + 1e-9


@settings(max_examples=300, deadline=None)
@given(opts=options(min_size=2), context=st.integers(0, 40_000), data=st.data())
def test_a_trajectory_stays_where_its_prefix_is_while_that_is_cheapest(opts, context, data):
    holder = data.draw(st.sampled_from(opts))
    costs = {o.slot: colocated_cost(RATES, o, context) for o in opts}
    chosen = opts[choose_colocated(RATES, opts, context_tokens=context, margin=MARGIN, holder=holder.slot)]
    if costs[holder.slot] <= min(costs.values()) * (1 + MARGIN):
        assert chosen.slot == holder.slot
    else:
        assert costs[chosen.slot] < costs[holder.slot]


@given(n=st.integers(2, 16))
def test_sequential_requests_on_an_idle_pool_rotate_by_recency(n):
    """Ties go to the least recently assigned worker, so n short sequential requests on an
    idle pool use n workers, whatever their slot numbers."""
    recency = {slot: -1 for slot in range(n)}
    used = []
    for seq in range(n):
        opts = [Option(slot=s, load=WorkerLoad(), last_assigned=recency[s]) for s in reversed(range(n))]
        chosen = opts[choose_colocated(RATES, opts, context_tokens=100, margin=MARGIN)]
        recency[chosen.slot] = seq
        used.append(chosen.slot)
    assert sorted(used) == list(range(n))


def test_a_group_sharing_a_prompt_spreads_over_the_pool():
    """16 members of a GRPO group with a 2,048-token prompt on 8 idle workers: copying the
    prompt's prefill costs less than queueing behind the group's decodes, so each worker
    gets two. The first holder of the prompt keeps its copy (matched) but not the group."""
    running = {s: 0 for s in range(8)}
    matched = {s: 0 for s in range(8)}
    recency = {s: -1 for s in range(8)}
    for seq in range(16):
        opts = [Option(slot=s, load=WorkerLoad(running=running[s]), matched_tokens=matched[s],
                       last_assigned=recency[s]) for s in range(8)]
        holder = max(opts, key=lambda o: o.matched_tokens).slot if any(matched.values()) else None
        chosen = opts[choose_colocated(RATES, opts, context_tokens=2048, margin=MARGIN, holder=holder)]
        running[chosen.slot] += 1
        matched[chosen.slot] = 2048
        recency[chosen.slot] = seq
    assert sorted(running.values()) == [2] * 8


def test_a_long_context_stays_home_rather_than_re_prefilling_next_to_one_more_decode():
    home = Option(slot=0, load=WorkerLoad(running=3), matched_tokens=16_000, last_assigned=5)
    idle = Option(slot=1, load=WorkerLoad(running=2), last_assigned=1)
    assert choose_colocated(RATES, [home, idle], context_tokens=16_500, margin=MARGIN, holder=0) == 0
    busy_home = Option(slot=0, load=WorkerLoad(running=40), matched_tokens=16_000, last_assigned=5)
    assert choose_colocated(RATES, [busy_home, idle], context_tokens=16_500, margin=MARGIN, holder=0) == 1


def test_colocated_costs_equal_the_per_option_cost():
    opts = [Option(slot=i, load=WorkerLoad(i * 100, i, i / 2), matched_tokens=i * 64) for i in range(5)]
    assert colocated_costs(RATES, opts, 1000) == [colocated_cost(RATES, o, 1000) for o in opts]


def test_owed_trajectories_count_as_load():
    between_turns = Option(slot=0, load=WorkerLoad(owed=16.0), last_assigned=-1)
    idle = Option(slot=1, load=WorkerLoad(), last_assigned=3)
    assert choose_colocated(RATES, [between_turns, idle], context_tokens=500) == 1


def test_pd_pairs_pick_each_side_by_its_own_cost():
    prefills = [Option(slot=0, load=WorkerLoad(queued_prefill_tokens=20_000)),
                Option(slot=1, load=WorkerLoad(), matched_tokens=0)]
    decodes = [Option(slot=2, load=WorkerLoad(running=30)), Option(slot=3, load=WorkerLoad(running=4))]
    p, d = choose_pair(RATES, prefills, decodes, context_tokens=4000)
    assert (prefills[p].slot, decodes[d].slot) == (1, 3)
