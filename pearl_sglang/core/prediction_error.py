"""Prediction error of the makespan model: how right the engine was about the steps
that ran.  Pure; the replay harness and the demo report it."""
from __future__ import annotations

from typing import Any, Iterable, Mapping


def new_prediction(entries: Iterable[Mapping[str, Any]], seen: set) -> dict[str, Any] | None:
    """The latest control-plane step record (``step_predictions`` of ``/pearl/state``)
    not reported before; ``seen`` holds the steps already reported and is updated."""
    last = None
    for e in entries:
        last = e
    if last is None or last.get("step") in seen:
        return None
    seen.add(last.get("step"))
    out = {"predicted_s": last["predicted_s"], "observed_s": last["observed_s"], "borrowed": last["borrowed"]}
    if last.get("predicted_by_model_s"):
        out["predicted_by_model_s"] = dict(last["predicted_by_model_s"])
    for key in ("mode", "corrected_s", "profile"):
        if last.get(key) is not None:
            out[key] = last[key]
    return out


def mape(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Mean of ``|observed - predicted| / observed`` over pairs with ``observed > 0``;
    ``None`` when there is none."""
    errors = [abs(obs - pred) / obs for pred, obs in pairs if obs > 0]
    return sum(errors) / len(errors) if errors else None


def mape_by_model(records: Iterable[Mapping[str, Any]], *, observed: str = "rollout_s") -> dict[str, float | None]:
    """MAPE of each makespan model's prediction (``predicted_by_model_s``) against the
    records' ``observed`` duration."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        obs = r.get(observed)
        if obs is None:
            continue
        for model, pred in (r.get("predicted_by_model_s") or {}).items():
            pairs.setdefault(model, []).append((pred, obs))
    return {model: mape(ps) for model, ps in sorted(pairs.items())}
