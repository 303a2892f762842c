"""What ``training_step()`` does when both the update and ``train_finished`` fail.

The update's own error is the one the trainer must see (it is why the step failed), so
it is re-raised; the ``train_finished`` failure is logged and attached to it as a note,
because PEARL now believes training still holds its GPUs and an operator has to know.
"""
from __future__ import annotations

import logging

log = logging.getLogger("pearl.adapter")


def note_unfinished(step: int, body_error: BaseException, finish_error: BaseException) -> None:
    log.error("step %d failed (%r) and train_finished failed too: %s", step, body_error, finish_error)
    note = f"PEARL train_finished for step {step} also failed: {finish_error}"
    add_note = getattr(body_error, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(note)
