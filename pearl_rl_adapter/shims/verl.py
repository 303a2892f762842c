"""veRL shim: a ``PPOTrainer`` subclass whose rollout is PEARL and whose steps PEARL brackets.

Verified against **verl==0.9.1** (PyPI wheel ``verl-0.9.1-py3-none-any.whl``, sha256
``db6e6f2a8d9d5808…``), hooks and signatures read from source (``trainer.use_v1=True``):

- ``verl.trainer.ppo.v1.trainer_base.PPOTrainer.__init__(self, config)``; ``fit()`` calls
  ``on_init_end(self)``, then per step ``on_step_begin(self)`` -> ``step(self, metrics,
  timing_raw)`` -> ``on_step_end(self)`` (abstract); ``on_sample_end(self)`` (abstract) runs
  inside ``step``. ``self.global_steps`` is the step (from 1).
- ``register_trainer(name)`` + ``trainer.v1.trainer_mode=pearl`` selects the trainer;
  ``_enable_hybrid_replicas = False`` keeps veRL's own SGLang replicas off the GPUs.
- ``get_llm_client(self) -> LLMServerClient``; ``verl.workers.rollout.llm_server.LLMServerClient
  .__init__(self, config, load_balancer_handle=None, **kwargs)`` and ``async generate(self,
  request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
  audio_data=None, mm_processor_kwargs=None, **kwargs) -> TokenOutput``; agent loops reuse
  one ``request_id`` per trajectory, so it is the trajectory id for PEARL's telemetry.
- ``TokenOutput(token_ids, log_probs=None, stop_reason='completed'|'aborted'|None, ...)``.

Weights: veRL has no disk export for rollouts, so ``export_weights(trainer, step) -> path``
is supplied by the user (e.g. ``actor_rollout_wg.save_checkpoint`` with HF contents, or a
checkpoint engine that writes safetensors); the shim pushes that path to PEARL.
Register with ``register(export_weights=...)`` in every process that builds the trainer
(e.g. a module listed in ``VERL_USE_EXTERNAL_MODULES``).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from pearl_rl_adapter.client import PearlClient
from pearl_rl_adapter.rollout import Generated, RolloutClient, generate_body
from pearl_rl_adapter.shims._common import StepBracket, push_from_disk
from pearl_rl_adapter.telemetry import TurnCounter

VERIFIED_VERSION = "verl 0.9.1"
TRAINER_NAME = "pearl"
ExportWeights = Callable[[Any, int], "str | None"]


class VerlHooks:
    """PEARL's side of the trainer callbacks. ``step_end`` pushes weights before
    ``train_finished`` so GPUs PEARL borrows next start on the new version."""

    def __init__(self, client: PearlClient, *, export_weights: ExportWeights) -> None:
        self.client = client
        self.export_weights = export_weights
        self.bracket = StepBracket(client)

    def init_end(self, trainer: Any) -> None:
        self.push(trainer, trainer.global_steps)

    def step_begin(self, trainer: Any) -> None:
        self.bracket.begin(trainer.global_steps)

    def step_failed(self, trainer: Any) -> None:
        self.bracket.abort()

    def step_end(self, trainer: Any) -> None:
        self.push(trainer, trainer.global_steps)
        self.bracket.finish()

    def push(self, trainer: Any, step: int) -> None:
        path = self.export_weights(trainer, step)
        if path is not None:
            push_from_disk(self.client, version=str(step), model_path=path)


def sglang_sampling(params: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """veRL passes vLLM-style keys; SGLang's ``/generate`` wants ``max_new_tokens`` and
    takes ``return_logprob`` outside ``sampling_params`` (as veRL's own SGLang server does)."""
    if not isinstance(params, Mapping):
        raise ValueError(f"sampling_params must be a mapping, got {type(params).__name__}")
    out = dict(params)
    if "max_tokens" in out and "max_new_tokens" not in out:
        out["max_new_tokens"] = out.pop("max_tokens")
    out.pop("max_tokens", None)
    return_logprob = bool(out.pop("logprobs", True))
    return out, return_logprob


def token_output_fields(generated: Generated) -> dict[str, Any]:
    return {"token_ids": list(generated.token_ids),
            "log_probs": None if generated.log_probs is None else list(generated.log_probs),
            "stop_reason": "aborted" if generated.aborted else "completed"}


class VerlRollout:
    """Framework-independent body of the veRL LLM client: one PEARL call per turn,
    tagged with the trajectory (veRL's request id) and its turn count."""

    def __init__(self, rollout: RolloutClient | None = None) -> None:
        self.rollout = rollout or RolloutClient()
        self.turns = TurnCounter()

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to agent-loop workers by Ray: the config travels, sessions do not.
        return {"config": self.rollout.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(RolloutClient(config=state["config"]))

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: Mapping[str, Any]) -> Generated:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id (veRL's per-trajectory id) must be a non-empty string, got {request_id!r}")
        params, return_logprob = sglang_sampling(sampling_params)
        body = generate_body(prompt_ids, params, return_logprob=return_logprob)
        headers = self.turns.next_turn(request_id)
        return await self.rollout.post_generate(body, headers=headers)


def make_trainer_class(base: type, *, hooks: Callable[[Any], VerlHooks], llm_client: Callable[[Any], Any]) -> type:
    """A subclass of ``base`` (``PPOTrainer``, or a stand-in) that calls ``hooks``."""

    class PearlTrainer(base):  # type: ignore[misc, valid-type]
        _enable_hybrid_replicas = False

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.pearl = hooks(config)

        def on_init_end(self) -> None:
            self.pearl.init_end(self)

        def on_step_begin(self) -> None:
            self.pearl.step_begin(self)

        def step(self, metrics: dict, timing_raw: dict) -> Any:
            try:
                return super().step(metrics, timing_raw)
            except BaseException:
                self.pearl.step_failed(self)
                raise

        def on_sample_end(self) -> None:
            return None

        def on_step_end(self) -> None:
            self.pearl.step_end(self)

        def get_llm_client(self) -> Any:
            return llm_client(self.config)

    return PearlTrainer


def make_llm_client_class(base: type, token_output: type) -> type:
    """A subclass of veRL's ``LLMServerClient`` that sends every turn to PEARL."""

    class PearlLLMClient(base):  # type: ignore[misc, valid-type]
        def __init__(self, config: Any, load_balancer_handle: Any = None, **kwargs: Any) -> None:
            super().__init__(config, load_balancer_handle=None)
            self.pearl = VerlRollout()

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                           image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                           mm_processor_kwargs: Any = None, **kwargs: Any) -> Any:
            if image_data or video_data or audio_data:
                raise NotImplementedError("PEARL's veRL shim sends token ids only (no multi-modal data)")
            generated = await self.pearl.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            return token_output(**token_output_fields(generated))

    return PearlLLMClient


# ---- glue: the only code that imports veRL ------------------------------------------------

@functools.lru_cache(maxsize=None)
def llm_client_class() -> type:
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    return make_llm_client_class(LLMServerClient, TokenOutput)


def register(*, export_weights: ExportWeights, name: str = TRAINER_NAME) -> type:
    """Register the PEARL trainer with veRL under ``trainer.v1.trainer_mode=<name>``."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer

    cls = make_trainer_class(PPOTrainer, hooks=lambda config: VerlHooks(PearlClient(), export_weights=export_weights),
                             llm_client=lambda config: llm_client_class()(config))
    return register_trainer(name)(cls)
