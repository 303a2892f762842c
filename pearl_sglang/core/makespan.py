"""Bubble-aware makespan models and capacity constraints (paper section 4.3.1).

Every formula the decision engine and the borrowing gate use lives here, written as in
the paper; the symbols and their units are documented in ``profile``.

Colocation, equation (1), with ``N`` workers each running prefill and decode::

    T_coloc = S * [ (B * dL / N) * t_prefill + r * (A + b * B / N) + T_over ] + T_env

Disaggregation, ``N_P`` prefill and ``N_D`` decode workers, equations (2) and (3)::

    T_decode  = S * r * (A + b * B / (N_D * (1 + theta))) * (1 + theta)
    T_prefill = S * ( (B * dL / N_P) * t_prefill + B * dL * K / BW )
    T_dis     = max(T_prefill, T_decode) + T_env

Capacity constraints (section 4.2), which decide the feasible set:

* KV capacity: the decode pool holds the whole batch's KV cache,
  ``B * K_seq <= N_D * H_max``.
* Prefill stability: the prefill pool must clear the step's prefill work
  ``lambda_P = B * S * dL`` tokens within the time the step lasts anyway, or a queue
  forms in front of prefill and decode waits behind it.  The step lasts at least the
  decode path plus the environment time, so we define the prefill utilisation::

      rho_P = (lambda_P * t_prefill / N_P) / (T_decode + T_env)

  and require ``rho_P <= rho_max`` (default 1.0: the pool may be busy for the whole
  step but not longer).  A value below 1 reserves headroom for bursty arrivals (the
  first turn of every trajectory arrives at once).  Only prefill compute counts: the KV
  transfer runs on the network and does not occupy the prefill GPUs.  Colocation has
  no separate pools, so neither constraint applies to it; it needs ``N >= 1`` only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.topology import Mode, Topology


@dataclass(frozen=True)
class Constraints:
    """Tunables of the feasibility test; see the module docstring for ``rho_max``."""

    rho_max: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.rho_max, (int, float)) and not isinstance(self.rho_max, bool)
                and math.isfinite(self.rho_max) and self.rho_max > 0):
            raise InvalidConfig(f"rho_max must be a positive number, got {self.rho_max!r}", key="rho_max")


def _positive_workers(n: int, name: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidConfig(f"{name} must be an integer >= 1, got {n!r}", key=name)


def coloc_makespan(p: Profile, n: int) -> float:
    """Equation (1)."""
    _positive_workers(n, "N")
    prefill_turn = (p.B * p.delta_L / n) * p.t_prefill
    decode_turn = p.r * (p.A + p.b * p.B / n)
    return p.S * (prefill_turn + decode_turn + p.T_over) + p.T_env


def decode_path(p: Profile, n_d: int) -> float:
    """Equation (2): the decode pool's share of the step, bubbles included."""
    _positive_workers(n_d, "N_D")
    stretch = 1.0 + p.theta
    return p.S * p.r * (p.A + p.b * p.B / (n_d * stretch)) * stretch


def prefill_compute(p: Profile, n_p: int) -> float:
    """First term of equation (3): prefill compute along the slowest trajectory."""
    _positive_workers(n_p, "N_P")
    return p.S * (p.B * p.delta_L / n_p) * p.t_prefill


def kv_transfer(p: Profile) -> float:
    """Second term of equation (3): ideal KV transfer time, a lower bound."""
    return p.S * p.B * p.delta_L * p.K / p.BW


def prefill_path(p: Profile, n_p: int) -> float:
    """Equation (3)."""
    return prefill_compute(p, n_p) + kv_transfer(p)


def dis_makespan(p: Profile, n_p: int, n_d: int) -> float:
    """``T_dis = max(T_prefill, T_decode) + T_env``."""
    return max(prefill_path(p, n_p), decode_path(p, n_d)) + p.T_env


def kv_fits(p: Profile, n_d: int) -> bool:
    """``B * K_seq <= N_D * H_max``."""
    _positive_workers(n_d, "N_D")
    return p.B * p.K_seq <= n_d * p.H_max


def prefill_utilization(p: Profile, n_p: int, n_d: int) -> float:
    """``rho_P`` of the module docstring."""
    work = prefill_compute(p, n_p)
    window = decode_path(p, n_d) + p.T_env
    if window <= 0:
        return 0.0 if work <= 0 else math.inf
    return work / window


@dataclass(frozen=True)
class Candidate:
    """One configuration with its prediction; ``violations`` empty iff feasible."""

    topology: Topology
    predicted_makespan_s: float
    prefill_path_s: float
    decode_path_s: float
    violations: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        data = self.topology.to_dict()
        data.update(
            feasible=self.feasible,
            predicted_makespan_s=self.predicted_makespan_s,
            prefill_path_s=self.prefill_path_s,
            decode_path_s=self.decode_path_s,
            violations=list(self.violations),
        )
        return data


def evaluate(p: Profile, topology: Topology, constraints: Constraints = Constraints()) -> Candidate:
    """Predict and check one valid topology.

    For colocation the two path fields hold the prefill and decode terms of equation
    (1) summed over the turns, so a reader can see which phase dominates.
    """
    if not topology.is_valid:
        raise InvalidConfig(f"cannot evaluate invalid topology {topology.label()}", key="topology")
    if topology.mode is Mode.COLOCATED:
        n = topology.colocated
        return Candidate(
            topology=topology,
            predicted_makespan_s=coloc_makespan(p, n),
            prefill_path_s=p.S * (p.B * p.delta_L / n) * p.t_prefill,
            decode_path_s=p.S * p.r * (p.A + p.b * p.B / n),
        )
    n_p, n_d = topology.prefill, topology.decode
    violations = []
    if not kv_fits(p, n_d):
        violations.append(f"kv: B*K_seq={p.B * p.K_seq:.6g} > N_D*H_max={n_d * p.H_max:.6g}")
    rho = prefill_utilization(p, n_p, n_d)
    if rho > constraints.rho_max:
        violations.append(f"prefill: rho_P={rho:.4g} > rho_max={constraints.rho_max:.4g}")
    return Candidate(
        topology=topology,
        predicted_makespan_s=dis_makespan(p, n_p, n_d),
        prefill_path_s=prefill_path(p, n_p),
        decode_path_s=decode_path(p, n_d),
        violations=tuple(violations),
    )
