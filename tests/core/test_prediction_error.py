"""Prediction-error helpers the replay and the demo report."""
import pytest

from pearl_sglang.core.prediction_error import mape, new_prediction


def test_mape_skips_unobserved_and_empty():
    assert mape([(90.0, 100.0), (120.0, 100.0), (5.0, 0.0)]) == pytest.approx(0.15)
    assert mape([]) is None


def test_new_prediction_reports_each_step_once():
    seen: set = set()
    entries = [{"step": 0, "predicted_s": 1.0, "observed_s": 2.0, "borrowed": False}]
    assert new_prediction(entries, seen) == {"predicted_s": 1.0, "observed_s": 2.0, "borrowed": False}
    assert new_prediction(entries, seen) is None
    assert new_prediction([], seen) is None


def test_new_prediction_carries_the_mode_and_its_corrected_prediction():
    entry = {"step": 3, "predicted_s": 10.0, "observed_s": 12.0, "borrowed": True, "mode": "disaggregated",
             "corrected_s": 11.0, "predicted_by_model_s": {"paper": 10.0, "tail": 14.0}}
    assert new_prediction([entry], set()) == {k: v for k, v in entry.items() if k != "step"}
