"""slime shim: PEARL brackets slime's ``--release-train`` cycle and serves its rollouts.

Verified against slime **v0.3.1** (THUDM/slime tag ``v0.3.1``, commit
``a6272da0d4f3d0a08520c99a2f3b4f6c887960dc``), hooks and signatures read from source:

- ``slime.ray.actor_group.RayTrainGroup.create(self, rollout_manager=None)``: re-creates
  the Megatron actors each step under ``--release-train`` (no-op if they exist) -> wrapped:
  ``train_begin`` first, so PEARL hands the training GPUs back before actors start.
- ``RayTrainGroup.release(self)``: kills the actors after the checkpoint is written ->
  wrapped: the step is ``train_finished`` once the weights below are pushed.
- ``RayTrainGroup._reload_rollout_weights_from_disk(self, disk_weight_dir, weight_version)``:
  called by ``RayTrainGroup.update_weights(self)`` right after ``release()`` -> replaced:
  one ``POST /update_weights`` with ``model_path`` instead of per-engine reloads.
- ``slime.backends.megatron_utils.actor.MegatronTrainRayActor.update_weights(self) -> None``
  returns early when slime runs no SGLang engines, before writing the checkpoint ->
  replaced in each actor through ``--custom-megatron-init-path`` (``custom_init(args)``).
- Rollout: ``--sglang-router-ip/--sglang-router-port`` make slime use PEARL as its router
  (``_start_router`` launches none); ``--rollout-num-gpus 0`` starts no local engines.

Run ``python -m pearl_rl_adapter.shims.slime train_async.py <slime flags> $(router_args)``
or call ``launch()``.

End of rollout: slime's ``abort()`` (``slime/rollout/sglang_rollout.py:337``) lists the
router's workers (``GET /workers``, line 344) and aborts every one of them directly
(``abort_servers_until_idle``: ``POST /abort_request {"abort_all": true}`` per worker, then
``GET /v1/loads?include=core`` until idle, ``server_control.py:34,40``). Behind PEARL a
worker-side abort that PEARL did not order looks like a lost worker: PEARL resubmits the
request elsewhere with its partial output, so slime's requests would not come back aborted
and its idle check would keep finding them. ``install()`` therefore replaces
``abort_servers_until_idle`` with one abort sent to PEARL (``abort_through_router``), which
ends every in-flight request and returns its partial output, as slime expects.
"""
from __future__ import annotations

import functools
import logging
import runpy
import sys
from typing import Any, Callable
from urllib.parse import urlsplit

from pearl_rl_adapter.client import PearlClient
from pearl_rl_adapter.results import WeightsUpdated
from pearl_rl_adapter.shims._common import StepBracket, WeightDirs, push_from_disk
from pearl_rl_adapter.shims.router_abort import abort_through_router

VERIFIED_VERSION = "slime v0.3.1 (a6272da0d4f3d0a08520c99a2f3b4f6c887960dc)"
INIT_PATH = "pearl_rl_adapter.shims.slime.megatron_init"
log = logging.getLogger("pearl.adapter")


def router_args(base_url: str) -> list[str]:
    """slime flags that send rollouts to PEARL and let PEARL own the rollout GPUs."""
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname, parts.port
    except (TypeError, ValueError, AttributeError):
        host = port = None
    if not host or not port:
        raise ValueError(f"base_url needs a host and a port, got {base_url!r}")
    return ["--sglang-router-ip", host, "--sglang-router-port", str(port),
            "--rollout-num-gpus", "0", "--release-train", "--update-weight-mode", "full",
            "--update-weight-transport", "disk", "--custom-megatron-init-path", INIT_PATH]


def check_args(args: Any) -> None:
    """Refuse slime settings under which these hooks would not fire or PEARL could not
    load the weights (slime's own parser checks the rest, e.g. ``--save``)."""
    problems = []
    if not getattr(args, "release_train", False):
        problems.append("--release-train is required (it is what frees the training GPUs each step)")
    if getattr(args, "update_weight_transport", None) != "disk" or getattr(args, "update_weight_mode", None) != "full":
        problems.append("--update-weight-mode full --update-weight-transport disk is required")
    if not getattr(args, "update_weight_disk_dir", None):
        problems.append("--update-weight-disk-dir must be a directory that PEARL's workers can read")
    if getattr(args, "update_weight_local_checkpoint_dir", None):
        problems.append("--update-weight-local-checkpoint-dir is not supported: PEARL loads the shared dir")
    if not getattr(args, "sglang_router_ip", None):
        problems.append("--sglang-router-ip/--sglang-router-port must point at PEARL")
    if problems:
        raise ValueError("slime is not set up for PEARL: " + "; ".join(problems))


