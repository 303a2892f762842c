"""veRL shim against a stand-in of veRL 0.9.1's PPOTrainer.fit and LLMServerClient."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pearl_rl_adapter.rollout import RolloutClient
from pearl_rl_adapter.shims import verl
from pearl_rl_adapter.shims.verl import VerlRollout


class StandInPPOTrainer:
    """``fit()``'s callback order in 0.9.1 (validation, profiling, metrics left out)."""

    def __init__(self, config):
        self.config = config
        self.global_steps = 0
        self.log: list[str] = []
        self.fail_at: int | None = None

    def fit(self, total_steps: int) -> None:
        self.on_init_end()
        self.global_steps += 1
        while self.global_steps <= total_steps:
            self.on_step_begin()
            self.step({}, {})
            self.on_step_end()
            self.global_steps += 1

    def step(self, metrics, timing_raw):
        self.on_sample_end()
        if self.global_steps == self.fail_at:
            raise RuntimeError("actor update failed")
        self.log.append(f"update_actor:{self.global_steps}")


@pytest.fixture
def trainer_cls(client, tmp_path):
    def export(trainer, step):
        trainer.log.append(f"export:{step}")
        return str(tmp_path / f"step_{step}")

    return verl.make_trainer_class(StandInPPOTrainer, hooks=lambda cfg: verl.VerlHooks(client, export_weights=export),
                                   llm_client=lambda cfg: ("llm-client", cfg))


def test_fit_brackets_every_step(trainer_cls, fake):
    trainer = trainer_cls({"k": 1})
    trainer.fit(total_steps=2)
    assert fake.order() == ["/update_weights:0",
                            "/train_begin:1", "/update_weights:1", "/train_finished:1",
                            "/train_begin:2", "/update_weights:2", "/train_finished:2"]
    assert trainer.log == ["export:0", "update_actor:1", "export:1", "update_actor:2", "export:2"]
    assert trainer_cls._enable_hybrid_replicas is False
    assert trainer.get_llm_client() == ("llm-client", {"k": 1})


def test_failed_step_still_finishes(trainer_cls, fake):
    trainer = trainer_cls({})
    trainer.fail_at = 2
    with pytest.raises(RuntimeError, match="actor update failed"):
        trainer.fit(total_steps=3)
    assert fake.order()[-2:] == ["/train_begin:2", "/train_finished:2"] and fake.open_step is None


def test_sampling_params_are_translated():
    params, logprob = verl.sglang_sampling({"max_tokens": 8, "temperature": 1.0, "logprobs": False})
    assert params == {"max_new_tokens": 8, "temperature": 1.0} and logprob is False


@dataclass
class StandInTokenOutput:
    token_ids: list
    log_probs: list | None = None
    stop_reason: str | None = None
    extra_fields: dict = field(default_factory=dict)


class StandInLLMServerClient:
    def __init__(self, config, load_balancer_handle=None, **kwargs):
        self.config, self._load_balancer = config, load_balancer_handle


async def test_llm_client_sends_turns_of_a_trajectory_to_pearl(fake, config):
    cls = verl.make_llm_client_class(StandInLLMServerClient, StandInTokenOutput)
    llm = cls({"cfg": True}, load_balancer_handle="lb")
    llm.pearl = VerlRollout(RolloutClient(config=config))
    try:
        for _ in range(2):
            out = await llm.generate("req-1", prompt_ids=[5, 6], sampling_params={"max_tokens": 2})
        await llm.generate("req-2", prompt_ids=[5], sampling_params={})
    finally:
        await llm.pearl.rollout.aclose()
    assert out == StandInTokenOutput(token_ids=[2, 3], log_probs=[-0.5, -0.25], stop_reason="completed")
    tags = [(c.headers["X-Pearl-Trajectory-Id"], c.headers["X-Pearl-Turn"]) for c in fake.calls]
    assert tags == [("req-1", "0"), ("req-1", "1"), ("req-2", "0")]
    assert fake.calls[0].body["sampling_params"] == {"max_new_tokens": 2}
    with pytest.raises(NotImplementedError):
        await llm.generate("r", prompt_ids=[1], sampling_params={}, image_data=["img"])


def test_rollout_travels_without_its_session(config):
    import pickle

    copy = pickle.loads(pickle.dumps(VerlRollout(RolloutClient(config=config))))
    assert copy.rollout.config == config
