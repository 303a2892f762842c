"""Trajectory tags and the rollout client's /generate round trip."""
from __future__ import annotations

import pytest

from pearl_rl_adapter import PearlUnavailable, RolloutClient, Trajectory, TurnCounter, tag_headers
from pearl_rl_adapter.rollout import parse_generate


def test_tag_headers():
    assert tag_headers("traj-1", 0) == {"X-Pearl-Trajectory-Id": "traj-1", "X-Pearl-Turn": "0"}
    for bad_id, bad_turn in [("", 0), ("x" * 257, 0), ("a\r\nb", 0), ("t", -1), ("t", True), ("t", "1")]:
        with pytest.raises(ValueError):
            tag_headers(bad_id, bad_turn)


def test_tag_headers_with_an_expected_turn_count():
    assert tag_headers("t", 2, 30) == {"X-Pearl-Trajectory-Id": "t", "X-Pearl-Turn": "2",
                                       "X-Pearl-Expected-Turns": "30"}
    assert "X-Pearl-Expected-Turns" not in tag_headers("t", 2)
    for bad in (0, -1, True, 2.0, "3", 10**9):
        with pytest.raises(ValueError, match="expected_turns"):
            tag_headers("t", 0, bad)
    t = Trajectory("abc", expected_turns=12)
    assert [t.next_turn()["X-Pearl-Expected-Turns"] for _ in range(2)] == ["12", "12"]


def test_trajectory_counts_turns():
    t = Trajectory("abc")
    assert [t.next_turn()["X-Pearl-Turn"] for _ in range(3)] == ["0", "1", "2"] and t.turns == 3
    assert Trajectory().trajectory_id != Trajectory().trajectory_id


def test_turn_counter_is_bounded_and_keeps_recent_trajectories():
    c = TurnCounter(max_trajectories=2)
    c.next_turn("a"), c.next_turn("b"), c.next_turn("a"), c.next_turn("c")  # "b" is the oldest
    assert len(c) == 2
    assert c.next_turn("a")["X-Pearl-Turn"] == "2" and c.next_turn("b")["X-Pearl-Turn"] == "0"


def test_parse_generate_reads_logprob_triples_without_output_ids():
    g = parse_generate({"meta_info": {"output_token_logprobs": [[-1.0, 7, "x"]], "finish_reason": {"type": "abort"}}})
    assert g.token_ids == (7,) and g.log_probs == (-1.0,) and g.aborted


async def test_rollout_client_tags_requests(fake, config):
    c = RolloutClient(config=config)
    try:
        out = await c.generate([1, 2, 3], {"max_new_tokens": 2}, trajectory_id="t-9", turn=4)
        assert out.token_ids == (3, 4) and out.log_probs == (-0.5, -0.25) and out.finish_reason == "length"
        sent = fake.calls[-1]
        assert sent.headers["X-Pearl-Trajectory-Id"] == "t-9" and sent.headers["X-Pearl-Turn"] == "4"
        assert sent.body["return_logprob"] is True and "Authorization" not in sent.headers
        assert "X-Pearl-Expected-Turns" not in sent.headers
        await c.generate([1, 2, 3], {"max_new_tokens": 2}, trajectory_id="t-9", turn=5, expected_turns=20)
        assert fake.calls[-1].headers["X-Pearl-Expected-Turns"] == "20"
        with pytest.raises(ValueError, match="trajectory_id"):
            await c.generate([1], {}, expected_turns=20)
        fake.fail("/generate", 503, "overloaded", times=5)
        with pytest.raises(PearlUnavailable, match="overloaded"):
            await c.generate([1], {})
        assert sum(a.path == "/generate" for a in fake.attempts) == 3  # generation is never retried
    finally:
        await c.aclose()
