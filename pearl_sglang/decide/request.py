"""JSON in, typed request out, and back: the CLI's boundary with the core.

Input keys are the paper's symbols (``B, S, delta_L, r, theta, A, b, t_prefill, K, BW,
T_over, T_env, K_seq, H_max``) plus ``N`` (the worker budget), and optionally
``current`` (``{"mode", "prefill", "decode", "colocated"?}``), ``thresholds``
(``{"ratio", "mode"}``) and ``rho_max``.  Plan mode also reads ``table`` (a
``StateTable.to_dict()``), optional ``target`` and ``available_gpus``; ``N`` and
``current`` then default to the table's budget and topology.

Tail-aware inputs (``core.tail``), both optional: ``remaining_turns``, a list with the
turns each still-running trajectory has left (mid-step; default a fresh batch of ``B``
trajectories with ``S`` turns each), and ``spread``, the per-turn telemetry with its
spread ``{"env_mean_s", "env_std_s", "tokens_mean", "tokens_std", "z"}`` (default the
profile's means, no spread).  Given either, the output gains ``tail``: every candidate's
tail-aware prediction (throughput-bound time on the remaining work, latency floor, and
their max) and the tail-aware best.  ``makespan_model`` (``"paper"`` or ``"tail"``) is the
model the engine's choice (with hysteresis) is made with, as the cluster config's key of
the same name; by default ``"tail"`` when either tail-aware input is given, else
``"paper"`` (the two agree on a fresh batch without spread).  Units: seconds, bytes,
bytes per second.

``mode_factors`` (optional): observed over predicted step time per mode, ``{"colocated":
0.8, "disaggregated": 1.2}``, as the control plane learns them (``/pearl/state``,
``control.mode_correction.by_mode``; ``core.mode_feedback``).  Every candidate's
prediction is scaled by its mode's factor before the choice; a mode left out gets the mean
of the given ones with the PD prior, as a mode the control plane has not run yet.
``pd_prior`` (optional, default the config's ``mode_feedback.pd_prior``, 1.08): how far
PD stands above colocation until both modes have a factor; 1 for a neutral start.

``gate`` (optional): ask the borrowing gate too, ``{"overlap_workers", "remaining",
"toggle_cost_s", "pool_usage", "min_dedicated_busy_share", "min_borrowed_busy_share"}``
with ``N`` the dedicated workers.  ``overlap_workers`` (required, >= 1) is what borrowing
would add; ``remaining`` the trajectories still running (default ``B``); ``toggle_cost_s``
the cost of one borrow and return (default 10, the config's initial estimate; the control
plane shows its learned one under ``control.gate.toggle_cost_s``); ``pool_usage`` what
the last step's workers did, as ``/pearl/state`` shows it under ``control.gate.pool_usage``
(``{"borrowed", "dedicated_busy_share", "borrowed_busy_share"}``, ``core.pool_usage``);
``last_step`` an unborrowed step to replay with the overlap workers
(``core.borrow_replay``): ``{"trajectories": [[[env_s, request_s], ...], ...], "span_s",
"join_after_s"}``, each trajectory's turns in order (environment time before the turn,
the request from arrival to last token), the step's span, and when the overlap workers
would start serving, seconds from the step's start; the step ran on the ``N`` workers.
The output gains ``gate``: equation (7) under ``makespan_model``, checked against
``pool_usage`` and the replay (``replay``: ``saved_s``, ``join_after_s``, ``speedup``,
``concurrency``).

Every problem is reported as ``InputError`` naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pearl_sglang.core import (
    Constraints,
    CoreError,
    Profile,
    StateTable,
    Thresholds,
    Topology,
    decide,
    plan,
)
from pearl_sglang.core.borrow_replay import ReplaySaving, StepTimeline, replay_guard, replay_saving
from pearl_sglang.core.mode_feedback import ModeCorrection, ModeFeedback
from pearl_sglang.core.gate import INITIAL_TOGGLE_COST_S
from pearl_sglang.core.pool_usage import PoolUsage, UsageThresholds, usage_guard
from pearl_sglang.core.step_model import MakespanModel, StepContext, candidates, gate as model_gate
from pearl_sglang.core.topology import Mode
from pearl_sglang.core.tail import TurnSpread, predict

# More workers than any cluster this decides for; every candidate up to it is evaluated
# (and printed), so a huge count would run for hours or exhaust memory.
MAX_WORKERS = 4096
_TOPOLOGY_KEYS = {"mode", "prefill", "decode", "colocated"}
_OPTIONAL = {"current", "thresholds", "rho_max", "remaining_turns", "spread", "makespan_model", "mode_factors",
             "pd_prior", "gate"}
_PLAN_ONLY = {"table", "target", "available_gpus"}


class InputError(ValueError):
    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(f"key {key!r}: {message}" if key else message)
        self.key = key


@dataclass(frozen=True)
class Request:
    profile: Profile
    budget: int
    current: Topology | None
    thresholds: Thresholds
    constraints: Constraints
    table: StateTable | None = None
    target: Topology | None = None
    available: frozenset[str] | None = None
    remaining: tuple[float, ...] | None = None
    spread: TurnSpread | None = None
    model: MakespanModel = MakespanModel.PAPER
    correction: ModeCorrection = ModeCorrection()
    gate: GateQuestion | None = None


@dataclass(frozen=True)
class GateQuestion:
    overlap_workers: int
    remaining: float
    toggle_cost_s: float
    usage: PoolUsage | None
    thresholds: UsageThresholds
    replay: ReplaySaving | None = None


def _obj(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(key, f"must be a JSON object, got {type(value).__name__}")
    return value


def _wrap(key: str, fn, *args, **kwargs):
    """Run a core constructor, re-raising its error under ``key`` (or its own key)."""
    try:
        return fn(*args, **kwargs)
    except CoreError as e:
        inner = f"{key}.{e.key}" if e.key and e.key != key else key
        raise InputError(inner, str(e)) from e


def parse(data: Any, *, plan_mode: bool = False) -> Request:
    data = _obj(data, "input")
    allowed = set(Profile.symbols()) | {"N"} | _OPTIONAL | (_PLAN_ONLY if plan_mode else set())
    unknown = sorted(set(data) - allowed)
    if unknown:
        hint = " (only with --plan)" if unknown[0] in _PLAN_ONLY else ""
        raise InputError(unknown[0], f"unknown key{hint}")
    symbols = {k: data[k] for k in Profile.symbols() if k in data}
    try:
        profile = Profile.from_dict(symbols)
    except CoreError as e:
        raise InputError(e.key, str(e)) from e

    table = None
    if plan_mode:
        if "table" not in data:
            raise InputError("table", "missing (required with --plan)")
        table = _wrap("table", StateTable.from_dict, _obj(data["table"], "table"))
    available = None
    if "available_gpus" in data:
        gpus = data["available_gpus"]
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            raise InputError("available_gpus", "must be a list of GPU id strings")
        available = frozenset(gpus)

    if "N" in data:
        budget = data["N"]
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_WORKERS:
            raise InputError("N", f"must be an integer in [1, {MAX_WORKERS}], got {budget!r}")
    elif table is not None:
        budget = table.budget(available)
        if not 1 <= budget <= MAX_WORKERS:
            raise InputError("table", f"room for {budget} rollout workers; must be in [1, {MAX_WORKERS}]")
    else:
        raise InputError("N", "missing")

    current = None
    if "current" in data:
        current = _topology(data["current"], "current", budget)
    elif table is not None and table.topology().total:
        current = table.topology()

    th = _obj(data.get("thresholds", {}), "thresholds")
    extra = sorted(set(th) - {"ratio", "mode"})
    if extra:
        raise InputError(f"thresholds.{extra[0]}", "unknown key")
    thresholds = _wrap("thresholds", Thresholds, **th)
    constraints = _wrap("rho_max", Constraints, **({"rho_max": data["rho_max"]} if "rho_max" in data else {}))

    target = None
    if "target" in data:
        target = _topology(data["target"], "target", budget)
        if not target.total:
            raise InputError("target", "names no worker (a plan to it would remove every worker)")
    remaining = None
    if "remaining_turns" in data:
        turns = data["remaining_turns"]
        if not isinstance(turns, list) or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < float("inf") for t in turns):
            raise InputError("remaining_turns", "must be a list of finite numbers >= 0 (turns left per trajectory)")
        remaining = tuple(float(t) for t in turns)
    spread = None
    if "spread" in data:
        sp = _obj(data["spread"], "spread")
        extra = sorted(set(sp) - {"env_mean_s", "env_std_s", "tokens_mean", "tokens_std", "z"})
        if extra:
            raise InputError(f"spread.{extra[0]}", "unknown key")
        if "env_mean_s" not in sp:
            raise InputError("spread.env_mean_s", "missing")
        spread = _wrap("spread", TurnSpread, **sp)
    default = "tail" if remaining is not None or spread is not None else "paper"
    model = _wrap("makespan_model", MakespanModel.parse, data.get("makespan_model", default))
    gate = _gate(data["gate"], profile, budget) if "gate" in data else None
    return Request(profile, budget, current, thresholds, constraints, table, target, available, remaining, spread,
                   model, _mode_factors(data.get("mode_factors", {}), data.get("pd_prior", ModeFeedback.pd_prior)),
                   gate)


def _topology(value: Any, key: str, budget: int) -> Topology:
    """``current`` or ``target``; an unknown key is refused (a typo such as ``prefil``
    would read as 0 prefill workers)."""
    obj = _obj(value, key)
    extra = sorted(set(obj) - _TOPOLOGY_KEYS)
    if extra:
        raise InputError(f"{key}.{extra[0]}", f"unknown key (one of {', '.join(sorted(_TOPOLOGY_KEYS))})")
    return _wrap(key, Topology.from_dict, obj, default_colocated=budget)


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise InputError(key, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def _last_step(value: Any, profile: Profile, *, workers: int, overlap: int) -> ReplaySaving:
    step = _obj(value, "gate.last_step")
    extra = sorted(set(step) - {"trajectories", "span_s", "join_after_s"})
    if extra:
        raise InputError(f"gate.last_step.{extra[0]}", "unknown key")
    trajs = step.get("trajectories")
    if not isinstance(trajs, list) or not trajs:
        raise InputError("gate.last_step.trajectories", "must be a non-empty list of trajectories")
    turns = []
    for i, t in enumerate(trajs):
        if not isinstance(t, list) or not all(isinstance(x, list) and len(x) == 2 for x in t):
            raise InputError(f"gate.last_step.trajectories[{i}]", "must be a list of [env_s, request_s] pairs")
        turns.append(tuple((_number(e, f"gate.last_step.trajectories[{i}]"),
                            _number(r, f"gate.last_step.trajectories[{i}]")) for e, r in t))
    timeline = _wrap("gate.last_step", StepTimeline, tuple(turns),
                     span_s=_number(step.get("span_s"), "gate.last_step.span_s"), workers=workers)
    return _wrap("gate.last_step", replay_saving, timeline,
                 join_after_s=_number(step.get("join_after_s"), "gate.last_step.join_after_s"),
                 A=profile.A, b=profile.b, overlap_workers=overlap)


def _gate(value: Any, profile: Profile, budget: int) -> GateQuestion:
    g = _obj(value, "gate")
    keys = {"overlap_workers", "remaining", "toggle_cost_s", "pool_usage", "min_dedicated_busy_share",
            "min_borrowed_busy_share", "last_step"}
    extra = sorted(set(g) - keys)
    if extra:
        raise InputError(f"gate.{extra[0]}", "unknown key")
    overlap = g.get("overlap_workers")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 1 <= overlap <= MAX_WORKERS:
        raise InputError("gate.overlap_workers", f"must be an integer in [1, {MAX_WORKERS}], got {overlap!r}")
    remaining = _number(g.get("remaining", profile.B), "gate.remaining")
    if remaining > profile.B:
        raise InputError("gate.remaining", f"must be at most B ({profile.B:g}), got {remaining:g}")
    usage = None
    if g.get("pool_usage") is not None:
        u = _obj(g["pool_usage"], "gate.pool_usage")
        extra = sorted(set(u) - {"borrowed", "dedicated_busy_share", "borrowed_busy_share"})
        if extra:
            raise InputError(f"gate.pool_usage.{extra[0]}", "unknown key")
        usage = _wrap("gate.pool_usage", PoolUsage, **{"borrowed": False, "dedicated_busy_share": None, **u})
    floors = {k: g[k] for k in ("min_dedicated_busy_share", "min_borrowed_busy_share") if k in g}
    replay = None if g.get("last_step") is None else _last_step(g["last_step"], profile, workers=budget,
                                                                overlap=overlap)
    return GateQuestion(overlap, remaining, _number(g.get("toggle_cost_s", INITIAL_TOGGLE_COST_S),
                                                    "gate.toggle_cost_s"),
                        usage, _wrap("gate", UsageThresholds, **floors), replay)


def _mode_factors(value: Any, pd_prior: Any) -> ModeCorrection:
    factors = _obj(value, "mode_factors")
    by_mode = {}
    for key, f in factors.items():
        if key not in {m.value for m in Mode}:
            raise InputError(f"mode_factors.{key}", f"unknown mode (one of {', '.join(m.value for m in Mode)})")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < float("inf"):
            raise InputError(f"mode_factors.{key}", f"must be a positive finite number, got {f!r}")
        by_mode[Mode(key)] = float(f)
    return ModeCorrection.from_factors(by_mode, _wrap("pd_prior", ModeFeedback, pd_prior=pd_prior))


def _tail(req: Request, decision) -> dict[str, Any]:
    preds = [(c.topology, predict(req.profile, c.topology, remaining=req.remaining, spread=req.spread,
                                  constraints=req.constraints))
             for c in decision.candidates if c.feasible]
    best_topology, best = min(preds, key=lambda tp: tp[1].makespan_s)
    return {"candidates": [{**t.to_dict(), **p.to_dict()} for t, p in preds],
            "best": {**best_topology.to_dict(), **best.to_dict()},
            "choice": next(p.to_dict() for t, p in preds if t == decision.choice)}


def run(req: Request) -> dict[str, Any]:
    """Decide (and plan, when a table came in); the result as a JSON-safe dict."""
    ctx = StepContext(remaining=req.remaining, spread=req.spread)
    cands = req.correction.apply(_wrap("N", candidates, req.model, req.profile, req.budget, ctx, req.constraints))
    decision = _wrap("N", decide, req.profile, budget=req.budget, current=req.current,
                     thresholds=req.thresholds, constraints=req.constraints, candidates=cands)
    out = {**decision.to_dict(), "makespan_model": req.model.value}
    if req.remaining is not None or req.spread is not None:
        out["tail"] = _tail(req, decision)
    if req.gate is not None:
        q = req.gate
        answer = _wrap("gate", model_gate, req.model, req.profile, dedicated_workers=req.budget,
                       overlap_workers=q.overlap_workers, remaining=q.remaining, ctx=ctx,
                       toggle_cost_s=q.toggle_cost_s, constraints=req.constraints)
        out["gate"] = {**replay_guard(usage_guard(answer, q.usage, q.thresholds), q.replay).to_dict(),
                       "pool_usage": None if q.usage is None else q.usage.to_dict(),
                       "replay": None if q.replay is None else q.replay.to_dict()}
    if req.table is None:
        return out
    target = req.target or decision.choice
    the_plan = _wrap("target", plan, req.table, target, available=req.available)
    return {"decision": out, "plan": the_plan.to_dict()}
