"""Distributed weight pushes through the admin API on emulated clusters: a group over the
active workers, a push that reaches every member between begin/end, a membership change
that refuses the push before anything is broadcast, bad input as 4xx, and joiners that
cannot sync to a broadcast without a disk copy."""
from __future__ import annotations

import asyncio

import pytest

from pearl_sglang.workers.client import WorkerClient
from pearl_sglang.workers.errors import status_error
from tests.control.conftest import cluster_config, running_cluster
from tests.faults.support import until

pytestmark = pytest.mark.timeout(60)

GROUP = {"action": "init", "group_name": "g1", "master_address": "127.0.0.1", "master_port": 29555,
         "backend": "gloo"}
TENSORS = {"names": ["model.embed_tokens.weight", "lm_head.weight"], "dtypes": ["float32", "float32"],
           "shapes": [[1024, 64], [1024, 64]]}


def dist(group="g1", **over):
    return {**TENSORS, "group_name": group, **over}


def in_update(c, slot):
    return c.launcher.worker(slot).in_weight_update


async def test_group_over_the_active_workers_then_a_push_reaches_every_member(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=0)) as c:
        group = await c.admin("/pearl/weight_group", GROUP)
        assert group["world_size"] == 3
        assert group["members"] == [{"slot": 0, "rank_offset": 1}, {"slot": 1, "rank_offset": 2}]
        # The members wait in the background for the trainer; the emulator answers at once.
        await until(lambda: all(c.launcher.worker(s).weight_group == "g1" for s in (0, 1)), what="inits")
        out = await c.admin("/update_weights", {"version": "v1", "distributed": dist()})
        assert out["applied"] and out["workers"] == {"0": "ok", "1": "ok"} and out["push"] == 1
        assert [w.weight_version for w in c.table.active()] == ["v1", "v1"]
        assert not in_update(c, 0) and not in_update(c, 1)  # every begin has its end
        outs = await asyncio.gather(*(c.generate([3, i, 5], 4) for i in range(6)))
        assert {o["meta_info"]["weight_version"] for o in outs} == {"v1"}
        state = (await c.client.get(c.url + "/pearl/state", headers=c.auth)).json()["control"]
        assert state["weights"]["group"] == "g1" and not state["weights"]["joiners_can_sync"]
        assert "cannot load it" in state["weights"]["note"]
        assert state["weight_groups"][0]["state"] == "ready"
        destroyed = await c.admin("/pearl/weight_group", {"action": "destroy", "group_name": "g1"})
        assert destroyed["members"] == {"0": "ok", "1": "ok"}
        assert all(c.launcher.worker(s).weight_group is None for s in (0, 1))
        await c.admin("/pearl/weight_group", GROUP)  # the name is free again


async def test_push_after_a_join_is_refused_before_anything_is_broadcast(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=0)) as c:
        await c.admin("/pearl/weight_group", GROUP)
        assert (await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]}))["admitted"] == [2]
        err = await c.admin("/update_weights", {"version": "v1", "distributed": dist()}, expect=409)
        assert err["error"]["type"] == "weight_group_membership"
        assert "joined: [2], left: []" in err["error"]["message"] and "re-init" in err["error"]["message"]
        assert [w.weight_version for w in c.table.active()] == ["default"] * 3
        assert c.control.snapshot.version == "default"
        await c.admin("/pearl/weight_group", {"action": "destroy", "group_name": "g1"})
        group = await c.admin("/pearl/weight_group", GROUP)
        assert group["world_size"] == 4
        out = await c.admin("/update_weights", {"version": "v1", "distributed": dist()})
        assert set(out["workers"].values()) == {"ok"}


async def test_bad_weight_group_input_is_a_4xx_with_a_clear_message(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=1, overlap=0)) as c:
        bad_inits = [({**GROUP, "backend": "mpi"}, "'backend'"), ({**GROUP, "master_port": 0}, "master_port"),
                     ({**GROUP, "master_port": "x"}, "master_port"), ({k: v for k, v in GROUP.items()
                                                                     if k != "group_name"}, "group_name"),
                     ({**GROUP, "action": "grow"}, "'action'"), ({**GROUP, "master_address": ""}, "master_address"),
                     ({**GROUP, "master_address": "\u0000"}, "master_address"),
                     ({**GROUP, "master_address": "http://x/"}, "master_address"),
                     ({**GROUP, "master_address": " "}, "master_address")]
        for body, words in bad_inits:
            err = await c.admin("/pearl/weight_group", body, expect=400)
            assert words in err["error"]["message"], (body, err)
        err = await c.admin("/pearl/weight_group", {"action": "destroy", "group_name": "nope"}, expect=404)
        assert "no weight group named 'nope'" in err["error"]["message"]
        await c.admin("/pearl/weight_group", GROUP)
        err = await c.admin("/pearl/weight_group", GROUP, expect=409)
        assert "exists" in err["error"]["message"]
        bad_pushes = [
            (dist(group="other"), 404, "no weight group named 'other'"),
            (dist(names=["a"]), 400, "same length"),
            (dist(names=[], dtypes=[], shapes=[]), 400, "at least one tensor"),
            (dist(dtypes=["float32", "complex7"]), 400, "unknown dtype"),
            (dist(shapes=[[1024, 64], [-1, 64]]), 400, "negative"),
            (dist(shapes=[[1024, 64], "64"]), 400, "integer lists"),
            (dist(names=["a", "a"]), 400, "repeat"),
            ({k: v for k, v in dist().items() if k != "names"}, 400, "names"),
            ({k: v for k, v in dist().items() if k != "group_name"}, 400, "group_name"),
            ([1, 2], 400, "must be an object"),
        ]
        for spec, status, words in bad_pushes:
            err = await c.admin("/update_weights", {"version": "v1", "distributed": spec}, expect=status)
            assert words in err["error"]["message"], (spec, err)
        assert not in_update(c, 0) and c.table.active()[0].weight_version == "default"


