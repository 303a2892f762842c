"""ROLL shim: PEARL brackets each ``AgenticPipeline`` step and receives its weights.

Verified against ROLL **v0.3.0** (alibaba/ROLL tag ``v0.3.0``, commit
``7f9d4d3873a87679c8d070085a4bd3bdeea7e589``), hooks and signatures read from source:

- ``roll.pipeline.agentic.agentic_pipeline.AgenticPipeline.__init__(self, pipeline_config)``
  and ``run(self)``: per ``global_step``, PHASE 1 ``self.actor_train.offload_states(...)``,
  PHASE 3 ``self.model_update(global_step)``, rollout (``get_batch``), then training:
  ``self.actor_train.compute_log_probs(batch, blocking=...)`` and
  ``self.actor_train.train_step(batch, blocking=False)``.
- ``roll.pipeline.base_pipeline.BasePipeline.model_update(self, global_step) -> dict``:
  overridden to push the weights to PEARL after ROLL's own sync, then ``train_finished``
  (it runs after ``offload_states``, at the start of the *next* step).
- The first ``compute_log_probs``/``train_step`` call of a step (wrapped on the
  ``actor_train`` cluster) opens the step with ``train_begin``: that is when training
  needs its GPUs back.
- YAML ``pipeline_cls: pearl_rl_adapter.shims.roll.PearlAgenticPipeline`` selects it
  (``examples/start_agentic_pipeline.py`` resolves it with ``safe_import_class``).

Weights: ROLL has no HF export for rollouts; ``export_weights(pipeline, global_step) ->
path`` comes from the user (``PEARL_EXPORT_WEIGHTS=package.module:function`` for the
YAML route). Rollout: ROLL v0.3.0 has no setting for an external router (it always
builds ``actor_infer`` and its ``RouterManager``). With ``router.router_cls`` set to its
``SglangRouter``, ``patch_sglang_router`` (applied in the process that builds the router)
makes it use PEARL instead of launching sglang-router: ROLL's engines are registered with
PEARL (``POST /workers``, as ROLL does on expand), ROLL waits for them as it does
(``GET /workers``), and its aborts by rid go to PEARL rather than to every worker
(``router.py:740``), which PEARL would take for lost workers and resubmit. ROLL's
``abort_all_worker`` (``router.py:755``, ``abort_all`` on every worker after a shrink or
an expand, so that sglang-router re-schedules) becomes a no-op: PEARL moves a removed
worker's requests itself, and an ``abort_all`` would cost every request in flight on every
worker a resubmission.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

from pearl_rl_adapter.client import PearlClient
from pearl_rl_adapter.shims._common import EXPORT_ENV, StepBracket, load_function, push_from_disk

VERIFIED_VERSION = "ROLL v0.3.0 (7f9d4d3873a87679c8d070085a4bd3bdeea7e589)"
TRAINING_CALLS = ("compute_log_probs", "train_step")
ExportWeights = Callable[[Any, int], "str | None"]
log = logging.getLogger("pearl.adapter")


class RollHooks:
    """PEARL's side of the pipeline: ``model_update`` names the step, the first
    training call opens it, the next ``model_update`` (or the end of ``run``) closes it
    after pushing that step's weights."""

    def __init__(self, client: PearlClient, *, export_weights: ExportWeights | None) -> None:
        self.client = client
        self.export_weights = export_weights
        self.bracket = StepBracket(client)
        self.current_step: int | None = None

    def training_call(self) -> None:
        if self.current_step is not None:
            self.bracket.begin(self.current_step)

    def after_model_update(self, pipeline: Any, global_step: int) -> None:
        self._push(pipeline, global_step)
        self.bracket.finish()
        self.current_step = global_step

    def run_ended(self, pipeline: Any) -> None:
        if self.bracket.open_step is not None:
            self._push(pipeline, self.bracket.open_step + 1)
        self.bracket.finish()

    def run_failed(self) -> None:
        self.bracket.abort()

    def _push(self, pipeline: Any, version: int) -> None:
        if self.export_weights is None:
            return
        path = self.export_weights(pipeline, version)
        if path is not None:
            push_from_disk(self.client, version=str(version), model_path=path)


