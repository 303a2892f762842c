"""The RL adapter against PEARL's real router and control plane over emulated workers."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pearl_rl_adapter import AsyncPearlClient, DistributedWeights, PearlConflict, PearlRejected, PearlTimeout
from pearl_sglang.core.state import Activity, Zone
from tests.control.conftest import TOKEN, cluster_config, running_cluster
from tests.control.test_elastic import SlowLauncher


async def test_train_begin_blocks_until_borrowed_gpus_are_returned(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, time_scale=2)) as c:
        async with AsyncPearlClient(c.url, admin_token=TOKEN) as pearl:
            await pearl.train_begin(0)
            await pearl.train_finished(0)
            await c.settle()
            overlap = [w for w in c.table.rollout_workers() if w.zone is Zone.OVERLAP]
            assert [w.activity for w in overlap] == [Activity.ACTIVE] * 2
            # Long requests keep the borrowed workers busy when training wants its GPUs.
            busy = [asyncio.ensure_future(c.generate([i, 2, 3], n=400)) for i in range(8)]
            await asyncio.sleep(0.3)
            async with pearl.training_step(1) as begun:
                # Inside the step: every borrowed GPU is back, no overlap worker holds memory.
                assert sorted(begun.returned_gpus) == ["t0:0", "t0:1"]
                assert c.table.training_owns_overlap
                for w in overlap:
                    assert c.table.worker(w.slot).activity is Activity.INACTIVE
                    assert c.launcher.worker(w.slot).engine.released_tags
            outs = await asyncio.gather(*busy)
            assert all(o["meta_info"]["completion_tokens"] == 400 for o in outs)  # migrated, not lost
            with pytest.raises(PearlConflict) as err:
                await pearl.train_finished(7)
            assert "without a train_begin" in err.value.message or "train_finished" in err.value.message
            with pytest.raises(ValueError, match="version"):  # refused before it is sent
                await pearl.update_weights_from_disk(version="", model_path="/x")


async def test_a_training_step_whose_begin_timed_out_leaves_no_step_open(tiny_model_dir):
    # Found by fuzzing the adapter: the router went on with the timed-out train_begin and
    # every later training_step was refused with 409 (step still training).
    async with running_cluster(cluster_config(tiny_model_dir, time_scale=2)) as c:
        async with AsyncPearlClient(c.url, admin_token=TOKEN) as pearl:
            hasty = AsyncPearlClient(config=replace(pearl.config, wait_timeout_s=0.2))
            try:
                # A reconfiguration holds the control plane: the begin waits past the client's
                # timeout and runs after it, as a long drain of borrowed workers would.
                async with c.control.lock:
                    step = asyncio.ensure_future(hasty.training_step(1).__aenter__())
                    await asyncio.sleep(0.5)
                with pytest.raises(PearlTimeout):
                    await step
            finally:
                await hasty.aclose()
            control = (await pearl.state())["control"]
            assert control["last_step"] == {"begin": 1, "finished": 1}  # begun after the timeout, then closed
            assert not control["training"]
            async with pearl.training_step(2):
                assert c.table.training_owns_overlap


async def test_weight_push_during_a_toggle_reaches_the_borrowed_workers(tiny_model_dir, tiny_model_variant_dir):
    async with running_cluster(cluster_config(tiny_model_dir), launcher_cls=SlowLauncher) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})  # activation (slow launches) in flight
        await asyncio.sleep(0.2)
        joining = [w.slot for w in c.table.rollout_workers() if w.activity is Activity.JOINING]
        assert len(joining) == 2
        await c.admin("/update_weights", {"version": "v9", "model_path": str(tiny_model_variant_dir)})
        await c.settle()
        assert {w.slot for w in c.table.active()} >= set(joining)
        assert {w.weight_version for w in c.table.active()} == {"v9"}
        for _ in range(6):
            assert (await c.generate([5, 5, 5]))["meta_info"]["weight_version"] == "v9"


async def test_distributed_push_through_the_adapter(tiny_model_dir):
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=2, overlap=0)) as c:
        async with AsyncPearlClient(c.url, admin_token=TOKEN) as pearl:
            group = await pearl.init_weight_group(group_name="g", master_address="127.0.0.1", master_port=29511,
                                                  backend="gloo")
            assert group.world_size == 3 and [m.rank_offset for m in group.members] == [1, 2]
            dist = DistributedWeights(names=["lm_head.weight"], dtypes=["float32"], shapes=[[1024, 64]],
                                      group_name="g")
            pushed = await pearl.update_weights_from_distributed(version="v3", distributed=dist)
            assert pushed.latest == "v3" and not pushed.failed
            with pytest.raises(PearlRejected) as missing:
                await pearl.update_weights_from_distributed(version="v4", distributed=DistributedWeights(
                    names=["x"], dtypes=["float32"], shapes=[[1]], group_name="other"))
            assert missing.value.status == 404
            with pytest.raises(PearlConflict):
                await pearl.init_weight_group(group_name="g", master_address="127.0.0.1", master_port=29511)
            destroyed = await pearl.destroy_weight_group("g")
            assert set(destroyed.members.values()) == {"ok"}


async def test_the_trainers_count_of_running_trajectories_reaches_the_gate(tiny_model_dir):
    # Paper's saving on the tiny profile (2 -> 4 workers, the whole batch) is ~0.13 s, over
    # the 0.05 s toggle cost: without a count the gate borrows; with none left it cannot pay.
    config = cluster_config(tiny_model_dir, gate={"enabled": True, "toggle_cost_s": 0.05})
    async with running_cluster(config) as c:
        async with AsyncPearlClient(c.url, admin_token=TOKEN) as pearl:
            async with pearl.training_step(0, remaining=lambda: 0):
                pass
            control = (await pearl.state())["control"]
            gate = [d for d in control["decisions"] if d["operation"] == "borrow_gate"][-1]
            assert not gate["borrow"] and gate["reason"].startswith("(R/B)(T_ded - T_full) = (0/"), gate
            await c.settle()
            assert not [w for w in c.table.rollout_workers() if w.zone is Zone.OVERLAP]  # nothing lent
            async with pearl.training_step(1):
                pass
            gate = [d for d in (await pearl.state())["control"]["decisions"] if d["operation"] == "borrow_gate"][-1]
            assert gate["borrow"] and gate["benefit_s"] > 0.05, gate
            await c.settle()
            lent = [w.activity for w in c.table.rollout_workers() if w.zone is Zone.OVERLAP]
            assert lent == [Activity.ACTIVE] * 2


@pytest.mark.parametrize("then_back", [False, True], ids=["switched", "switched-back"])
async def test_a_push_during_a_pd_switch_reaches_the_switched_workers(tiny_model_dir, tiny_model_variant_dir,
                                                                      then_back):
    """Found by fuzzing: workers relaunched in a new role synced to the latest weights but
    the table kept the version they had before, so after a push during the switch they
    counted as stale and were never routed to (with the only prefill among them: every
    request a 503, indefinitely)."""
    async with running_cluster(cluster_config(tiny_model_dir, dedicated=3, overlap=0),
                               launcher_cls=SlowLauncher) as c:
        mode = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "disaggregated"}))
        for _ in range(200):
            if any(w.activity is Activity.SWITCHING for w in c.table.rollout_workers()):
                break
            await asyncio.sleep(0.02)
        switching = {w.slot for w in c.table.rollout_workers() if w.activity is Activity.SWITCHING}
        assert switching
        await c.admin("/update_weights", {"version": "v9", "model_path": str(tiny_model_variant_dir)})
        if then_back:  # the switch is given up: its workers go back to their old role
            await c.admin("/pearl/pd_mode", {"pd_mode": "colocated"})
        await asyncio.gather(mode, return_exceptions=True)
        await c.settle()
        assert c.table.active_topology().mode.value == ("colocated" if then_back else "disaggregated")
        assert {w.weight_version for w in c.table.active()} == {"v9"}
        assert switching <= {w.slot for w in c.table.active()}
        for _ in range(6):
            assert (await c.generate([5, 5, 5]))["meta_info"]["weight_version"] == "v9"