async def test_member_that_cannot_join_fails_the_push_with_502(tiny_model_dir, monkeypatch):
    real = WorkerClient.init_weight_group

    async def init(self, url, **kw):
        if kw["rank_offset"] == 2:
            raise status_error(url, 400, b"Failed to initialize group", path="/init_weights_update_group")
        return await real(self, url, **kw)

    monkeypatch.setattr(WorkerClient, "init_weight_group", init)
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=0)) as c:
        await c.admin("/pearl/weight_group", GROUP)
        err = await c.admin("/update_weights", {"version": "v1", "distributed": dist()}, expect=502)
        assert "slot 1 could not join weight group 'g1'" in err["error"]["message"]
        assert not in_update(c, 0) and [w.weight_version for w in c.table.active()] == ["default"] * 2


async def test_joiner_cannot_sync_to_a_broadcast_without_a_disk_copy(tiny_model_dir, tiny_model_variant_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=1, overlap=0)) as c:
        await c.admin("/pearl/weight_group", GROUP)
        await c.admin("/update_weights", {"version": "v1", "distributed": dist()})
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]})
        assert out["admitted"] == [] and out["cancelled"]  # all-or-nothing, as for any failed join
        assert "no disk copy" in out["reason"] and "model_path" in out["reason"]
        assert [w.slot for w in c.table.active()] == [0] and c.launcher.slots() == (0,)
        # With a disk copy of the broadcast weights a joiner syncs to it.
        await c.admin("/update_weights", {"version": "v2", "distributed": dist(),
                                          "model_path": str(tiny_model_variant_dir)})
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p2:0"]})
        # The answer names the worker on this join's GPU; p1:0 stayed in the budget and
        # its worker came up in the same expansion.
        assert out["admitted"] == [w.slot for w in c.table.active() if "p2:0" in w.gpus] == [2]
        assert [w.slot for w in c.table.active() if "p1:0" in w.gpus] == [1]
        assert [w.weight_version for w in c.table.active()] == ["v2", "v2", "v2"]


async def test_a_relaunch_that_could_not_sync_is_refused_before_any_worker_stops(tiny_model_dir,
                                                                                  tiny_model_variant_dir):
    # Found by the admin fuzz: after a broadcast without a disk copy, a pinned P:D ratio
    # relaunched the colocated workers, none could load the weights, going back needed the
    # same load, and every worker was stopped: nothing served and no admin call helped.
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=0)) as c:
        await c.admin("/pearl/weight_group", GROUP)
        await c.admin("/update_weights", {"version": "v1", "distributed": dist()})
        processes = [c.launcher.worker(s) for s in (0, 1)]
        err = await c.admin("/pearl/pd_mode", {"pd_mode": "1:1"}, expect=503)
        assert "no disk copy" in err["error"]["message"]
        assert [(w.slot, w.role.value, w.weight_version) for w in c.table.active()] == [
            (0, "colocated", "v1"), (1, "colocated", "v1")]
        assert [c.launcher.worker(s) for s in (0, 1)] == processes  # none was stopped or started
        assert c.launcher.slots() == (0, 1)
        assert (await c.generate([3, 4, 5], 4))["meta_info"]["weight_version"] == "v1"
        # With the weights on disk the same change goes through.
        await c.admin("/update_weights", {"version": "v2", "model_path": str(tiny_model_variant_dir)})
        await c.admin("/pearl/pd_mode", {"pd_mode": "1:1"})
        topo = c.table.active_topology()
        assert (topo.prefill, topo.decode) == (1, 1), topo


async def test_with_no_worker_left_a_disk_push_brings_workers_back(tiny_model_dir, tiny_model_variant_dir):
    # The other dead end: every worker gone while the kept weights exist only in them. A
    # disk push cannot be checked by a worker, yet it is the only way back.
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=1, overlap=0)) as c:
        await c.admin("/pearl/weight_group", GROUP)
        await c.admin("/update_weights", {"version": "v1", "distributed": dist()})
        await c.admin("/pearl/gpus", {"action": "leave", "gpus": ["d0:0"], "deadline_s": 5})
        assert c.table.active() == ()
        out = await c.admin("/pearl/gpus", {"action": "join", "gpus": ["p1:0"]})
        assert out["admitted"] == [] and "no disk copy" in out["reason"]
        out = await c.admin("/update_weights", {"version": "v2", "model_path": str(tiny_model_variant_dir)})
        assert out["applied"] and out["unchecked"] and out["latest"] == "v2"
        await until(lambda: len(c.table.active()) == 1, what="a worker at v2")
        assert (await c.generate([3, 4, 5], 4))["meta_info"]["weight_version"] == "v2"
        # With a worker serving, a push is checked again: a bad path changes nothing.
        err = await c.admin("/update_weights", {"version": "v3", "model_path": "/no/such/checkpoint"})
        assert not err["applied"] and err["latest"] == "v2"
