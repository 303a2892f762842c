"""What every shim needs: a step bracket that survives callbacks firing separately,
and retirement of weight directories PEARL no longer needs.

Frameworks do not give one place that wraps a whole update; ``train_begin`` and
``train_finished`` land in different callbacks, sometimes more than once per step.
``StepBracket`` keeps them paired: a repeated begin for the open step is a no-op, a
begin while another step is open closes that one first (PEARL would answer 409), and a
failed ``train_finished`` keeps the step open so the next attempt closes it.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from pearl_rl_adapter.client import PearlClient
from pearl_rl_adapter.errors import PearlConflict
from pearl_rl_adapter.results import TrainBegun, TrainFinished, WeightsUpdated

log = logging.getLogger("pearl.adapter")


class StepBracket:
    def __init__(self, client: PearlClient, *, deadline_s: float | None = None) -> None:
        self.client = client
        self.deadline_s = deadline_s
        self.open_step: int | None = None

    def begin(self, step: int) -> TrainBegun | None:
        if self.open_step == step:
            return None
        if self.open_step is not None:
            log.warning("train_begin(%d) while step %d is still open; finishing it first", step, self.open_step)
            self.finish()
        begun = self.client.train_begin(step, deadline_s=self.deadline_s)
        self.open_step = step
        return begun

    def finish(self) -> TrainFinished | None:
        if self.open_step is None:
            return None
        try:
            finished = self.client.train_finished(self.open_step)
        except PearlConflict:
            self.open_step = None  # PEARL holds no open step: nothing left to close
            raise
        self.open_step = None
        return finished

    def abort(self) -> None:
        """Close the step after the training step itself failed; that failure is the
        one to report, so a failure here is only logged."""
        try:
            self.finish()
        except Exception as e:  # noqa: BLE001 - the training error propagates instead
            log.error("train_finished after a failed step also failed: %s", e)


def push_from_disk(client: PearlClient, *, version: str, model_path: str | Path) -> WeightsUpdated:
    result = client.update_weights_from_disk(version=str(version), model_path=str(model_path))
    if result.failed:
        log.warning("weights %s not loaded on %s; PEARL resyncs them before admission", version, dict(result.failed))
    return result


class WeightDirs:
    """Deletes a weight directory once a newer one is loaded. The newest must stay:
    PEARL reloads it into every worker it activates later (borrowed GPUs, joins)."""

    def __init__(self, *, keep: bool = False) -> None:
        self.keep = keep
        self.current: Path | None = None

    def loaded(self, path: str | Path) -> None:
        path = Path(path)
        previous, self.current = self.current, path
        if not self.keep and previous is not None and previous != path:
            shutil.rmtree(previous, ignore_errors=True)


EXPORT_ENV = "PEARL_EXPORT_WEIGHTS"


def load_function(path: str):  # -> Callable
    """``"package.module:function"`` (or dotted) to the function, for hooks that are
    named in a framework's YAML or environment rather than passed in code."""
    import importlib

    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not name:
        raise ValueError(f"expected 'package.module:function', got {path!r}")
    return getattr(importlib.import_module(module), name)
