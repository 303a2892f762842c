"""What ``training_step()`` does at its end: the count of trajectories still running it
sends with ``train_finished``, and what it does when both the update and
``train_finished`` fail.

The count comes from a callable the trainer passes; ``train_finished`` must be sent
whatever it does (until then PEARL keeps the training GPUs out of rollout), so a
callable that raises or answers something other than a non-negative int is logged and
the call goes without a count (the router then counts every trajectory it saw).

The update's own error is the one the trainer must see (it is why the step failed), so
it is re-raised; the ``train_finished`` failure is logged and attached to it as a note,
because PEARL now believes training still holds its GPUs and an operator has to know.
"""
from __future__ import annotations

import logging
from typing import Callable

from pearl_rl_adapter.protocol import trajectory_count

log = logging.getLogger("pearl.adapter")


def remaining_now(remaining: Callable[[], int | None] | None) -> int | None:
    """What ``remaining`` answers, when that is usable (module docstring)."""
    if remaining is None:
        return None
    try:
        count = remaining()
    except Exception as e:  # noqa: BLE001 - train_finished must still be sent
        log.warning("remaining() failed (%r); train_finished goes without a count", e)
        return None
    try:
        return None if count is None else trajectory_count(count)
    except ValueError as e:
        log.warning("remaining(): %s; train_finished goes without a count", e)
        return None


def note_unfinished(step: int, body_error: BaseException, finish_error: BaseException) -> None:
    log.error("step %d failed (%r) and train_finished failed too: %s", step, body_error, finish_error)
    note = f"PEARL train_finished for step {step} also failed: {finish_error}"
    add_note = getattr(body_error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(note)
