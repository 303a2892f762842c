"""The placement benchmark's quick variant, end to end: PEARL's router (cost and
cache_aware policies) in front of emulated workers with a GRPO workload and a mid-step
join. Cost placement uses every worker evenly and gives the joined workers a fair share;
sglang-router's cache_aware rule (as PEARL's policy) keeps each group on one worker."""
from __future__ import annotations

import asyncio

from benchmarks.placement import bench, parse_args


def test_quick_placement_spreads_groups_and_feeds_joined_workers():
    args = parse_args(["--quick", "--no-sglang-router", "--pearl-policies", "cost", "cache_aware"])
    rows = {(r["scenario"], r["target"]): r for r in asyncio.run(bench(args))["rows"]}
    cost, aware = rows[("grpo", "pearl cost")], rows[("grpo", "pearl cache_aware")]
    assert cost["workers_used"] == 4 and cost["generated_busiest_over_mean"] <= 1.2
    assert aware["workers_used"] == 2       # two groups, each on the worker of its first member
    assert cost["cache_hit_rate"] >= aware["cache_hit_rate"] - 0.05
    join = rows[("join", "pearl cost")]["join"]
    assert join["new_workers_share"] >= 0.35
    assert rows[("join", "pearl cost")]["migrations"] == 0   # moved at turn boundaries only
    assert rows[("join", "pearl cache_aware")]["join"]["new_workers_share"] == 0.0
