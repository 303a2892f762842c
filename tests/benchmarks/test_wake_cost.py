"""The price-of-idleness bench: it parses real turns with the router's own calls and
reports one median per gap for the router's work and the relay's."""
from __future__ import annotations

import json

import pytest

from benchmarks.wake_cost import GAPS_MS, main, router_parse, turn
from pearl_sglang.router.config import Limits
from pearl_sglang.router.errors import BadRequest


def test_each_size_and_work_has_a_median_per_gap(tmp_path, capsys):
    out = tmp_path / "wake.json"
    assert main(["--calls", "3", "--sizes", "tiny", "4k", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["size"], r["work"]) for r in rows] == [
        ("tiny", "router parse"), ("tiny", "relay copy"), ("4k", "router parse"), ("4k", "relay copy")]
    for r in rows:
        assert list(r["cpu_us"]) == [f"{g:g} ms" for g in GAPS_MS] + ["sweep"]
        assert all(v > 0 for v in r["cpu_us"].values())
    assert "| 4k | router parse |" in capsys.readouterr().out
    assert out.with_suffix(".md").read_text().startswith("# CPU of one turn's parsing")


def test_the_router_parse_is_the_lanes_own_and_refuses_what_it_refuses():
    head, body = turn(4096)
    assert router_parse(head, body, Limits()) == 4096
    with pytest.raises(BadRequest):
        router_parse(head, body.replace(b'"stream":false', b'"stream":"no"'), Limits())
