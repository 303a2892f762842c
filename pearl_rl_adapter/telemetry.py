"""Trajectory identity on rollout requests, for PEARL's cache affinity and profile.

PEARL's router reads ``X-Pearl-Trajectory-Id`` and ``X-Pearl-Turn`` (0-based) on
``/generate``; without them it guesses continuation from prompt prefixes, which
conflates GRPO siblings that share a prompt. ``X-Pearl-Expected-Turns`` (optional) is
how many turns the trajectory is expected to take in all (its task's turns in an earlier
epoch, say): stragglers-first ranks the step's trajectories by it instead of by the
workload's distribution of turns. The router refuses ids over 256
characters or not printable ASCII and non-integer turns, so the checks happen here,
before a rollout fails.
"""
from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

TRAJECTORY_HEADER = "X-Pearl-Trajectory-Id"
TURN_HEADER = "X-Pearl-Turn"
EXPECTED_TURNS_HEADER = "X-Pearl-Expected-Turns"
MAX_TRAJECTORY_ID = 256
MAX_EXPECTED_TURNS = 999_999_999  # the router reads at most 9 digits


def tag_headers(trajectory_id: str, turn: int, expected_turns: int | None = None) -> dict[str, str]:
    """Headers that tell PEARL which trajectory a request continues, which turn it is and,
    if known, how many turns the trajectory is expected to take."""
    if not isinstance(trajectory_id, str) or not trajectory_id or len(trajectory_id) > MAX_TRAJECTORY_ID:
        raise ValueError(f"trajectory_id must be a non-empty string of at most {MAX_TRAJECTORY_ID} characters")
    if not (trajectory_id.isascii() and trajectory_id.isprintable()):
        raise ValueError(f"trajectory_id must be printable ASCII (it is an HTTP header), got {trajectory_id!r}")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise ValueError(f"turn must be a non-negative int, got {turn!r}")
    headers = {TRAJECTORY_HEADER: trajectory_id, TURN_HEADER: str(turn)}
    if expected_turns is not None:
        if (isinstance(expected_turns, bool) or not isinstance(expected_turns, int)
                or not 1 <= expected_turns <= MAX_EXPECTED_TURNS):
            raise ValueError(f"expected_turns must be an int in [1, {MAX_EXPECTED_TURNS}], got {expected_turns!r}")
        headers[EXPECTED_TURNS_HEADER] = str(expected_turns)
    return headers


@dataclass
class Trajectory:
    """One trajectory's identity, how many turns it has sent so far and, if known, how
    many it is expected to take in all."""

    trajectory_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    turns: int = 0
    expected_turns: int | None = None

    def next_turn(self) -> dict[str, str]:
        """Headers for the next request of this trajectory; counts it as sent."""
        headers = tag_headers(self.trajectory_id, self.turns, self.expected_turns)
        self.turns += 1
        return headers


class TurnCounter:
    """Turn counts for frameworks that only hand over a per-trajectory request id
    (veRL's agent loops reuse one ``request_id`` for every turn of a trajectory).
    Bounded, oldest first out, because trajectories never say that they ended."""

    def __init__(self, *, max_trajectories: int = 65536) -> None:
        if isinstance(max_trajectories, bool) or not isinstance(max_trajectories, int) or max_trajectories < 1:
            raise ValueError(f"max_trajectories must be an int >= 1, got {max_trajectories!r}")
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
