"""What every shim needs: a step bracket that survives callbacks firing separately,
and retirement of weight directories PEARL no longer needs.

Frameworks do not give one place that wraps a whole update; ``train_begin`` and
``train_finished`` land in different callbacks, sometimes more than once per step.
``StepBracket`` keeps them paired: a repeated begin for the open step is a no-op, a
begin while another step is open closes that one first (PEARL would answer 409), a
failed ``train_finished`` keeps the step open so the next attempt closes it, and a
``train_begin`` that timed out keeps its step open as unsure (PEARL may still act on it),
so neither the next begin nor the next finish is refused for it.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from pearl_rl_adapter.client import PearlClient
from pearl_rl_adapter.errors import PearlConflict, PearlTimeout
from pearl_rl_adapter.results import TrainBegun, TrainFinished, WeightsUpdated

log = logging.getLogger("pearl.adapter")


class StepBracket:
    def __init__(self, client: PearlClient, *, deadline_s: float | None = None) -> None:
        self.client = client
        self.deadline_s = deadline_s
        self.open_step: int | None = None
        # The open step's train_begin timed out: PEARL may still begin it, or never got it.
        # The next begin repeats it under the same request_id (PEARL answers the first
        # call's outcome) and a finish that PEARL finds out of order closes nothing.
        self._unsure_id: str | None = None

    def begin(self, step: int) -> TrainBegun | None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if self.open_step == step and self._unsure_id is None:
            return None
        if self.open_step is not None and self.open_step != step:
            log.warning("train_begin(%d) while step %d is still open; finishing it first", step, self.open_step)
            try:
                self.finish()
            except PearlConflict as e:  # PEARL holds no open step: nothing left to close
                log.warning("step %d was not open at PEARL (%s); beginning step %d", self.open_step, e, step)
        request_id = self._unsure_id if self.open_step == step else None
        try:
            begun = self.client.train_begin(step, deadline_s=self.deadline_s, request_id=request_id)
        except PearlTimeout as e:
            self.open_step, self._unsure_id = step, e.request_id
            raise
        self.open_step, self._unsure_id = step, None
        return begun

    def finish(self) -> TrainFinished | None:
        if self.open_step is None:
            return None
        step, unsure = self.open_step, self._unsure_id is not None
        try:
            finished = self.client.train_finished(step)
        except PearlConflict:
            self.open_step, self._unsure_id = None, None  # PEARL holds no open step: nothing left to close
            if unsure:
                log.warning("train_begin(%d) had timed out and PEARL never began it: nothing to finish", step)
                return None
            raise
        self.open_step, self._unsure_id = None, None
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
        if not isinstance(path, (str, Path)) or not str(path):
            raise ValueError(f"a weight directory must be a path, got {path!r}")
        path = Path(path)
        previous, self.current = self.current, path
        if not self.keep and previous is not None and previous != path:
            shutil.rmtree(previous, ignore_errors=True)


EXPORT_ENV = "PEARL_EXPORT_WEIGHTS"


def load_function(path: str):  # -> Callable
    """``"package.module:function"`` (or dotted) to the function, for hooks that are
    named in a framework's YAML or environment rather than passed in code."""
    import importlib

    if not isinstance(path, str):
        raise ValueError(f"expected 'package.module:function', got {path!r}")
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    if not module or not name:
        raise ValueError(f"expected 'package.module:function', got {path!r}")
    try:
        function = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ValueError(f"cannot import {module!r} for {path!r}: {e}") from e
    except AttributeError:
        raise ValueError(f"module {module!r} has no {name!r} (from {path!r})") from None
    if not callable(function):
        raise ValueError(f"{path!r} is not a function")
    return function
