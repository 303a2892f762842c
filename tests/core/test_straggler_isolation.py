"""Properties of straggler isolation (``core.straggler_isolation``): without stragglers it is
plain placement; a straggler's turn stays with its prefix holder unless another worker is
cheaper by more than ``home_margin``, and otherwise goes to the cheapest; other turns never
get cheaper on a worker for a straggler added there, and leave a straggler's worker for an
equally loaded one."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.placement import CostRates, Option, WorkerLoad, choose_colocated, colocated_costs
from pearl_sglang.core.presets import qwen3_8b_tp2
from pearl_sglang.core.straggler_isolation import (Isolation, IsolationConfig, choose_colocated_isolated,
                                                   choose_pair_isolated, isolated_costs)
from tests.core.test_placement import MARGIN, options

RATES = CostRates.from_profile(qwen3_8b_tp2())


@settings(max_examples=200, deadline=None)
@given(opts=options(), context=st.integers(0, 40_000), data=st.data())
def test_without_stragglers_it_is_plain_placement(opts, context, data):
    holder = data.draw(st.sampled_from([None] + [o.slot for o in opts]))
    none = Isolation(straggler=False, stragglers_on={})
    assert isolated_costs(RATES, opts, context_tokens=context, isolation=none) == colocated_costs(RATES, opts, context)
    assert (choose_colocated_isolated(RATES, opts, context_tokens=context, isolation=none, margin=MARGIN, holder=holder)
            == choose_colocated(RATES, opts, context_tokens=context, margin=MARGIN, holder=holder))


@settings(max_examples=300, deadline=None)
@given(opts=options(), context=st.integers(0, 40_000), home_margin=st.sampled_from([0.0, 0.5, 1.5, 10.0]),
       data=st.data())
def test_a_straggler_leaves_its_prefix_holder_only_for_a_clearly_cheaper_worker(opts, context, home_margin, data):
    holder = data.draw(st.sampled_from([None] + [o.slot for o in opts]))
    on = {o.slot: data.draw(st.integers(0, 3)) for o in opts}
    isolation = Isolation(straggler=True, stragglers_on=on, home_margin=home_margin)
    i = choose_colocated_isolated(RATES, opts, context_tokens=context, isolation=isolation, margin=MARGIN,
                                  holder=holder)
    costs = colocated_costs(RATES, opts, context)  # a straggler pays no isolation penalty
    assert costs[i] <= min(costs) * (1 + home_margin)
    at = [k for k, o in enumerate(opts) if o.slot == holder]
    if at and costs[at[0]] <= min(costs) * (1 + home_margin):
        assert i == at[0], "the prefix holder is within the margin: the straggler stays"
    else:
        assert costs[i] == min(costs), "away from home, the cheapest worker"


@settings(max_examples=200, deadline=None)
@given(opts=options(), context=st.integers(0, 40_000), data=st.data())
def test_a_straggler_added_to_a_worker_never_makes_it_cheaper_for_others(opts, context, data):
    on = {o.slot: data.draw(st.integers(0, 3)) for o in opts}
    target = data.draw(st.sampled_from([o.slot for o in opts]))
    more = {**on, target: on[target] + 1}
    before = isolated_costs(RATES, opts, context_tokens=context, isolation=Isolation(False, on))
    after = isolated_costs(RATES, opts, context_tokens=context, isolation=Isolation(False, more))
    for o, b, a in zip(opts, before, after):
        assert a > b if o.slot == target else a == b


def test_other_turns_leave_a_stragglers_worker_and_the_straggler_leaves_its_busy_holder():
    load = WorkerLoad(running=3)
    opts = [Option(slot=0, load=load, matched_tokens=8_000), Option(slot=1, load=load),
            Option(slot=2, load=WorkerLoad(running=2))]
    on = {0: 1}
    # Another trajectory's turn whose prefix is on worker 0, where a straggler decodes:
    # plain placement keeps it there (its prefix), isolation sends it elsewhere.
    assert choose_colocated(RATES, opts, context_tokens=8_000, margin=MARGIN, holder=0) == 0
    assert choose_colocated_isolated(RATES, opts, context_tokens=8_000, isolation=Isolation(False, on),
                                     margin=MARGIN, holder=0) != 0
    # The straggler itself (prefix on 0) stays while 0 is only somewhat busier than an idle
    # worker, and moves once a re-prefill there costs well under the contention at home.
    for running, moves in ((4, False), (120, True)):
        busy = [Option(slot=0, load=WorkerLoad(running=running), matched_tokens=8_000),
                Option(slot=1, load=WorkerLoad())]
        assert choose_colocated(RATES, busy, context_tokens=8_000, margin=10.0, holder=0) == 0
        chosen = choose_colocated_isolated(RATES, busy, context_tokens=8_000, margin=10.0, holder=0,
                                           isolation=Isolation(True, {0: 1}, home_margin=1.5))
        assert chosen == (1 if moves else 0), running


def test_pd_stragglers_prefill_on_idle_prefill_workers_and_others_keep_off_their_decodes():
    prefills = [Option(slot=0, load=WorkerLoad(queued_prefill_tokens=6_000), matched_tokens=4_000),
                Option(slot=1, load=WorkerLoad())]
    decodes = [Option(slot=2, load=WorkerLoad(running=4)), Option(slot=3, load=WorkerLoad(running=4))]
    straggler = choose_pair_isolated(RATES, prefills, decodes, context_tokens=4_000, margin=10.0, holder=0,
                                     isolation=Isolation(True, {2: 1}))
    assert straggler[0] == 1
    other = choose_pair_isolated(RATES, prefills, decodes, context_tokens=4_000, margin=10.0, holder=0,
                                 isolation=Isolation(False, {2: 1}))
    assert other == (0, 1)  # indexes: the prefix holder, and the decode worker with no straggler (slot 3)


def test_config_is_validated():
    IsolationConfig().validate()
    with pytest.raises(InvalidConfig, match="tail share"):
        IsolationConfig(tail_share=1.0).validate()
    with pytest.raises(InvalidConfig, match="weight"):
        IsolationConfig(weight=-1).validate()
    with pytest.raises(InvalidConfig, match="home margin"):
        IsolationConfig(home_margin=-0.1).validate()
