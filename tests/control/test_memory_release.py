"""Borrowed training GPUs are free when PEARL says so: an overlap zone needs the memory
saver (refused at config load without it), and a worker that reports no memory saver is
stopped on return instead of being trusted to have released its memory."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pearl_sglang.control.cluster_config import ConfigError
from pearl_sglang.core.state import Activity, Zone
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher
from tests.control.conftest import cluster_config, running_cluster


def test_an_overlap_zone_without_the_memory_saver_is_refused_at_load(tiny_model_dir):
    with pytest.raises(ConfigError, match="zones.overlap needs engine.memory_saver: true"):
        _config_without_saver(tiny_model_dir, overlap=2)
    assert not _config_without_saver(tiny_model_dir, overlap=0).engine.memory_saver


def _config_without_saver(model_dir, *, overlap):
    from pearl_sglang.control.cluster_config import ClusterConfig
    from tests.control.conftest import PROFILE
    return ClusterConfig.from_mapping({
        "engine": {"kind": "emulator", "model_path": str(model_dir), "memory_saver": False,
                   "emulator": {"profile": "tiny", "time_scale": 20}},
        "zones": {"dedicated": ["d0:0"], "overlap": [f"t0:{i}" for i in range(overlap)]},
        "profile": PROFILE})


def without_saver(cluster, session):
    """Workers that run without the memory saver although the config asks for it (an
    engine flag overridden elsewhere, a different build)."""
    return InProcessEmulatorLauncher(replace(cluster.engine, memory_saver=False))


async def test_a_worker_without_the_memory_saver_is_stopped_on_return(tiny_model_dir, caplog):
    async with running_cluster(cluster_config(tiny_model_dir), launcher_factory=without_saver) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})
        await c.settle()
        borrowed = [w.slot for w in c.table.rollout_workers() if w.zone is Zone.OVERLAP]
        assert len(borrowed) == 2 and all(c.table.worker(s).activity is Activity.ACTIVE for s in borrowed)
        await c.admin("/train_begin", {"step": 1})
        assert c.table.training_owns_overlap
        assert not any(c.launcher.alive(s) for s in borrowed), "a worker that freed nothing still runs"
        # Stopped because its release freed nothing (not by the deadline after some other error).
        refused = [r.getMessage() for r in caplog.records if "could not release memory" in r.getMessage()]
        assert len(refused) == 2 and all("runs without the memory saver" in m for m in refused), refused
        assert not [w for w in c.table.rollout_workers() if w.zone is Zone.OVERLAP and w.is_member]
        assert (await c.generate([1, 2, 3], 4))["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize("interrupt", ["train_begin", "pd_mode"])
async def test_an_interrupted_reactivation_keeps_the_retained_workers(tiny_model_dir, monkeypatch, interrupt):
    # Found by fuzzing: a train_begin that cancelled the re-activation of retained overlap
    # workers before their memory came back asked them to release it again, read the
    # refusal ("already released") as a failure and killed them; the next borrow then
    # launched cold instead of resuming. A re-plan (a PD mode change) that cancelled it
    # stopped them too.
    import asyncio

    from tests.faults.support import until

    async with running_cluster(cluster_config(tiny_model_dir)) as c:
        await c.admin("/train_begin", {"step": 0})
        await c.admin("/train_finished", {"step": 0})
        await c.settle()
        borrowed = [w.slot for w in c.table.rollout_workers() if w.zone is Zone.OVERLAP]
        await c.admin("/train_begin", {"step": 1})  # released and kept
        processes = {s: c.launcher.worker(s) for s in borrowed}
        client, held = type(c.control.executor.ops), asyncio.Event()
        resume = client.resume_memory

        async def resume_later(self, url, *args, **kwargs):
            await held.wait()
            return await resume(self, url, *args, **kwargs)

        monkeypatch.setattr(client, "resume_memory", resume_later)
        await c.admin("/train_finished", {"step": 1})  # re-activation: waits before its resume
        await until(lambda: any(c.table.worker(s).activity is Activity.JOINING for s in borrowed),
                    what="the re-activation")
        if interrupt == "train_begin":
            await c.admin("/train_begin", {"step": 2})
            held.set()
            assert c.table.training_owns_overlap
            assert all(c.table.worker(s).activity is Activity.INACTIVE for s in borrowed)
        else:
            mode = asyncio.ensure_future(c.admin("/pearl/pd_mode", {"pd_mode": "colocated"}))
            await asyncio.sleep(0.2)
            held.set()
            await mode
            await c.settle()
            assert all(c.table.worker(s).activity is Activity.ACTIVE for s in borrowed)
        assert all(c.launcher.worker(s) is processes[s] for s in borrowed), "a retained worker was stopped"
