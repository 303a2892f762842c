"""Errors of the RL driver, split by what the caller can do about them.

``GenerateRetryable`` (5xx, 408, 429, connection loss, timeout) is worth another try
with the same context; ``GenerateRejected`` (other 4xx, a malformed answer) will fail
the same way again.  ``GenerateFailed`` ends one trajectory after its attempts are
spent; ``TrainingFailed`` ends the run, after ``train_finished`` was still sent.
"""
from __future__ import annotations


class WorkloadError(Exception):
    """Base of every error the workload driver raises on purpose."""


class GenerateError(WorkloadError):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GenerateRetryable(GenerateError):
    """A transient failure: the router or a worker could not serve the turn now."""


class GenerateRejected(GenerateError):
    """A permanent failure: the request or the answer itself is wrong."""


class GenerateFailed(WorkloadError):
    """A turn failed after ``attempts`` tries; the trajectory ends there."""

    def __init__(self, message: str, *, errors: tuple[str, ...]) -> None:
        super().__init__(message)
        self.errors = errors
        self.attempts = len(errors)


class TrainingFailed(WorkloadError):
    """The trainer raised during a step; the run stops after cleaning up."""

    def __init__(self, step: int) -> None:
        super().__init__(f"training step {step} failed")
        self.step = step
