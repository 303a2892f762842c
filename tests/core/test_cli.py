"""``python -m pearl_sglang.decide``: JSON in, decision or plan out, exit 2 on bad input."""
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pearl_sglang.core import StateTable, Thresholds, Topology, apply, decide, plan
from pearl_sglang.core.decision import enumerate_candidates
from pearl_sglang.core.mode_feedback import ModeCorrection, ModeFeedback
from pearl_sglang.core.events import BeginPlan, WorkerReady, apply_all
from pearl_sglang.core.profile import Profile
from pearl_sglang.decide.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
PROFILE = dict(B=64, S=30, delta_L=2000, r=400, theta=0.5, A=0.005, b=3e-4, t_prefill=2e-5, K=147456,
               BW=8e10, T_over=0.5, T_env=150, K_seq=4.8e9, H_max=1.2e11)


def _run(payload, *args, capsys):
    text = payload if isinstance(payload, str) else json.dumps(payload)
    old, sys.stdin = sys.stdin, io.StringIO(text)
    try:
        code = main(list(args))
    finally:
        sys.stdin = old
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("prior", [None, 1.0, 1.3])
def test_decision_matches_core(prior, capsys):
    """The control plane's candidates: the paper's model with the PD prior (default 1.08)."""
    payload = {**PROFILE, "N": 6, "current": {"mode": "disaggregated", "prefill": 1, "decode": 5},
               "thresholds": {"ratio": 0.02, "mode": 0.1}} | ({} if prior is None else {"pd_prior": prior})
    code, out, _ = _run(payload, capsys=capsys)
    assert code == 0
    got = json.loads(out)
    correction = ModeCorrection(ModeFeedback() if prior is None else ModeFeedback(pd_prior=prior))
    p = Profile(**PROFILE)
    want = decide(p, budget=6, current=Topology.pd(1, 5), thresholds=Thresholds(ratio=0.02, mode=0.1),
                  candidates=correction.apply(enumerate_candidates(p, 6)))
    assert set(got) >= {"choice", "switch", "forced", "reason", "candidates"}
    assert len(got["candidates"]) == 6
    assert [c["predicted_makespan_s"] for c in got["candidates"]] == \
        [c.predicted_makespan_s for c in want.candidates]
    assert got["choice"] == want.choice.to_dict()


def test_colocated_current_defaults_to_budget(capsys):
    code, out, _ = _run({**PROFILE, "N": 4, "current": {"mode": "colocated", "prefill": 0, "decode": 0}}, capsys=capsys)
    assert code == 0 and json.loads(out)["incumbent"]["colocated"] == 4


@pytest.mark.parametrize("payload,key", [
    ({**PROFILE, "N": 4, "B": -1}, "'B'"),
    ({**PROFILE, "N": 0}, "'N'"),
    ({k: v for k, v in PROFILE.items() if k != "theta"} | {"N": 3}, "'theta'"),
    ({**PROFILE, "N": 3, "delta_l": 5}, "'delta_l'"),
    ({**PROFILE, "N": 3, "thresholds": {"ratio": 0.5, "mode": 0.1}}, "'thresholds.mode'"),
    ({**PROFILE, "N": 3, "current": {"mode": "hybrid"}}, "'current.mode'"),
    ({**PROFILE, "N": 3, "table": {}}, "'table'"),
    ("{not json", "JSON"),
])
def test_bad_input_exits_2_naming_the_key(payload, key, capsys):
    code, out, err = _run(payload, capsys=capsys)
    assert code == 2 and out == "" and key in err


