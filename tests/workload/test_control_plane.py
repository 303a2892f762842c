"""The driver as PEARL's demo job: rollout through the real router while its hooks drive
the real control plane (train_begin reclaims borrowed overlap workers mid-rollout,
train_finished lends them back), over in-process emulated workers at ``--time-scale 50``.
No turn may fail across the handoffs: partial trajectories are kept by the router."""
from __future__ import annotations

from dataclasses import replace

from pearl_rl_adapter.aio import AsyncPearlClient
from pearl_rl_adapter.config import ClientConfig
from pearl_sglang.core.state import Zone
from pearl_sglang.workload import AgenticRLDriver, DriverConfig, EmulatedTime, TrainerProfile, admin_hooks
from tests.control.conftest import TOKEN, cluster_config, running_cluster
from tests.workload.support import TINY


async def test_three_steps_with_borrowing_and_weight_pushes(tiny_model_dir):
    time = EmulatedTime(time_scale=50)
    borrowed: list[int] = []
    async with running_cluster(cluster_config(tiny_model_dir, time_scale=50)) as c:
        def count_overlap(result) -> None:
            borrowed.append(sum(w.zone is Zone.OVERLAP for w in c.table.rollout_workers()))

        async with AsyncPearlClient(config=ClientConfig(base_url=c.url, admin_token=TOKEN)) as admin:
            hooks = admin_hooks(admin, model_path=str(tiny_model_dir), run_id="demo")
            results = await AgenticRLDriver(
                c.url, workload=replace(TINY, batch_size=16), time=time, hooks=hooks,
                trainer_profile=TrainerProfile(seconds_per_step=5.0),
                config=DriverConfig(steps=3), on_step=count_overlap).run()
    assert max(borrowed) > 0  # overlap workers were lent to rollout between steps
    assert [r.weight_version for r in results] == ["demo-step-0", "demo-step-1", "demo-step-2"]
    for r in results:
        assert r.trajectories == 16 and r.errors == 0 and r.failed_trajectories == 0
        assert r.rollout_generated_tokens == sum(t.generated_tokens for t in r.telemetry)
    for first, second in zip(results, results[1:]):
        assert first.rollout_end <= second.rollout_start < first.train_end
