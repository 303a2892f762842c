"""The gate's measured check: what the last step's workers did (core.pool_usage)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import borrow_gate
from pearl_sglang.core.pool_usage import PoolUsage, UsageThresholds, pool_usage, usage_guard

BORROW = borrow_gate(remaining=64, batch=64, t_ded_s=534.3, t_full_s=297.8, toggle_cost_s=9.4)
REFUSE = borrow_gate(remaining=64, batch=64, t_ded_s=300, t_full_s=299, toggle_cost_s=9.4)


def test_shares_per_zone_count_idle_workers_and_the_time_lent():
    # Dedicated slots 0-1 over a 500 s step; borrowed slots 2-4 lent for the last 400 s,
    # slot 4 never got a request (absent from the busy record).
    u = pool_usage({0: 300.0, 1: 200.0, 2: 100.0, 3: 60.0}, span_s=500.0, dedicated=[0, 1], borrowed=[2, 3, 4],
                   borrowed_for_s=400.0)
    assert u.borrowed
    assert u.dedicated_busy_share == pytest.approx(0.5)
    assert u.borrowed_busy_share == pytest.approx((0.25 + 0.15 + 0.0) / 3)
    unborrowed = pool_usage({0: 450.0, 1: 400.0}, span_s=500.0, dedicated=[0, 1], borrowed=[], borrowed_for_s=None)
    assert not unborrowed.borrowed and unborrowed.borrowed_busy_share is None
    assert unborrowed.dedicated_busy_share == pytest.approx(0.85)


def test_nothing_measured_gives_no_share():
    assert pool_usage({}, span_s=0.0, dedicated=[0], borrowed=[], borrowed_for_s=None).dedicated_busy_share is None
    assert pool_usage({0: 1.0}, span_s=10.0, dedicated=[], borrowed=[], borrowed_for_s=None).dedicated_busy_share \
        is None


def test_idle_dedicated_pool_refuses_a_borrow_equation_7_makes():
    # The environment-bound grid point (4 GPUs, batch 64): equation (7) predicted a 236 s
    # saving; the dedicated workers were busy 52% of the unborrowed step.
    idle = PoolUsage(borrowed=False, dedicated_busy_share=0.52)
    g = usage_guard(BORROW, idle, UsageThresholds())
    assert BORROW.borrow and not g.borrow
    assert "dedicated workers were busy 52%" in g.reason and BORROW.reason in g.reason
    assert g.benefit_s == BORROW.benefit_s  # the prediction is kept for the record
    assert usage_guard(BORROW, PoolUsage(borrowed=False, dedicated_busy_share=0.73), UsageThresholds()).borrow


def test_unused_borrowed_workers_refuse_the_next_borrow():
    unused = PoolUsage(borrowed=True, dedicated_busy_share=0.37, borrowed_busy_share=0.14)
    g = usage_guard(BORROW, unused, UsageThresholds())
    assert not g.borrow and "borrowed workers were busy 14%" in g.reason
    # A borrowed step lowers the dedicated share by design: only the borrowed share counts.
    used = PoolUsage(borrowed=True, dedicated_busy_share=0.30, borrowed_busy_share=0.43)
    assert usage_guard(BORROW, used, UsageThresholds()).borrow


def test_thresholds_validate_and_zero_turns_the_check_off():
    with pytest.raises(InvalidConfig):
        UsageThresholds(min_dedicated_busy_share=1.5)
    with pytest.raises(InvalidConfig):
        UsageThresholds(min_borrowed_busy_share=-0.1)
    off = UsageThresholds(min_dedicated_busy_share=0.0, min_borrowed_busy_share=0.0)
    assert usage_guard(BORROW, PoolUsage(borrowed=False, dedicated_busy_share=0.0), off).borrow


shares = st.none() | st.floats(min_value=0.0, max_value=1.0)


@given(borrowed=st.booleans(), ded=shares, lent=shares, t_ded=st.floats(min_value=0.0, max_value=0.5),
       t_lent=st.floats(min_value=0.0, max_value=0.5), gate_borrows=st.booleans())
def test_the_check_only_ever_refuses(borrowed, ded, lent, t_ded, t_lent, gate_borrows):
    decision = BORROW if gate_borrows else REFUSE
    usage = PoolUsage(borrowed=borrowed, dedicated_busy_share=ded, borrowed_busy_share=lent if borrowed else None)
    out = usage_guard(decision, usage, UsageThresholds(t_ded, t_lent))
    assert out.borrow <= decision.borrow  # never turns a refusal into a borrow
    share, floor = (lent, t_lent) if borrowed else (ded, t_ded)
    assert out.borrow == (decision.borrow and (share is None or share >= floor))
    assert usage_guard(decision, None, UsageThresholds(t_ded, t_lent)) == decision


@given(busy=st.dictionaries(st.integers(0, 15), st.floats(min_value=0.0, max_value=1e4), max_size=16),
       span=st.floats(min_value=1.0, max_value=1e4), lent=st.none() | st.floats(min_value=0.1, max_value=2e4))
def test_shares_stay_in_the_unit_interval(busy, span, lent):
    u = pool_usage(busy, span_s=span, dedicated=range(8), borrowed=range(8, 16), borrowed_for_s=lent)
    assert 0.0 <= u.dedicated_busy_share <= 1.0
    assert (u.borrowed_busy_share is None) == (lent is None)
    if lent is not None:
        assert 0.0 <= u.borrowed_busy_share <= 1.0


def test_a_worker_that_joined_late_does_not_hide_a_busy_pool():
    # Elastic replay, Qwen3-30B-A3B segment 1, step 0: six dedicated workers busy 69-87%
    # of the step and a preemptible one admitted near its end (1%); their mean is 0.65.
    busy = {0: 0.83, 1: 0.87, 2: 0.71, 3: 0.74, 4: 0.69, 5: 0.69, 6: 0.01}
    u = pool_usage(busy, span_s=1.0, dedicated=busy, borrowed=[], borrowed_for_s=None)
    assert u.dedicated_busy_share == pytest.approx(0.71)
    assert usage_guard(BORROW, u, UsageThresholds()).borrow


def test_an_overruled_decision_says_why():
    g = usage_guard(BORROW, PoolUsage(borrowed=False, dedicated_busy_share=0.3), UsageThresholds())
    assert g.overruled and g.overruled in g.reason and g.to_dict()["overruled"] == g.overruled
    assert BORROW.overruled is None and BORROW.to_dict()["overruled"] is None


@pytest.mark.parametrize("kw, key", [({"dedicated_busy_share": 1.2}, "dedicated_busy_share"),
                                     ({"borrowed_busy_share": -0.1}, "borrowed_busy_share"),
                                     ({"borrowed": "yes"}, "borrowed")])
def test_usage_is_validated(kw, key):
    with pytest.raises(InvalidConfig) as e:
        PoolUsage(**{"borrowed": True, "dedicated_busy_share": 0.5, **kw})
    assert e.value.key == key
