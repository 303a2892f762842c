"""The placement benchmark's quick variant, end to end: PEARL's router (cost and
cache_aware policies) in front of emulated workers with a GRPO workload and a mid-step
join. Cost placement uses every worker evenly and gives the joined workers a fair share;
sglang-router's cache_aware rule (as PEARL's policy) keeps each group on one worker."""
from __future__ import annotations

import asyncio

from benchmarks.placement import bench, parse_args


def _later_turns_hit_rate(row: dict) -> float:
    """Cached over prompt tokens of every turn after a trajectory's first (rid
    ``grpo<group>-<member>-<turn>``): the prefix its own earlier turn left on its worker."""
    later = [r for r in row["trace"]["requests"] if not r["rid"].endswith("-0")]
    return sum(r["cached_tokens"] for r in later) / sum(r["prompt_tokens"] for r in later)


def test_quick_placement_spreads_groups_and_feeds_joined_workers():
    args = parse_args(["--quick", "--no-sglang-router", "--pearl-policies", "cost", "cache_aware"])
    rows = {(r["scenario"], r["target"]): r for r in asyncio.run(bench(args))["rows"]}
    cost, aware = rows[("grpo", "pearl cost")], rows[("grpo", "pearl cache_aware")]
    assert cost["workers_used"] == 4 and cost["generated_busiest_over_mean"] <= 1.2
    assert aware["workers_used"] == 2       # two groups, each on the worker of its first member
    # Spreading keeps each trajectory on the worker that holds its context. A group's first
    # turns all start at once, so whether members on one worker share the group's prompt
    # depends on whether they land in one prefill batch (they share nothing) or straggle in
    # (a loaded CI host gave cache_aware 0.62 overall, a quiet one 0.44): compare the
    # later turns, which timing does not change.
    assert _later_turns_hit_rate(cost) >= _later_turns_hit_rate(aware) - 0.05
    assert _later_turns_hit_rate(cost) > 0.7  # each later turn found its own first prompt (0.78)
    join = rows[("join", "pearl cost")]["join"]
    assert join["new_workers_share"] >= 0.35
    assert rows[("join", "pearl cost")]["migrations"] == 0   # moved at turn boundaries only
    assert rows[("join", "pearl cache_aware")]["join"]["new_workers_share"] == 0.0
