"""The Figure 2 experiment and the calibration around it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks import calibrate
from benchmarks.calibration import analytic, space
from benchmarks.experiments import report, runner, scaling
from pearl_sglang.emulator.profile import load_profile
from pearl_sglang.workload.presets import load_preset

KEYS = ("reduction_16_to_24", "reduction_24_to_32", "rollout_share_32", "mean_trajectory_s", "max_busy_over_mean",
        "fig2b_prefill_token_share", "fig2b_prefill_time_share", "fig2b_decode_tok_s_per_gpu")


def test_quick_scaling_writes_every_fact_next_to_the_papers(tmp_path, monkeypatch):
    """The quick variant end to end, on pools and a workload small enough for a test."""
    monkeypatch.setattr(runner, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    real_jobs = scaling.jobs

    def small(**kw):
        named = real_jobs(**kw)
        tiny = {"turns_median": 3, "turns_max": 4, "env_latency_cut_s": 5.0}
        return {k: replace(j, config=replace(j.config, batch_size=16, group_size=4, dedicated_gpus=2,
                                             workload={**j.config.workload, **tiny}))
                for k, j in named.items()}
    monkeypatch.setattr(scaling, "jobs", small)
    assert scaling.main(["--quick", "--parallel", "2"]) == 0
    summary = json.loads((tmp_path / "scaling-quick" / "summary.json").read_text())
    for key in KEYS:
        assert summary[key] is not None, key
    assert set(summary["paper"]) == set(KEYS) - {"max_busy_over_mean"}
    assert summary["paper"]["reduction_16_to_24"] == 0.103 and summary["errors"] == 0
    t = {int(g): v for g, v in summary["rollout_s"].items()}
    assert summary["reduction_24_to_32"] == pytest.approx((t[24] - t[32]) / t[16])
    assert summary["rollout_share_32"] == pytest.approx(t[32] / (t[32] + 163.8))
    assert 0 < summary["fig2b_prefill_token_share"] < 1 and 0 < summary["fig2b_prefill_time_share"] < 1
    assert summary["fig2b_decode_tok_s_per_gpu"] > 0
    assert "fig2b_prefill_token_share" in (tmp_path / "scaling-quick" / "scaling-quick.md").read_text()


def test_misses_are_in_units_of_each_facts_tolerance():
    facts = dict(scaling.PAPER, reduction_16_to_24=0.103 + 0.06, mean_trajectory_s=216.3 * 0.95)
    m = scaling.misses(facts)
    assert m["reduction_16_to_24"] == pytest.approx(2.0) and m["mean_trajectory_s"] == pytest.approx(-0.5)
    assert m["rollout_share_32"] == 0


def test_calibration_space_scales_profiles_and_stays_in_its_ranges():
    point = dict(calibrate.START, prefill_efficiency=space.BUNDLED_PREFILL_EFFICIENCY / 2, decode_efficiency_30b=0.4)
    space.check(point)
    with pytest.raises(ValueError, match="outside its range"):
        space.check(dict(point, rewrite_fraction=1.5))
    roof, slow = load_profile("qwen3-30b-a3b-h800-tp2"), space.profile("qwen3-30b-a3b", point, name="x")
    assert slow.cost.prefill_per_token_s == pytest.approx(2 * roof.cost.prefill_per_token_s)
    d, a = space.BUNDLED_DECODE_EFFICIENCY / 0.4, space.BUNDLED_DECODE_EFFICIENCY / point["decode_attention_efficiency"]
    assert slow.cost.decode_s(8, 0) == pytest.approx(d * roof.cost.decode_s(8, 0))
    assert slow.cost.decode_per_ctx_token_s == pytest.approx(a * roof.cost.decode_per_ctx_token_s)
    fields = space.workload_fields(dict(point, response_tokens_mean=1500))
    assert fields["response_tokens"] == [900, space.MAX_RESPONSE]
    load_preset("env-bound").sweworkload(**fields).validate()


def test_closed_form_token_share_grows_with_the_rewrite_share():
    base = load_preset("env-bound")
    shares = [analytic.prefill_token_share(base.sweworkload(batch_size=16, rewrite_fraction=r), range(1))
              for r in (0.0, 0.5, 1.0)]
    assert shares[0] < shares[1] < shares[2] < 1
    assert analytic.bisect(lambda x: x * x, 0.25, 0.0, 1.0) == pytest.approx(0.5, abs=1e-3)
    assert analytic.bisect(lambda x: x, 2.0, 0.0, 1.0) == 1.0  # out of reach: the bound


def test_search_steps_the_efficiencies_toward_their_facts_within_its_budget():
    """A fake regime where each fact follows its efficiency as ``update`` assumes."""
    class Fake:
        def __init__(self):
            self.history = []

        def solve(self, point):
            return point

        def __call__(self, point):
            d30, p, d8 = point["decode_efficiency_30b"], point["prefill_efficiency"], point["decode_efficiency_8b"]
            att = point["decode_attention_efficiency"]
            odds = 0.36 * (d30 / 0.5) / (p / 0.5)
            facts = dict(scaling.PAPER, fig2b_decode_tok_s_per_gpu=800 * d30, fig2b_prefill_time_share=odds / (1 + odds),
                         reduction_16_to_24=0.25 - 0.4 * att, reduction_24_to_32=0.12 - 0.1 * att,
                         rollout_share_32=1.0 - 0.4 * d8)
            entry = {"point": point, "facts": facts,
                     "objective": sum(m * m for m in scaling.misses(facts).values())}
            self.history.append(entry)
            return entry
    fake = Fake()
    best = calibrate.search(fake, dict(calibrate.START), max_evals=4)
    assert 2 <= len(fake.history) <= 4  # stops early once a step repeats a candidate
    assert best["objective"] == min(e["objective"] for e in fake.history) < fake.history[0]["objective"]
    assert best["facts"]["fig2b_decode_tok_s_per_gpu"] == pytest.approx(400, rel=0.02)
    for name, value in best["point"].items():
        space.check({**best["point"], name: value})


def test_report_names_the_range_that_stops_a_fact():
    point = dict(calibrate.START, decode_efficiency_30b=0.85)
    facts = dict(scaling.PAPER, fig2b_decode_tok_s_per_gpu=250.0, reduction_16_to_24=0.05)
    best = {"point": point, "facts": facts, "misses": scaling.misses(facts)}
    lines = calibrate.limits(best)
    assert len(lines) == 2
    assert lines[0].startswith("- `reduction_16_to_24`") and "budget of candidates ran out" in lines[0]
    assert lines[1].startswith("- `fig2b_decode_tok_s_per_gpu`")
    assert "`decode_efficiency_30b` sits at the bound 0.85 of its range [0.3, 0.85]" in lines[1]
