"""slime shim against a stand-in of slime v0.3.1's RayTrainGroup and train_async loop."""
from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from pearl_rl_adapter.shims import slime


class StandInTrainGroup:
    """The v0.3.1 methods the shim patches, with the same call sequence (no Ray)."""

    def __init__(self, args: Namespace, log: list[str], role: str = "actor") -> None:
        self.args, self.log, self.role = args, log, role
        self._actor_handlers: list[str] = []
        self._disk_weight_version = 0
        self.fail_next_create = False

    def create(self, rollout_manager=None):
        if self._actor_handlers:
            return None
        if self.fail_next_create:
            raise RuntimeError("actor init failed")
        self._actor_handlers = ["megatron-0"]
        self.log.append("create")
        return [0]

    def release(self):
        actors, self._actor_handlers = self._actor_handlers, []
        if actors:
            self.log.append("release")

    def async_train(self, rollout_id, rollout_data_ref, external_data=None):
        self.log.append(f"train:{rollout_id}")

    def update_weights(self):
        weight_version = self._disk_weight_version + 1
        disk_weight_dir = Path(self.args.update_weight_disk_dir) / f"weight_v{weight_version:06d}"
        disk_weight_dir.mkdir(parents=True)  # what the Megatron actors write
        self._disk_weight_version = weight_version
        if self.args.release_train:
            self.release()
        self._reload_rollout_weights_from_disk(disk_weight_dir, str(weight_version))

    def _reload_rollout_weights_from_disk(self, disk_weight_dir, weight_version):
        raise AssertionError("slime's per-engine reload must be replaced")


def train_async(actor_model: StandInTrainGroup, num_rollout: int) -> None:
    """train_async.py's order: initial create + weight sync, then per rollout."""
    actor_model.create()  # create_training_models
    actor_model.update_weights()
    for rollout_id in range(num_rollout):
        actor_model.create()
        actor_model.async_train(rollout_id, None)
        actor_model.update_weights()


@pytest.fixture
def args(tmp_path) -> Namespace:
    return Namespace(release_train=True, update_weight_mode="full", update_weight_transport="disk",
                     update_weight_disk_dir=str(tmp_path / "weights"), update_weight_local_checkpoint_dir=None,
                     sglang_router_ip="127.0.0.1", debug_train_only=False, debug_rollout_only=False)


@pytest.fixture
def patched(client):
    cls = type("TrainGroup", (StandInTrainGroup,), {})
    hooks = slime.SlimeHooks(client)
    restore = slime.patch_train_group(cls, hooks)
    yield cls, hooks
    restore()


def test_steps_are_bracketed_and_weights_pushed(patched, args, fake, tmp_path):
    cls, _ = patched
    log: list[str] = []
    train_async(cls(args, log), num_rollout=2)
    assert fake.order() == [
        "/train_begin:0", "/update_weights:1", "/train_finished:0",
        "/train_begin:1", "/update_weights:2", "/train_finished:1",
        "/train_begin:2", "/update_weights:3", "/train_finished:2",
    ]
    assert log == ["create", "release", "create", "train:0", "release", "create", "train:1", "release"]
    assert fake.calls[1].body["model_path"].endswith("weight_v000001")
    # the newest weights stay on disk: PEARL reloads them into workers it activates later
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["weight_v000003"]


def test_failed_create_closes_the_step(patched, args, fake):
    cls, _ = patched
    group = cls(args, [])
    group.fail_next_create = True
    with pytest.raises(RuntimeError, match="actor init failed"):
        group.create()
    assert fake.order() == ["/train_begin:0", "/train_finished:0"]


def test_other_roles_are_left_alone(patched, args, fake):
    cls, _ = patched
    critic = cls(args, [], role="critic")
    critic.create()
    critic.release()
    assert fake.order() == []


def test_restore_undoes_the_patch(client):
    cls = type("TrainGroup", (StandInTrainGroup,), {})
    slime.patch_train_group(cls, slime.SlimeHooks(client))()
    assert "create" not in cls.__dict__ and cls.create is StandInTrainGroup.create


def test_actor_writes_weights_without_slime_engines(args):
    written = []
    actor_cls = type("Actor", (), {"update_weights": lambda self: None})
    actor = actor_cls()
    actor.args, actor.weight_updater = args, Namespace(update_weights=lambda: written.append(1))
    restore = slime.patch_megatron_actor(actor_cls)
    actor.update_weights()
    restore()
    actor.update_weights()
    assert written == [1]


def test_router_args_and_check_args(args):
    flags = slime.router_args("http://pearl:30000")
    assert flags[:4] == ["--sglang-router-ip", "pearl", "--sglang-router-port", "30000"]
    assert slime.INIT_PATH in flags
    slime.check_args(args)
    args.release_train, args.update_weight_transport = False, "nccl"
    with pytest.raises(ValueError, match="release-train.*transport disk"):
        slime.check_args(args)
    with pytest.raises(ValueError):
        slime.router_args("http://pearl")
