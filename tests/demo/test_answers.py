"""The trace replayer's answer checks against tables as /pearl/state shows them."""
from __future__ import annotations

from pearl_rl_adapter import GpusJoined, GpusLeft
from pearl_sglang.demo.answers import check_join, check_leave

GPUS = ["spot0:0", "spot0:1"]


def table(*workers, budget=("d0:0", "d0:1", *GPUS)):
    return {"dedicated_gpus": list(budget), "workers": [
        {"slot": slot, "gpus": list(gpus), "role": "colocated", "activity": activity}
        for slot, gpus, activity in workers]}


def joined(admitted=(), cancelled=False, reason=None):
    return GpusJoined(admitted=tuple(admitted), cancelled=cancelled, reason=reason)


def test_a_join_answer_must_name_exactly_the_serving_workers_on_its_gpus():
    serving = table((0, ["d0:0", "d0:1"], "active"), (1, GPUS, "active"))
    assert check_join(joined(["1"]), GPUS, serving) is None
    assert "serving on them are ['1']" in check_join(joined(["0", "1"]), GPUS, serving)
    assert "serving on them are ['1']" in check_join(joined(cancelled=True, reason="x"), GPUS, serving)
    assert "at once" in check_join(joined(["1"], cancelled=True), GPUS, serving)


def test_a_join_that_admitted_nothing_needs_a_reason_and_nothing_on_the_way():
    idle = table((0, ["d0:0", "d0:1"], "active"))
    assert check_join(joined(cancelled=True, reason="start failed"), GPUS, idle) is None
    assert "no reason" in check_join(joined(cancelled=True), GPUS, idle)
    launching = table((0, ["d0:0", "d0:1"], "active"), (1, GPUS, "joining"))
    assert "being made ready" in check_join(joined(cancelled=True, reason="pre-empted"), GPUS, launching)


def test_a_leave_answer_means_the_gpus_are_free_and_out_of_the_budget():
    left = GpusLeft(removed=("1",), elapsed_s=1.0)
    assert check_leave(left, GPUS, table((0, ["d0:0", "d0:1"], "active"), (1, GPUS, "inactive"),
                                         budget=("d0:0", "d0:1"))) is None
    assert "still hold them" in check_leave(left, GPUS, table((1, GPUS, "leaving"), (2, GPUS, "joining"),
                                                              budget=("d0:0", "d0:1")))
    assert "still in the budget" in check_leave(left, GPUS, table())
