"""Trajectory identity on rollout requests, for PEARL's cache affinity and profile.

PEARL's router reads ``X-Pearl-Trajectory-Id`` and ``X-Pearl-Turn`` (0-based) on
``/generate``; without them it guesses continuation from prompt prefixes, which
conflates GRPO siblings that share a prompt. The router refuses ids over 256
characters and non-integer turns, so the checks happen here, before a rollout fails.
"""
from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

TRAJECTORY_HEADER = "X-Pearl-Trajectory-Id"
TURN_HEADER = "X-Pearl-Turn"
MAX_TRAJECTORY_ID = 256


def tag_headers(trajectory_id: str, turn: int) -> dict[str, str]:
    """Headers that tell PEARL which trajectory a request continues, and which turn it is."""
    if not isinstance(trajectory_id, str) or not trajectory_id or len(trajectory_id) > MAX_TRAJECTORY_ID:
        raise ValueError(f"trajectory_id must be a non-empty string of at most {MAX_TRAJECTORY_ID} characters")
    if not trajectory_id.isprintable():
        raise ValueError(f"trajectory_id must be printable (it is an HTTP header), got {trajectory_id!r}")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise ValueError(f"turn must be a non-negative int, got {turn!r}")
    return {TRAJECTORY_HEADER: trajectory_id, TURN_HEADER: str(turn)}


@dataclass
class Trajectory:
    """One trajectory's identity and how many turns it has sent so far."""

    trajectory_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    turns: int = 0

    def next_turn(self) -> dict[str, str]:
        """Headers for the next request of this trajectory; counts it as sent."""
        headers = tag_headers(self.trajectory_id, self.turns)
        self.turns += 1
        return headers


class TurnCounter:
    """Turn counts for frameworks that only hand over a per-trajectory request id
    (veRL's agent loops reuse one ``request_id`` for every turn of a trajectory).
    Bounded, oldest first out, because trajectories never say that they ended."""

    def __init__(self, *, max_trajectories: int = 65536) -> None:
        if max_trajectories < 1:
            raise ValueError("max_trajectories must be >= 1")
        self._max = max_trajectories
        self._open: OrderedDict[str, Trajectory] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def next_turn(self, trajectory_id: str) -> dict[str, str]:
        trajectory = self._open.pop(trajectory_id, None) or Trajectory(trajectory_id)
        headers = trajectory.next_turn()
        self._open[trajectory_id] = trajectory
        while len(self._open) > self._max:
            self._open.popitem(last=False)
        return headers