def wrap_training_calls(cluster: Any, hooks: RollHooks, names: tuple[str, ...] = TRAINING_CALLS) -> None:
    """Open the step before the cluster's first training call; patched on this
    instance only, so ROLL's ``Cluster`` class and its other clusters stay untouched."""
    for name in names:
        setattr(cluster, name, _hook_first(getattr(cluster, name), hooks.training_call))


def _hook_first(original: Callable[..., Any], hook: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        hook()
        return original(*args, **kwargs)

    return wrapped


def make_pipeline_class(base: type, *, hooks: Callable[[Any], RollHooks]) -> type:
    """A subclass of ``base`` (``AgenticPipeline``, or a stand-in) that calls ``hooks``."""

    class PearlAgenticPipeline(base):  # type: ignore[misc, valid-type]
        def __init__(self, pipeline_config: Any) -> None:
            super().__init__(pipeline_config)
            self.pearl = hooks(pipeline_config)
            wrap_training_calls(self.actor_train, self.pearl)

        def model_update(self, global_step: int) -> dict:
            metrics = super().model_update(global_step)
            self.pearl.after_model_update(self, global_step)
            return metrics

        def run(self) -> None:
            try:
                super().run()
            except BaseException:
                self.pearl.run_failed()
                raise
            self.pearl.run_ended(self)

    return PearlAgenticPipeline


def hooks_from_env(pipeline_config: Any) -> RollHooks:
    export = os.environ.get(EXPORT_ENV)
    if export is None:
        log.warning("%s is not set: PEARL brackets steps but receives no weights", EXPORT_ENV)
    return RollHooks(PearlClient(), export_weights=load_function(export) if export else None)


def patch_sglang_router(cls: type, *, router_url: str, wait_workflow: Callable[[str, Any], Any],
                        token: str | None = None) -> Callable[[], None]:
    """Patch ROLL's ``SglangRouter`` (or a stand-in with its methods) to use the PEARL at
    ``router_url``; ``wait_workflow`` is ROLL's ``wait_sglang_router_workflow``. Returns a
    function that undoes the patch."""
    import asyncio
    from urllib.parse import urlsplit

    from pearl_rl_adapter.shims.router_abort import abort_through_router

    parts = urlsplit(router_url)
    saved = {name: cls.__dict__.get(name) for name in ("initialize", "abort_requests", "abort_all_worker")}

    async def initialize(self: Any) -> None:
        import httpx

        self.router_ip, self.router_port = parts.hostname, parts.port
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None), headers=headers)
        self.worker_urls = await asyncio.gather(*[worker.get_url.remote() for worker in self.workers])
        self.router_process = None
        await self.post_workers(self.worker_urls)
        await wait_workflow(router_url.rstrip("/"), self.worker_urls)

    async def abort_requests(self: Any, request_ids: Any, uid: Any) -> None:
        await abort_through_router(router_url, rids=[str(r) for r in request_ids], api_key=token)

    async def abort_all_worker(self: Any, url: str) -> None:
        log.info("not aborting every request on %s: PEARL moves requests itself", url)

    cls.initialize, cls.abort_requests, cls.abort_all_worker = initialize, abort_requests, abort_all_worker

    def restore() -> None:
        for name, fn in saved.items():
            if fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, fn)

    return restore


# ---- glue: the only code that imports ROLL -------------------------------------------------

@functools.lru_cache(maxsize=None)
def pipeline_class() -> type:
    from roll.pipeline.agentic.agentic_pipeline import AgenticPipeline

    return make_pipeline_class(AgenticPipeline, hooks=hooks_from_env)


def __getattr__(name: str) -> Any:
    # ``pipeline_cls: pearl_rl_adapter.shims.roll.PearlAgenticPipeline`` in ROLL's YAML;
    # built on first access so importing this module does not import ROLL.
    if name == "PearlAgenticPipeline":
        return pipeline_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install_router(client: PearlClient | None = None) -> Callable[[], None]:
    """Make ROLL's ``SglangRouter`` use PEARL in this process."""
    from roll.distributed.scheduler import router as roll_router

    cfg = (client or PearlClient()).config
    return patch_sglang_router(roll_router.SglangRouter, router_url=cfg.root,
                               wait_workflow=roll_router.wait_sglang_router_workflow,
                               token=cfg.admin_token or cfg.api_key)
