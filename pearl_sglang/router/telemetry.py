"""Per-turn telemetry for PEARL's runtime profile, observed on the data path.

Each finished ``/generate`` item of a trajectory becomes a ``core.telemetry.TurnRecord``:
its trajectory comes from the ``X-Pearl-Trajectory-Id`` header or, without one, from
prefix continuation (the new prompt extends a previous turn's prompt + output; the first
full blocks are matched, so GRPO siblings that share a prompt and an output may be
conflated, which the header avoids). What workers computed is ``prompt_tokens -
cached_tokens``; the response of the previous turn is counted as carried (it stays in the
context), the rest as new input, so the fitted ``delta_L`` is the *effective* prefill per
turn. The environment gap is the time between a turn's answer and the next turn's
request. Decode timing against the decode worker's mean concurrency over the decode
(and the prefills it ran meanwhile) gives ``A`` and ``b``; the time to the first chunk,
over the prompt's computed tokens plus the prefills queued ahead of it, ``t_prefill``. ``drain()`` closes a rollout step: its
trajectories become the workload history against which ``critical_path`` ranks the next
step's running trajectories (turns, tokens and time since their first request).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from pearl_sglang.core.critical_path import (RemainingEstimate, TrajectoryProgress, WorkloadHistory,
                                             predicted_stragglers)
from pearl_sglang.core.telemetry import DecodeSample, PrefillSample, StepTelemetry, TurnRecord
from pearl_sglang.router.activity import Window
from pearl_sglang.router.selection import extend_prefix_key, prefix_key


@dataclass
class _Last:
    trajectory: str
    turn: int
    generated: int
    finished_at: float


@dataclass
class _Running:
    started_at: float
    turns: int = 0
    tokens: int = 0
    in_flight: int = 0              # turns sent and not yet ended
    last_end: float | None = None   # when its latest turn ended
    slot: int | None = None         # the worker that generated its latest turn
    expected_turns: int | None = None  # the client's hint (``X-Pearl-Expected-Turns``)


@dataclass(frozen=True)
class TailView:
    """The step's predicted stragglers at ``at``: their ids, how many of them each worker
    holds (where their latest turn ran), and the share of the step's trajectories that
    look finished (the tail begins as it grows)."""

    at: float
    share: float
    stragglers: frozenset[str]
    stragglers_on: dict[int, int]
    finished_share: float


@dataclass(frozen=True)
class TurnObservation:
    """What the dispatcher saw of one finished item (times on the event loop's clock)."""

    trajectory: str | None
    turn: int | None
    key: tuple[int, ...]
    full_key: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    arrived_at: float
    first_chunk_at: float | None
    finished_at: float
    first_chunk_tokens: int  # generated tokens the first chunk carried
    # What the workers did meanwhile (``router.activity``; ``dispatch.Completed``).
    queued_prefill_tokens: int = 0
    decode_window: Window | None = None


class TelemetryCollector:
    def __init__(self, max_trajectories: int = 1 << 16, max_pending: int = 1 << 17, idle_s: float = 30.0) -> None:
        # Bounded: a router without a control plane never drains, and must not grow.
        self._turns: deque[TurnRecord] = deque(maxlen=max_pending)
        self._decode: deque[DecodeSample] = deque(maxlen=max_pending)
        self._prefill: deque[PrefillSample] = deque(maxlen=max_pending)
        self._last: OrderedDict[str, _Last] = OrderedDict()
        self._by_block: OrderedDict[int, str] = OrderedDict()
        self._anonymous = 0
        # This step's trajectories (since the last drain) and the last drained step.
        self._running: OrderedDict[str, _Running] = OrderedDict()
        self.history = WorkloadHistory()
        self._straggler_cache: TailView | None = None
        self._turns_seen = 0
        self._cache_turns = -1
        self.max_trajectories = max_trajectories
        self.idle_s = idle_s

    def _resolve(self, obs: TurnObservation) -> tuple[str, _Last | None]:
        if obs.trajectory is not None:
            return obs.trajectory, self._last.get(obs.trajectory)
        for h in reversed(obs.key):
            tid = self._by_block.get(h)
            if tid is not None:
                return tid, self._last.get(tid)
        self._anonymous += 1
        return f"anon-{self._anonymous}", None

    def observe(self, obs: TurnObservation) -> TurnRecord:
        tid, prev = self._resolve(obs)
        turn = obs.turn if obs.turn is not None else (prev.turn + 1 if prev else 0)
        computed = max(0, obs.prompt_tokens - obs.cached_tokens)
        carried_in = min(prev.generated, computed) if prev else 0
        env = max(0.0, obs.arrived_at - prev.finished_at) if prev else 0.0
        first = obs.first_chunk_at if obs.first_chunk_at is not None else obs.finished_at
        decode_s = max(0.0, obs.finished_at - first)
        record = TurnRecord(trajectory_id=tid, turn_index=turn, new_input_tokens=computed - carried_in,
                            carried_tokens=obs.generated_tokens, generated_tokens=obs.generated_tokens,
                            env_time_s=env, decode_time_s=decode_s,
                            request_s=max(0.0, obs.finished_at - obs.arrived_at))
        self._turns.append(record)
        # Tokens after the first chunk were decoded in the decode worker's batch over that
        # window (its mean sequences and context tokens), between the prefills it ran
        # meanwhile; the wait for the first chunk held the prefills finished ahead of
        # this one's (core.telemetry).
        first_tokens = min(obs.first_chunk_tokens, obs.generated_tokens)
        after_first = obs.generated_tokens - first_tokens
        window = obs.decode_window
        if after_first > 0 and decode_s > 0 and window is not None:
            self._decode.append(DecodeSample(concurrency=max(1.0, window.sequences),
                                             iteration_s=decode_s / after_first,
                                             context_tokens=window.context_tokens,
                                             prefill_tokens_per_token=window.prefilled / after_first))
            if computed > 0 and obs.first_chunk_at is not None:
                prefill_s = (obs.first_chunk_at - obs.arrived_at) - first_tokens * decode_s / after_first
                if prefill_s > 0:
                    self._prefill.append(PrefillSample(tokens=computed + obs.queued_prefill_tokens,
                                                       seconds=prefill_s))
        self._last[tid] = _Last(tid, turn, obs.generated_tokens, obs.finished_at)
        run = self._running.setdefault(tid, _Running(started_at=obs.arrived_at))
        run.started_at = min(run.started_at, obs.arrived_at)
        run.last_end = obs.finished_at if run.last_end is None else max(run.last_end, obs.finished_at)
        run.turns += 1
        self._turns_seen += 1
        run.tokens += obs.generated_tokens
        self._running.move_to_end(tid)
        while len(self._running) > self.max_trajectories:
            self._running.popitem(last=False)
        self._last.move_to_end(tid)
        if obs.full_key:
            self._by_block[obs.full_key[-1]] = tid
            self._by_block.move_to_end(obs.full_key[-1])
        while len(self._last) > self.max_trajectories:
            self._last.popitem(last=False)
        while len(self._by_block) > self.max_trajectories:
            self._by_block.popitem(last=False)
        return record

    def pending(self) -> int:
        return len(self._turns)

    # ---- which of the step's trajectories are still going -------------------------------------
    def turn_began(self, trajectory: str, now: float) -> None:
        """A turn of ``trajectory`` was sent (the dispatcher calls this for every item that
        names its trajectory, and ``turn_left`` once it ends, however it ends)."""
        self._run(trajectory, now).in_flight += 1

    def expect_turns(self, trajectory: str, turns: int, now: float) -> None:
        """The client expects ``trajectory`` to take ``turns`` turns in all (its latest word
        counts); the critical path uses it instead of the workload's distribution."""
        run = self._run(trajectory, now)
        run.expected_turns = turns
        if run.in_flight == 0 and run.last_end is None:
            run.last_end = now  # a hint whose turn never starts keeps it live only ``idle_s``

    def _run(self, trajectory: str, now: float) -> _Running:
        run = self._running.get(trajectory)
        if run is None:
            run = self._running[trajectory] = _Running(started_at=now)
            while len(self._running) > self.max_trajectories:
                self._running.popitem(last=False)
        return run

    def turn_left(self, trajectory: str, slot: int | None, now: float) -> None:
        run = self._running.get(trajectory)
        if run is None:
            return
        run.in_flight = max(0, run.in_flight - 1)
        run.last_end = now if run.last_end is None else max(run.last_end, now)
        if slot is not None:
            run.slot = slot

    def _is_live(self, r: _Running, now: float) -> bool:
        return r.in_flight > 0 or r.last_end is None or now - r.last_end <= self.idle_s

    def live(self, now: float) -> dict[str, int | None]:
        """This step's trajectories that are still going, with the worker of their latest
        turn: a turn in flight, or one that ended less than ``idle_s`` ago (the agent is
        in its environment). The router is never told that a trajectory ended; one idle
        longer than any environment step is taken to have."""
        return {tid: r.slot for tid, r in self._running.items() if self._is_live(r, now)}

    def finished_share(self, now: float) -> float:
        """The share of this step's trajectories that look finished (0 before any)."""
        n = len(self._running)
        return 0.0 if not n else 1.0 - sum(self._is_live(r, now) for r in self._running.values()) / n

    def progress(self, now: float) -> tuple[TrajectoryProgress, ...]:
        """The live trajectories' progress (finished ones can no longer be stragglers)."""
        return tuple(TrajectoryProgress(trajectory_id=tid, turns_done=r.turns, tokens_so_far=r.tokens,
                                        elapsed_s=max(0.0, now - r.started_at), expected_turns=r.expected_turns)
                     for tid, r in self._running.items() if self._is_live(r, now))

    def stragglers(self, now: float, *, share: float) -> tuple[RemainingEstimate, ...]:
        return predicted_stragglers(self.progress(now), self.history, share=share)

    def is_straggler(self, trajectory: str, now: float, *, share: float, max_age_s: float = 1.0,
                     min_age_s: float = 0.05) -> bool:
        """Whether ``trajectory`` is among the predicted stragglers."""
        return trajectory in self.tail(now, share=share, max_age_s=max_age_s, min_age_s=min_age_s).stragglers

    def tail(self, now: float, *, share: float, max_age_s: float = 1.0, min_age_s: float = 0.05) -> "TailView":
        """The predicted stragglers, where they last ran and how much of the step looks
        finished. Redone when turns ended since it was made (at most every ``min_age_s``)
        or when it is ``max_age_s`` old, so a step of many trajectories is not sorted per
        request."""
        cached = self._straggler_cache
        changed = self._turns_seen != self._cache_turns
        if (cached is None or cached.share != share or now - cached.at > max_age_s
                or (changed and now - cached.at > min_age_s)):
            ids = frozenset(e.trajectory_id for e in self.stragglers(now, share=share))
            on: dict[int, int] = {}
            for tid in ids:
                slot = self._running[tid].slot
                if slot is not None:
                    on[slot] = on.get(slot, 0) + 1
            cached = self._straggler_cache = TailView(at=now, share=share, stragglers=ids, stragglers_on=on,
                                                      finished_share=self.finished_share(now))
            self._cache_turns = self._turns_seen
        return cached

    def drain(self) -> StepTelemetry:
        step = StepTelemetry(turns=tuple(self._turns), decode=tuple(self._decode),
                             prefill=tuple(self._prefill))
        if step.turns:
            self.history = WorkloadHistory.from_step(step)
        self._running.clear()
        self._straggler_cache = None
        self._turns.clear()
        self._decode.clear()
        self._prefill.clear()
        return step


def full_sequence_key(prompt_ids: list[int] | None, output_ids: list[int],
                      prompt_key: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Block hashes of prompt + output (what the next turn's prompt will start with);
    ``prompt_key``, the prompt's own ``prefix_key``, saves hashing the prompt again."""
    if prompt_ids is None:
        return ()
    if prompt_key is None:
        prompt_key = prefix_key(prompt_ids, None)
    return extend_prefix_key(prompt_key, prompt_ids, output_ids)
