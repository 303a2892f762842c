"""Equations (1)-(3), T_dis and the capacity constraints on hand-computed cases."""
import math

import pytest

from pearl_sglang.core.errors import InvalidConfig, InvalidProfile
from pearl_sglang.core.makespan import (
    Constraints,
    coloc_makespan,
    decode_path,
    dis_makespan,
    evaluate,
    kv_fits,
    prefill_path,
    prefill_utilization,
)
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.topology import Topology

# Round numbers so every value below can be checked with pencil and paper.
P = Profile(B=8, S=10, delta_L=100, r=50, theta=1.0, A=0.01, b=0.001, t_prefill=1e-4,
            K=1000, BW=1e6, T_over=0.5, T_env=20, K_seq=1e9, H_max=3e9)


def test_coloc_equation_1():
    # N=4: prefill 8*100/4*1e-4 = 0.02; decode 50*(0.01 + 0.001*2) = 0.6; +0.5 -> 1.12/turn
    assert coloc_makespan(P, 4) == pytest.approx(10 * 1.12 + 20)
    # N=1: 0.08 + 50*(0.01+0.008)=0.9 + 0.5 = 1.48
    assert coloc_makespan(P, 1) == pytest.approx(10 * 1.48 + 20)


def test_decode_equation_2():
    # N_D=2, theta=1: 10*50*(0.01 + 0.001*8/(2*2))*2 = 500*0.012*2 = 12
    assert decode_path(P, 2) == pytest.approx(12.0)
    # theta=0 removes the bubble: 500*(0.01 + 0.004) = 7
    assert decode_path(Profile(**{**P.to_dict(), "theta": 0.0}), 2) == pytest.approx(7.0)


def test_prefill_equation_3():
    # N_P=2: compute 8*100/2*1e-4 = 0.04; transfer 8*100*1000/1e6 = 0.8; S=10 -> 8.4
    assert prefill_path(P, 2) == pytest.approx(8.4)


def test_t_dis_is_max_of_paths_plus_env():
    assert dis_makespan(P, 2, 2) == pytest.approx(max(8.4, 12.0) + 20)
    heavy = Profile(**{**P.to_dict(), "BW": 1e5})  # transfer 8 s per turn -> 80.4 s prefill path
    assert dis_makespan(heavy, 2, 2) == pytest.approx(80.4 + 20)


def test_kv_capacity():
    # B*K_seq = 8e9; N_D*H_max = 3e9*N_D
    assert not kv_fits(P, 2)
    assert kv_fits(P, 3)  # 9e9 >= 8e9
    edge = Profile(**{**P.to_dict(), "H_max": 4e9})
    assert kv_fits(edge, 2)  # equality is allowed


def test_prefill_utilization():
    # compute = 10*8*100/1*1e-4 = 0.8 s; window = decode_path(1) + T_env
    # decode_path(1) = 500*(0.01+0.001*8/2)*2 = 14 -> rho = 0.8/34
    assert prefill_utilization(P, 1, 1) == pytest.approx(0.8 / 34)
    slow = Profile(**{**P.to_dict(), "t_prefill": 1.0, "K_seq": 0})
    c = evaluate(slow, Topology.pd(1, 3))
    assert not c.feasible and any(v.startswith("prefill") for v in c.violations)
    assert evaluate(slow, Topology.pd(1, 3), Constraints(rho_max=1e6)).feasible


def test_evaluate_reports_violations_and_colocation_is_unconstrained():
    c = evaluate(P, Topology.pd(2, 2))
    assert not c.feasible and c.violations[0].startswith("kv")
    assert c.predicted_makespan_s == pytest.approx(32.0)
    assert evaluate(P, Topology.coloc(1)).feasible


@pytest.mark.parametrize("bad", [Topology(), Topology(prefill=1), Topology(prefill=1, decode=1, colocated=1)])
def test_evaluate_rejects_invalid_shapes(bad):
    with pytest.raises(InvalidConfig):
        evaluate(P, bad)


def test_worker_counts_must_be_positive():
    with pytest.raises(InvalidConfig):
        coloc_makespan(P, 0)
    with pytest.raises(InvalidConfig):
        decode_path(P, 0)


@pytest.mark.parametrize("key,value", [("B", 0), ("BW", 0), ("theta", -0.1), ("A", math.nan), ("S", "3"),
                                        ("H_max", math.inf), ("r", True)])
def test_profile_validation_names_key(key, value):
    with pytest.raises(InvalidProfile) as e:
        Profile(**{**P.to_dict(), key: value})
    assert e.value.key == key


def test_profile_round_trip_and_unknown_key():
    assert Profile.from_dict(P.to_dict()) == P
    with pytest.raises(InvalidProfile) as e:
        Profile.from_dict({**P.to_dict(), "delta_l": 3})
    assert e.value.key == "delta_l"