def test_plan_mode_from_table(capsys):
    t = StateTable.create(tp_size=2, dedicated_gpus=[f"n0:{i}" for i in range(10)])
    t = apply(t, BeginPlan(plan(t, Topology.pd(1, 2))))
    t = apply_all(t, [WorkerReady(w.slot) for w in t.members()])
    code, out, err = _run({**PROFILE, "table": t.to_dict(), "target": {"mode": "disaggregated", "prefill": 2,
                                                                        "decode": 3}}, "--plan", capsys=capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["plan"]["change_count"] == 2 and [a["slot"] for a in got["plan"]["add"]] == [3, 4]
    assert got["decision"]["incumbent"] is not None  # current came from the table, N from its GPUs
    code, out, err = _run({**PROFILE, "table": t.to_dict(), "N": 9}, "--plan", capsys=capsys)
    assert code == 2 and "'target'" in err  # 9 workers do not fit on 10 GPUs


def test_module_entry_point_runs(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({**PROFILE, "N": 5}))
    ok = subprocess.run([sys.executable, "-m", "pearl_sglang.decide", str(f)], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["choice"]["mode"] in ("colocated", "disaggregated")
    bad = subprocess.run([sys.executable, "-m", "pearl_sglang.decide"], input='{"N": 2}', cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "'B'" in bad.stderr


def test_tail_inputs_add_tail_aware_predictions(capsys):
    payload = {**PROFILE, "N": 6, "remaining_turns": [25, 2, 2],
               "spread": {"env_mean_s": 30.0, "env_std_s": 20.0, "tokens_mean": 400, "tokens_std": 100}}
    code, out, _ = _run(payload, capsys=capsys)
    assert code == 0
    tail = json.loads(out)["tail"]
    assert len(tail["candidates"]) >= 1 and tail["choice"]["tail_bound"]
    best = tail["best"]
    assert best["makespan_s"] == min(c["makespan_s"] for c in tail["candidates"])
    assert best["makespan_s"] >= best["floor_s"] > 25 * 30
    # Without the new keys the output is unchanged.
    code, out, _ = _run({**PROFILE, "N": 6}, capsys=capsys)
    assert "tail" not in json.loads(out)


def test_makespan_model_picks_the_model_the_choice_is_made_with(capsys):
    tail_inputs = {"remaining_turns": [25, 2, 2],
                   "spread": {"env_mean_s": 30.0, "env_std_s": 20.0, "tokens_mean": 400, "tokens_std": 100}}
    _, out, _ = _run({**PROFILE, "N": 6, **tail_inputs}, capsys=capsys)
    tail = json.loads(out)
    assert tail["makespan_model"] == "tail"
    assert tail["predicted_makespan_s"] == tail["tail"]["best"]["makespan_s"]  # no current: the best
    _, out, _ = _run({**PROFILE, "N": 6, **tail_inputs, "makespan_model": "paper"}, capsys=capsys)
    paper = json.loads(out)
    assert paper["makespan_model"] == "paper"
    assert paper["predicted_makespan_s"] == min(c["predicted_makespan_s"] for c in paper["candidates"] if c["feasible"])
    assert paper["predicted_makespan_s"] < tail["predicted_makespan_s"]
    _, out, _ = _run({**PROFILE, "N": 6}, capsys=capsys)
    assert json.loads(out)["makespan_model"] == "paper"


@pytest.mark.parametrize("payload,key", [
    ({"makespan_model": "median"}, "makespan_model"),
    ({"remaining_turns": [1, -2]}, "remaining_turns"),
    ({"remaining_turns": "3"}, "remaining_turns"),
    ({"spread": {"env_std_s": 1}}, "spread.env_mean_s"),
    ({"spread": {"env_mean_s": 1, "bogus": 2}}, "spread.bogus"),
    ({"spread": {"env_mean_s": -1}}, "spread.env_mean_s"),
])
def test_tail_inputs_are_validated(payload, key, capsys):
    code, _, err = _run({**PROFILE, "N": 6, **payload}, capsys=capsys)
    assert code == 2 and key in err


def test_mode_factors_scale_candidates_by_mode(capsys):
    """What the control plane learned per mode (``control.mode_correction``) turns a
    switch the model alone would make into a hold; under a neutral prior a lone factor
    changes nothing, under the default one (1.08) PD 19% faster is not enough."""
    from tests.core.test_decision import BASE
    current = {"mode": "colocated", "prefill": 0, "decode": 0}
    _, out, _ = _run({**BASE, "N": 6, "current": current, "pd_prior": 1.0}, capsys=capsys)
    raw = json.loads(out)
    assert raw["reason_code"] == "switch_mode"
    lone = {**BASE, "N": 6, "current": current, "mode_factors": {"colocated": 0.8}}
    _, out, _ = _run({**lone, "pd_prior": 1.0}, capsys=capsys)
    assert json.loads(out)["choice"] == raw["choice"] and json.loads(out)["reason_code"] == "switch_mode"
    _, out, _ = _run(lone, capsys=capsys)
    assert json.loads(out)["reason_code"] == "hold" and json.loads(out)["choice"]["colocated"] == 6
    factors = {"colocated": 0.8, "disaggregated": 1.22}
    _, out, _ = _run({**BASE, "N": 6, "current": current, "mode_factors": factors, "pd_prior": 1.0}, capsys=capsys)
    held = json.loads(out)
    assert held["reason_code"] == "hold" and held["choice"]["colocated"] == 6
    for got, want in zip(held["candidates"], raw["candidates"]):
        f = factors["colocated" if got["colocated"] else "disaggregated"]
        assert got["predicted_makespan_s"] == pytest.approx(want["predicted_makespan_s"] * f)


@pytest.mark.parametrize("payload,key", [
    ({"mode_factors": [1.0]}, "mode_factors"),
    ({"mode_factors": {"hybrid": 1.0}}, "mode_factors.hybrid"),
    ({"mode_factors": {"colocated": 0}}, "mode_factors.colocated"),
    ({"mode_factors": {"disaggregated": True}}, "mode_factors.disaggregated"),
    ({"pd_prior": 3.0}, "pd_prior"),
    ({"pd_prior": "high"}, "pd_prior"),
])
def test_mode_factors_are_validated(payload, key, capsys):
    code, _, err = _run({**PROFILE, "N": 6, **payload}, capsys=capsys)
    assert code == 2 and key in err


def test_gate_answers_equation_7_checked_against_pool_usage(capsys):
    """With ``gate`` the CLI answers the borrowing question as the control plane does:
    equation (7) on ``N`` dedicated and ``overlap_workers`` more, then the pool-usage check."""
    from pearl_sglang.core.gate import gate_for_profile

    want = gate_for_profile(Profile(**PROFILE), dedicated_workers=2, overlap_workers=8, remaining=40,
                            toggle_cost_s=9.4)
    assert want.borrow
    code, out, _ = _run({**PROFILE, "N": 2, "gate": {"overlap_workers": 8, "remaining": 40, "toggle_cost_s": 9.4}},
                        capsys=capsys)
    assert code == 0
    got = json.loads(out)["gate"]
    assert got["borrow"] and got["benefit_s"] == pytest.approx(want.benefit_s) and got["pool_usage"] is None
    idle = {"borrowed": False, "dedicated_busy_share": 0.52}
    code, out, _ = _run({**PROFILE, "N": 2, "gate": {"overlap_workers": 8, "remaining": 40, "toggle_cost_s": 9.4,
                                                     "pool_usage": idle}}, capsys=capsys)
    got = json.loads(out)["gate"]
    assert not got["borrow"] and "dedicated workers were busy 52%" in got["reason"]
    assert got["benefit_s"] == pytest.approx(want.benefit_s) and got["pool_usage"]["dedicated_busy_share"] == 0.52
    code, out, _ = _run({**PROFILE, "N": 2, "gate": {"overlap_workers": 8, "remaining": 40, "toggle_cost_s": 9.4,
                                                     "pool_usage": idle, "min_dedicated_busy_share": 0.5}},
                        capsys=capsys)
    assert json.loads(out)["gate"]["borrow"]


def test_gate_replays_a_given_last_step(capsys):
    """``last_step``: the control plane's replay of an unborrowed step (core.borrow_replay),
    here one trajectory that waits on its environment and workers that come late."""
    from pearl_sglang.core.borrow_replay import StepTimeline, replay_saving

    slow = [[0.0, 4.0]] + [[6.0, 4.0]] * 29
    last = {"trajectories": [slow, [[0.0, 10.0]] * 15], "span_s": 294.0, "join_after_s": 162.0}
    code, out, _ = _run({**PROFILE, "N": 2, "gate": {"overlap_workers": 8, "remaining": 40, "toggle_cost_s": 9.4,
                                                     "last_step": last}}, capsys=capsys)
    assert code == 0
    got = json.loads(out)["gate"]
    p = Profile(**PROFILE)
    want = replay_saving(StepTimeline((tuple(map(tuple, slow)), ((0.0, 10.0),) * 15), span_s=294.0, workers=2),
                         join_after_s=162.0, A=p.A, b=p.b, overlap_workers=8)
    assert got["replay"]["saved_s"] == pytest.approx(want.saved_s)
    assert got["borrow"] is (want.saved_s > 9.4) and ("replayed" in got["reason"]) is (want.saved_s <= 9.4)
    early = {**last, "join_after_s": 0.0}
    code, out, _ = _run({**PROFILE, "N": 2, "gate": {"overlap_workers": 8, "remaining": 40, "toggle_cost_s": 0.1,
                                                     "last_step": early}}, capsys=capsys)
    got = json.loads(out)["gate"]
    assert got["borrow"] and got["replay"]["saved_s"] > 0.1


@pytest.mark.parametrize("gate, key", [
    ({}, "gate.overlap_workers"),
    ({"overlap_workers": 8, "last_step": {"trajectories": [], "span_s": 1, "join_after_s": 0}},
     "gate.last_step.trajectories"),
    ({"overlap_workers": 8, "last_step": {"trajectories": [[[0, 1, 2]]], "span_s": 1, "join_after_s": 0}},
     "gate.last_step.trajectories[0]"),
    ({"overlap_workers": 8, "last_step": {"trajectories": [[[0, 1]]], "span_s": 0, "join_after_s": 0}},
     "gate.last_step.span_s"),
    ({"overlap_workers": 8, "last_step": {"trajectories": [[[0, 1]]], "span_s": 1}}, "gate.last_step.join_after_s"),
    ({"overlap_workers": 8, "last_step": {"trajectories": [[[0, 1]]], "span_s": 1, "join_after_s": 0, "x": 1}},
     "gate.last_step.x"),
    ({"overlap_workers": 8, "remaining": 65}, "gate.remaining"),
    ({"overlap_workers": 8, "toggle_cost_s": -1}, "gate.toggle_cost_s"),
    ({"overlap_workers": 8, "pool_usage": {"dedicated_busy_share": 1.5}}, "gate.pool_usage.dedicated_busy_share"),
    ({"overlap_workers": 8, "pool_usage": {"borrowed": "yes"}}, "gate.pool_usage.borrowed"),
    ({"overlap_workers": 8, "pool_usage": {"idle": 0.1}}, "gate.pool_usage.idle"),
    ({"overlap_workers": 8, "min_borrowed_busy_share": 2}, "gate.min_borrowed_busy_share"),
    ({"overlap_workers": 8, "explore": True}, "gate.explore"),
    ("borrow", "gate"),
])
def test_gate_inputs_are_validated(gate, key, capsys):
    code, _, err = _run({**PROFILE, "N": 2, "gate": gate}, capsys=capsys)
    assert code == 2 and f"key {key!r}" in err, err


# ---- found by fuzzing the command line ---------------------------------------------------

@pytest.mark.parametrize("payload,message", [
    ({**PROFILE, "N": 10**9}, "'N'"),  # ran for minutes writing every candidate, or out of memory
    ({**PROFILE, "N": 6, "gate": {"overlap_workers": 10**9}}, "gate.overlap_workers"),  # MemoryError
    ({**PROFILE, "N": 6, "current": {"mode": "disaggregated", "prefil": 1, "decode": 5}}, "current.prefil"),
    ({**PROFILE, "B": 1e308, "N": 6}, "too large"),  # printed Infinity, which strict JSON readers refuse
    ({**PROFILE, "B": 10**400, "N": 6}, "too large"),  # OverflowError
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),  # RecursionError
    ('{"B": ' + "9" * 5000 + "}", "not valid JSON"),  # past Python's 4300-digit limit
    ({**PROFILE, "N": 6, "rho_max": True}, "rho_max"),
])
def test_input_no_decision_can_use_is_a_one_line_error(payload, message, capsys):
    code, out, err = _run(payload, capsys=capsys)
    assert code == 2 and out == "" and err.startswith("error: ") and message in err, err


def test_a_plan_to_no_worker_or_over_a_malformed_table_is_an_error(capsys):
    table = StateTable.create(tp_size=1, dedicated_gpus=["n:0", "n:1"]).to_dict()
    code, _, err = _run({**PROFILE, "table": table, "target": {}}, "--plan", capsys=capsys)
    assert code == 2 and "'target'" in err  # was a plan removing every worker, exit 0
    code, _, err = _run({**PROFILE, "table": {**table, "workers": "x"}}, "--plan", capsys=capsys)
    assert code == 2 and "workers must be a list" in err  # was an AttributeError traceback
    for bad, key in (({"revision": -1}, "revision"), ({"overlap_gpus": {"a": 1}}, "overlap_gpus")):
        code, _, err = _run({**PROFILE, "table": {**table, **bad}}, "--plan", capsys=capsys)
        assert code == 2 and key in err


def test_input_that_is_not_utf8_and_a_huge_indent_are_errors(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_bytes(b"\xff\xfe{}")
    assert main([str(path)]) == 2 and "not UTF-8" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--indent", "100000000", str(path)])
    assert info.value.code == 2
