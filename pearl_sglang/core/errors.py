"""One error hierarchy for the pure core.

The shell maps these to its own responses (HTTP 409 for an illegal transition, exit
code 2 in the CLI for bad input).  Every error that concerns a named input carries that
name in ``key`` so callers can point at it without parsing messages.
"""
from __future__ import annotations


class CoreError(Exception):
    """Base of every error the core raises on purpose."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class InvalidConfig(CoreError, ValueError):
    """A configuration value (thresholds, constraints, budget) is out of range."""


class InvalidProfile(InvalidConfig):
    """A profile symbol is missing, not a number, or outside its physical range."""


class InvalidSnapshot(CoreError, ValueError):
    """A serialized table, record or plan cannot be read back."""


class InvariantViolation(CoreError):
    """An update would produce a table that breaks a state invariant."""


class InvalidTransition(CoreError):
    """An event does not apply to the current state (wrong activity, unknown GPU...)."""


class UnknownWorker(InvalidTransition):
    """An event names a slot that holds no worker."""


class InfeasibleTarget(CoreError):
    """The planner cannot reach the target with the GPUs available."""


class OutOfOrder(CoreError):
    """A trainer call that contradicts the training state (two train_begin, a
    train_finished without its begin)."""
