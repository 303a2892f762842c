"""A held worker (it lost its PD partner and keeps its role) is admitted in the role the
table gives it, even when its process is in the other one: a growth cancelled during an
in-place prefill <-> decode switch can leave it so. Before, the held worker was admitted
as it was; the burst test (test_burst_faults.py) found it: every PD probe through the
pair timed out waiting for bootstrap, since the "decode" was a prefill, and the cluster
never served on all its GPUs again."""
from __future__ import annotations

from dataclasses import replace

from pearl_sglang.core.state import Activity, Role
from tests.control.conftest import cluster_config, running_cluster


async def test_a_held_worker_left_in_the_other_role_is_switched_back_and_admitted(tiny_model_dir):
    config = cluster_config(tiny_model_dir, dedicated=3, overlap=0, pd_mode="1:2")
    async with running_cluster(config) as c:
        executor = c.control.executor
        d = c.table.active(Role.DECODE)[0]
        # What the cancelled switch leaves: the process a prefill, the table holding it
        # as the decode it was.
        await executor.ops.switch_role(d.endpoint, "prefill")
        assert (await executor.ops.model_info(d.endpoint))["disaggregation_mode"] == "prefill"
        async with c.store.lock:
            c.store.replace_locked(c.table.put(replace(d, activity=Activity.SWITCHING, pending_role=d.role)))
        assert c.table.worker(d.slot).held

        event = await executor.switch(d.slot, "test")
        assert (await executor.ops.model_info(d.endpoint))["disaggregation_mode"] == "decode"
        await executor.verify_pd([event])  # a real PD request through it, with the prefill
        await executor.admit([event], "test")
        assert c.table.worker(d.slot).activity is Activity.ACTIVE and c.table.worker(d.slot).role is Role.DECODE
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["completion_tokens"] == 4