class SlimeHooks:
    """What PEARL does at each ``RayTrainGroup`` call; the patches below only route to it.

    Every ``create()`` that starts actors opens a step, numbered from 0 (slime passes no
    rollout id there). The step closes after the new weights are pushed, not at
    ``release()``, so GPUs PEARL borrows next already serve the new version.
    """

    def __init__(self, client: PearlClient, *, keep_weight_dirs: bool = False) -> None:
        self.client = client
        self.bracket = StepBracket(client)
        self.weight_dirs = WeightDirs(keep=keep_weight_dirs)
        self.next_step = 0
        self.released = False

    def before_create(self, group: Any) -> None:
        if group.role == "actor" and not group._actor_handlers:
            self.bracket.begin(self.next_step)

    def create_failed(self, group: Any) -> None:
        if group.role == "actor":
            self.bracket.abort()

    def after_release(self, group: Any, *, had_actors: bool) -> None:
        if group.role == "actor" and had_actors:
            self.released = True

    def reload_from_disk(self, group: Any, disk_weight_dir: Any, weight_version: str) -> WeightsUpdated:
        result = push_from_disk(self.client, version=str(weight_version), model_path=disk_weight_dir)
        self.weight_dirs.loaded(disk_weight_dir)
        if self.released and self.bracket.open_step is not None:
            self.bracket.finish()
            self.next_step += 1
        self.released = False
        return result


def patch_train_group(cls: type, hooks: SlimeHooks) -> Callable[[], None]:
    """Patch ``RayTrainGroup`` (or a stand-in with the same methods) in place, because
    slime constructs it itself; returns a function that undoes the patch."""
    original = {name: getattr(cls, name) for name in ("create", "release", "_reload_rollout_weights_from_disk")}

    @functools.wraps(original["create"])
    def create(self: Any, rollout_manager: Any = None) -> Any:
        hooks.before_create(self)
        try:
            return original["create"](self, rollout_manager)
        except BaseException:
            hooks.create_failed(self)
            raise

    @functools.wraps(original["release"])
    def release(self: Any) -> None:
        had_actors = bool(self._actor_handlers)
        original["release"](self)
        hooks.after_release(self, had_actors=had_actors)

    @functools.wraps(original["_reload_rollout_weights_from_disk"])
    def reload(self: Any, disk_weight_dir: Any, weight_version: str) -> None:
        hooks.reload_from_disk(self, disk_weight_dir, weight_version)

    return _replace(cls, {"create": create, "release": release, "_reload_rollout_weights_from_disk": reload})


def _replace(cls: type, methods: dict[str, Callable[..., Any]]) -> Callable[[], None]:
    """Set ``methods`` on ``cls``; the returned function puts back what was there."""
    saved = {name: cls.__dict__.get(name) for name in methods}
    for name, fn in methods.items():
        setattr(cls, name, fn)

    def restore() -> None:
        for name, fn in saved.items():
            if fn is None:
                delattr(cls, name)
            else:
                setattr(cls, name, fn)

    return restore


def write_weights(actor: Any) -> None:
    """Actor-side ``update_weights`` in PEARL mode: always write the HF checkpoint
    (slime skips it when it runs no engines of its own, which is PEARL's setup)."""
    if actor.args.debug_train_only or actor.args.debug_rollout_only:
        return
    actor.weight_updater.update_weights()


def patch_megatron_actor(cls: type) -> Callable[[], None]:
    original = getattr(cls, "update_weights")
    return _replace(cls, {"update_weights": functools.wraps(original)(lambda self: write_weights(self))})


def patch_rollout_abort(module: Any, router_url: str, *, api_key: str | None = None) -> Callable[[], None]:
    """Make ``module.abort_servers_until_idle(urls)`` (slime's, as imported by its rollout
    module) abort through PEARL; returns a function that undoes the patch."""
    original = module.abort_servers_until_idle

    async def abort_servers_until_idle(urls: list[str]) -> None:
        count = await abort_through_router(router_url, api_key=api_key)
        log.info("aborted %d in-flight requests at PEARL (instead of %d workers directly)", count, len(urls))

    module.abort_servers_until_idle = abort_servers_until_idle

    def restore() -> None:
        module.abort_servers_until_idle = original

    return restore


# ---- glue: the only code that imports slime ---------------------------------------------

def install(client: PearlClient | None = None, *, keep_weight_dirs: bool = False) -> SlimeHooks:
    """Patch slime's driver; call before slime's ``train(args)`` runs."""
    import slime.rollout.sglang_rollout as rollout
    from slime.ray.actor_group import RayTrainGroup

    hooks = SlimeHooks(client or PearlClient(), keep_weight_dirs=keep_weight_dirs)
    patch_train_group(RayTrainGroup, hooks)
    cfg = hooks.client.config
    patch_rollout_abort(rollout, cfg.root, api_key=cfg.api_key or cfg.admin_token)
    return hooks


def megatron_init(args: Any) -> None:
    """``--custom-megatron-init-path`` target; runs inside every Megatron actor."""
    from slime.backends.megatron_utils.actor import MegatronTrainRayActor

    check_args(args)
    patch_megatron_actor(MegatronTrainRayActor)


def launch(script: str, argv: list[str] | None = None, *, client: PearlClient | None = None) -> None:
    """Run slime's unmodified training script (``train_async.py``) with the patches."""
    install(client)
    sys.argv = [script, *(argv if argv is not None else sys.argv[2:])]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m pearl_rl_adapter.shims.slime train_async.py [slime flags]")
    launch(sys.argv[1])
