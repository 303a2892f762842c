"""ROLL shim against a stand-in of ROLL v0.3.0's AgenticPipeline.run."""
from __future__ import annotations

import pytest

from pearl_rl_adapter.shims import roll


class StandInCluster:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def offload_states(self, blocking=False):
        self.log.append("offload")

    def compute_log_probs(self, batch, blocking=False):
        self.log.append("log_probs")

    def train_step(self, batch, blocking=False):
        self.log.append("train_step")


class StandInAgenticPipeline:
    """``run()``'s phase order per global_step, and ``BasePipeline.model_update``."""

    def __init__(self, pipeline_config):
        self.pipeline_config = pipeline_config
        self.log: list[str] = []
        self.actor_train = StandInCluster(self.log)

    def model_update(self, global_step):
        self.log.append(f"model_update:{global_step}")
        return {"time/model_update": 0.0}

    def run(self):
        for global_step in range(self.pipeline_config["max_steps"]):
            self.actor_train.offload_states(blocking=True)      # PHASE 1
            self.model_update(global_step)                       # PHASE 3
            self.log.append("get_batch")                         # PHASE 7 (rollout)
            self.actor_train.compute_log_probs("batch", blocking=True)
            if global_step == self.pipeline_config.get("fail_at"):
                raise RuntimeError("reward worker died")
            self.actor_train.train_step("batch", blocking=False)  # PHASE 14


@pytest.fixture
def pipeline_cls(client, tmp_path):
    export = lambda pipeline, step: str(tmp_path / f"hf_{step}")  # noqa: E731
    return roll.make_pipeline_class(StandInAgenticPipeline,
                                    hooks=lambda cfg: roll.RollHooks(client, export_weights=export))


def test_run_brackets_each_steps_training(pipeline_cls, fake):
    pipeline = pipeline_cls({"max_steps": 2})
    pipeline.run()
    assert fake.order() == ["/update_weights:0", "/train_begin:0",
                            "/update_weights:1", "/train_finished:0", "/train_begin:1",
                            "/update_weights:2", "/train_finished:1"]
    assert pipeline.log == ["offload", "model_update:0", "get_batch", "log_probs", "train_step",
                            "offload", "model_update:1", "get_batch", "log_probs", "train_step"]
    assert fake.calls[2].body["model_path"].endswith("hf_1")


def test_failed_run_closes_the_open_step(pipeline_cls, fake):
    with pytest.raises(RuntimeError, match="reward worker died"):
        pipeline_cls({"max_steps": 3, "fail_at": 1}).run()
    assert fake.order()[-2:] == ["/train_begin:1", "/train_finished:1"] and fake.open_step is None


def test_without_an_exporter_steps_are_still_bracketed(client, fake):
    hooks = lambda cfg: roll.RollHooks(client, export_weights=None)  # noqa: E731
    cls = roll.make_pipeline_class(StandInAgenticPipeline, hooks=hooks)
    cls({"max_steps": 2}).run()
    assert fake.order() == ["/train_begin:0", "/train_finished:0", "/train_begin:1", "/train_finished:1"]


def test_pipeline_class_is_built_lazily():
    with pytest.raises(ModuleNotFoundError, match="roll"):
        roll.PearlAgenticPipeline
    with pytest.raises(AttributeError):
        roll.NoSuchThing
