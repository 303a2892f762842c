"""Joins, leaves and PD-mode calls that supersede a growth in flight: every answer says
what happened to the caller's GPUs, checked against the table once the cluster settles."""
from __future__ import annotations

import asyncio

from pearl_rl_adapter import AsyncPearlClient
from pearl_sglang.core.state import Activity
from tests.control.conftest import TOKEN, cluster_config, running_cluster
from tests.control.test_elastic import FailingLauncher, SlowLauncher


class SlowFailingLauncher(FailingLauncher):
    """Slow cold starts, and workers on node 'bad' never come up."""

    async def launch(self, spec):
        await asyncio.sleep(SlowLauncher.delay_s)
        return await super().launch(spec)


def serving(c, gpus) -> list[int]:
    return sorted(w.slot for w in c.table.active() if set(gpus) & set(w.gpus))


async def overlapping_joins(c, nodes, gap_s=0.3):
    """One join per node, each while the previous expansion is still launching (1 s)."""
    joins = []
    for gpus in nodes:
        joins.append(asyncio.ensure_future(c.admin("/pearl/gpus", {"action": "join", "gpus": gpus})))
        await asyncio.sleep(gap_s)
    return await asyncio.gather(*joins)


async def test_overlapping_joins_each_answer_with_the_workers_on_their_gpus(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, overlap=0), launcher_cls=SlowLauncher) as c:
        nodes = [[f"s{i}:0"] for i in range(4)]
        answers = await overlapping_joins(c, nodes)
        await c.settle()
        for gpus, out in zip(nodes, answers):
            assert serving(c, gpus), (gpus, c.table.to_dict())
            assert out["admitted"] == serving(c, gpus) and not out["cancelled"], (gpus, out)
        # The first three were carried on by the next join's expansion, and say so.
        assert [len(out["superseded_by"]) for out in answers] == [3, 2, 1, 0]
        assert {out["expansion"] for out in answers} == {answers[-1]["expansion"]}


async def test_overlapping_joins_cancelled_by_a_failure_all_say_so(tiny_model_dir):
    config = cluster_config(tiny_model_dir, overlap=0)
    async with running_cluster(config, launcher_cls=SlowFailingLauncher) as c:
        nodes = [["s0:0"], ["s1:0"], ["bad:0"]]
        answers = await overlapping_joins(c, nodes)
        await c.settle()
        for gpus, out in zip(nodes, answers):
            assert serving(c, gpus) == [] and out["admitted"] == [], (gpus, out)
            assert out["cancelled"] and "injected start failure" in out["reason"], out


async def test_a_join_superseded_by_the_leave_of_its_gpus_is_cancelled_and_says_why(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, overlap=0), launcher_cls=SlowLauncher) as c:
        join = asyncio.ensure_future(c.admin("/pearl/gpus", {"action": "join", "gpus": ["s0:0"]}))
        other = asyncio.ensure_future(c.admin("/pearl/gpus", {"action": "join", "gpus": ["s1:0"]}))
        await asyncio.sleep(0.3)
        left = await c.admin("/pearl/gpus", {"action": "leave", "gpus": ["s0:0"], "deadline_s": 10})
        out, kept = await join, await other
        await c.settle()
        assert out["cancelled"] and out["admitted"] == [] and "left before" in out["reason"], out
        assert out["superseded_by"][-1] == "gpus_leave"
        assert serving(c, ["s0:0"]) == [] and left["removed"] == []
        assert kept["admitted"] == serving(c, ["s1:0"]) != [] and not kept["cancelled"], kept


async def test_a_join_and_a_pd_mode_change_that_supersedes_it_both_answer_when_admitted(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0)
    async with running_cluster(config, launcher_cls=SlowLauncher) as c:
        join = asyncio.ensure_future(c.admin("/pearl/gpus", {"action": "join", "gpus": ["s0:0"]}))
        await asyncio.sleep(0.3)
        pd = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "disaggregated"}))
        await asyncio.sleep(0.3)
        # A later join supersedes the PD-mode change's growth too.
        late = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["s1:0"]})
        out, mode = await join, await pd
        await c.settle()
        assert out["superseded_by"][0] == "pd_mode" and mode["superseded_by"] == ["gpus_join"], (out, mode)
        for gpus, answer in ((["s0:0"], out), (["s1:0"], late)):
            assert answer["admitted"] == serving(c, gpus) != [] and not answer["cancelled"], answer
        topo = c.table.active_topology()
        assert topo.colocated == 0 and mode["topology"] == topo.label() and "reason" not in mode


async def test_a_join_superseded_by_train_begin_answers_once_its_gpus_serve(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, overlap=2), launcher_cls=SlowLauncher) as c:
        async with AsyncPearlClient(c.url, admin_token=TOKEN) as pearl:
            await pearl.train_begin(0)
            await pearl.train_finished(0)
            join = asyncio.ensure_future(pearl.join_gpus(["p1:0"]))
            await asyncio.sleep(0.3)
            await pearl.train_begin(1)
            joined = await join
            assert joined.superseded_by == ("train_begin",) and joined.expansion is not None
            assert not joined.cancelled and joined.admitted == tuple(str(s) for s in serving(c, ["p1:0"])) != ()
            assert c.table.worker(int(joined.admitted[0])).activity is Activity.ACTIVE
