"""Profile fitting recovers known parameters from noisy synthetic telemetry."""
import random

import pytest

from pearl_sglang.core.errors import InvalidProfile
from pearl_sglang.core.telemetry import (
    ENGINE_RATES,
    DecodeSample,
    PrefillSample,
    ProfileFit,
    ProfileTracker,
    StaticFacts,
    StepTelemetry,
    TurnRecord,
    WorkloadEstimate,
    fit_step,
    fitted_symbols,
)

FACTS = StaticFacts(B=64, K=147456, BW=8e10, K_seq=4.8e9, H_max=1.2e11, T_over=0.1)


def synthetic_step(rng: random.Random, *, B, S, r, delta_L, theta, A, b, t_prefill, carry_share=0.3):
    """One step of telemetry generated from known symbols with multiplicative noise.

    Each turn's prefill work (new input + the previous response carried over) averages
    ``delta_L``; decode time follows ``A + b * c`` per token at a random concurrency;
    environment time is exponential with a mean ``theta`` times the mean decode time.
    """
    turns = []
    c_mean = B / 4
    mean_decode = r * (A + b * c_mean)
    for traj in range(B):
        n = S if traj == 0 else rng.randint(max(1, S // 2), S)
        carried_prev = 0
        for k in range(n):
            gen = max(1, round(rng.gauss(r, 0.15 * r)))
            carried = round(gen * carry_share)
            new_input = max(0, round(rng.gauss(delta_L, 0.1 * delta_L) - carried_prev))
            c = rng.uniform(0.5 * c_mean, 1.5 * c_mean)
            decode = gen * (A + b * c) * rng.uniform(0.95, 1.05)
            env = rng.expovariate(1.0 / (theta * mean_decode)) if theta > 0 else 0.0
            turns.append(TurnRecord(f"t{traj}", k, new_input, carried, gen, env, decode))
            carried_prev = carried
    # ``new_input`` already absorbed the carried share, so delta_L is recovered only if
    # the fitter adds carried tokens back for every turn that has a successor.
    # A step of minutes yields thousands of iteration timings per worker; 1000 is modest.
    decode_samples = []
    for _ in range(1000):
        c = rng.uniform(1, B)
        decode_samples.append(DecodeSample(c, (A + b * c) * rng.uniform(0.95, 1.05)))
    prefill_samples = []
    for _ in range(200):
        tok = rng.randint(500, 30_000)
        prefill_samples.append(PrefillSample(tok, tok * t_prefill * rng.uniform(0.9, 1.1)))
    return StepTelemetry(tuple(turns), tuple(decode_samples), tuple(prefill_samples))


CASES = [
    dict(B=64, S=30, r=400, delta_L=2000, theta=1.2, A=0.005, b=3.6e-4, t_prefill=2e-5),
    dict(B=32, S=12, r=150, delta_L=9000, theta=0.4, A=0.02, b=1e-4, t_prefill=5e-5),
    dict(B=96, S=50, r=1200, delta_L=800, theta=3.0, A=0.003, b=6e-4, t_prefill=1e-5),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_tracker_recovers_parameters_within_5_percent(case, seed):
    rng = random.Random(seed)
    tracker = ProfileTracker(alpha=0.3)
    for _ in range(10):
        tracker = tracker.observe(synthetic_step(rng, **case))
    prof = tracker.profile(FACTS)
    for key in ("S", "r", "delta_L", "theta", "A", "b", "t_prefill"):
        assert getattr(prof, key) == pytest.approx(case[key], rel=0.05), key
    # T_env is S times the mean environment time per turn.
    mean_decode = case["r"] * (case["A"] + case["b"] * case["B"] / 4)
    assert prof.T_env == pytest.approx(case["S"] * case["theta"] * mean_decode, rel=0.08)
    assert (prof.B, prof.K, prof.H_max) == (FACTS.B, FACTS.K, FACTS.H_max)


def test_ema_tracks_drift_and_keeps_unidentified_fields():
    rng = random.Random(3)
    base = CASES[0]
    tracker = ProfileTracker(alpha=0.5).observe(synthetic_step(rng, **base))
    moved = {**base, "r": base["r"] * 2}
    step = synthetic_step(rng, **moved)
    # A step whose decode samples sit at one concurrency cannot identify A and b.
    step = StepTelemetry(step.turns, (DecodeSample(8, 0.01), DecodeSample(8, 0.011)), ())
    t2 = tracker.observe(step)
    assert t2.estimate.r == pytest.approx(0.5 * tracker.estimate.r + 0.5 * fit_step(step).r)
    assert (t2.estimate.A, t2.estimate.b, t2.estimate.t_prefill) == (
        tracker.estimate.A, tracker.estimate.b, tracker.estimate.t_prefill)
    assert t2.steps == 2


def test_profile_needs_every_symbol_observed():
    rng = random.Random(0)
    step = synthetic_step(rng, **CASES[0])
    tracker = ProfileTracker().observe(StepTelemetry(step.turns))
    with pytest.raises(InvalidProfile) as e:
        tracker.profile(FACTS)
    assert e.value.key == "A"


def test_fitted_symbols_leave_the_engine_rates_to_the_configuration_under_workload():
    est = WorkloadEstimate(S=30.0, r=400.0, delta_L=None, theta=0.5, T_env=100.0, A=0.02, b=None, t_prefill=2e-4)
    assert fitted_symbols(est) == {"S": 30.0, "r": 400.0, "theta": 0.5, "T_env": 100.0, "A": 0.02,
                                   "t_prefill": 2e-4}
    assert fitted_symbols(est, ProfileFit.WORKLOAD) == {"S": 30.0, "r": 400.0, "theta": 0.5, "T_env": 100.0}
    assert ENGINE_RATES == {"A", "b", "t_prefill"}


def contended_samples(rng: random.Random, *, A, b_seq, b_ctx, t_prefill, n=1500):
    """Decode and prefill telemetry of a contended colocated worker, shaped as measured on
    the emulated pool: late turns are long and run beside few others, early ones short
    and crowded (so context and concurrency are anti-correlated); prefills, which take
    priority, stretch the decode they interrupt; and one wait in ten for a first chunk
    also holds something that is not prefill (KV memory, a worker's other work)."""
    decode, prefill = [], []
    for _ in range(n):
        late = rng.random()
        c = max(1.0, rng.gauss(14 - 12 * late, 1.5))
        ctx_per_seq = 4000 + 30_000 * late * rng.uniform(0.8, 1.2)
        x = rng.uniform(0, 30)  # prefill tokens run per generated token
        it = (A + b_seq * c + b_ctx * c * ctx_per_seq + t_prefill * x) * rng.uniform(0.97, 1.03)
        decode.append(DecodeSample(c, it, context_tokens=c * ctx_per_seq, prefill_tokens_per_token=x))
    for _ in range(n // 2):
        tok = rng.randint(300, 20_000)
        extra = rng.uniform(1, 8) if rng.random() < 0.1 else 0.0
        prefill.append(PrefillSample(tok, tok * t_prefill * rng.uniform(0.8, 1.2) + extra))
    return tuple(decode), tuple(prefill), ctx_per_seq


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_rates_fit_from_a_contended_colocated_worker(seed):
    """``b`` is one more sequence at the mean context seen; the concurrency alone gives a
    slope near zero here (the old fit), and the prefill tail inflates a ratio of sums."""
    rng = random.Random(seed)
    A, b_seq, b_ctx, t_p = 0.0121, 4e-5, 8.8e-8, 3e-5
    decode, prefill, _ = contended_samples(rng, A=A, b_seq=b_seq, b_ctx=b_ctx, t_prefill=t_p)
    est = fit_step(StepTelemetry((), decode, prefill))
    per_seq = sum(d.context_tokens for d in decode) / sum(d.concurrency for d in decode)
    assert est.A == pytest.approx(A, rel=0.05)
    assert est.b == pytest.approx(b_seq + b_ctx * per_seq, rel=0.05)
    assert est.t_prefill == pytest.approx(t_p, rel=0.1)
    # What the fit did before (concurrency alone, prefill seconds over tokens) is far off.
    blind = fit_step(StepTelemetry((), tuple(DecodeSample(d.concurrency, d.iteration_s) for d in decode), ()))
    assert blind.b < 0.5 * est.b
    assert sum(p.seconds for p in prefill) / sum(p.tokens for p in prefill) > 1.5 * t_p


def test_terms_whose_regressor_does_not_vary_are_left_out():
    """A PD decode worker runs no prefill and a source may report no context: the fit
    falls back to the terms that vary."""
    samples = tuple(DecodeSample(c, 0.01 + 2e-4 * c) for c in (1.0, 4.0, 9.0, 16.0))
    est = fit_step(StepTelemetry((), samples, ()))
    assert (est.A, est.b) == (pytest.approx(0.01), pytest.approx(2e-4))
    assert est.t_prefill is None
