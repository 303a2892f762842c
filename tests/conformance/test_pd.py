"""PD disaggregation as PEARL drives it: bootstrap fields, rooms, role switches."""
from __future__ import annotations

import random
import threading
import time

import pytest

from tests.support.http import get, post

pytestmark = pytest.mark.realsglang

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


def pd_generate(prefill_url, decode_url, bootstrap_port, body):
    """What a PD router does: same JSON plus bootstrap fields, sent to both at once."""
    room = random.randint(0, 2**63 - 1)
    full = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": bootstrap_port,
            "bootstrap_room": room}
    replies = {}

    def send(name, url):
        replies[name] = post(url + "/generate", full)

    threads = [threading.Thread(target=send, args=("p", prefill_url)),
               threading.Thread(target=send, args=("d", decode_url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(330)  # beyond the requests' own 300 s timeout, so a reply is always there
    return replies["p"], replies["d"]


def test_pd_request_decode_includes_prefill_token(pd_pair, worker):
    body = {"text": "the environment returns", "sampling_params": GREEDY}
    p, d = pd_generate(pd_pair.prefill_url, pd_pair.decode_url, pd_pair.prefill_bootstrap_port, body)
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    pre, dec = p.json(), d.json()
    assert pre["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert len(pre["output_ids"]) == 1
    assert dec["output_ids"][0] == pre["output_ids"][0]
    assert len(dec["output_ids"]) == 10
    colocated = post(worker.url + "/generate", body).json()
    assert dec["output_ids"] == colocated["output_ids"]


def test_pd_server_refuses_request_without_room(pd_pair):
    r = post(pd_pair.prefill_url + "/generate", {"text": "no room", "sampling_params": GREEDY})
    assert r.status_code == 400
    assert "bootstrap room" in r.text


def test_pd_model_info_shows_role(pd_pair):
    assert get(pd_pair.prefill_url + "/model_info").json()["disaggregation_mode"] == "prefill"
    assert get(pd_pair.decode_url + "/model_info").json()["disaggregation_mode"] == "decode"


def switch(url, role):
    body = {"new_role": role}
    if role == "decode":
        body["decode_cuda_graph_memory_gb"] = 0
    return post(url + "/pd_role_switch", body)


def test_role_switch_swaps_prefill_and_decode(pd_pair):
    body = {"text": "swap the roles", "sampling_params": GREEDY}
    _, before = pd_generate(pd_pair.prefill_url, pd_pair.decode_url,
                            pd_pair.prefill_bootstrap_port, body)
    assert before.status_code == 200
    try:
        for url, role in ((pd_pair.prefill_url, "decode"), (pd_pair.decode_url, "prefill")):
            r = switch(url, role)
            assert r.status_code == 200 and r.json()["success"], r.text
            assert r.json()["new_role"] == role
        assert get(pd_pair.prefill_url + "/model_info").json()["disaggregation_mode"] == "decode"
        assert get(pd_pair.prefill_url + "/server_info").json()["disaggregation_mode"] == "prefill"
        # The new prefill serves on its own bootstrap port.
        for _ in range(3):
            p, d = pd_generate(pd_pair.decode_url, pd_pair.prefill_url,
                               pd_pair.decode_bootstrap_port, body)
            assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
            assert d.json()["output_ids"] == before.json()["output_ids"]
    finally:
        switch(pd_pair.decode_url, "decode")
        switch(pd_pair.prefill_url, "prefill")
    assert get(pd_pair.prefill_url + "/model_info").json()["disaggregation_mode"] == "prefill"
    _, after = pd_generate(pd_pair.prefill_url, pd_pair.decode_url,
                           pd_pair.prefill_bootstrap_port, body)
    assert after.json()["output_ids"] == before.json()["output_ids"]


def test_role_switch_refused_while_busy(pd_pair):
    long = {"text": "keep busy", "sampling_params": {"temperature": 0, "max_new_tokens": 1000,
                                                     "ignore_eos": True}}
    result = {}
    t = threading.Thread(target=lambda: result.update(r=pd_generate(
        pd_pair.prefill_url, pd_pair.decode_url, pd_pair.prefill_bootstrap_port, long)))
    t.start()
    deadline = time.monotonic() + 60
    running = False
    while time.monotonic() < deadline and not running:
        loads = get(pd_pair.decode_url + "/v1/loads").json()["loads"]
        running = bool(sum(e["num_running_reqs"] for e in loads))
        time.sleep(0.05)
    assert running, "the PD request never started decoding"
    r = switch(pd_pair.decode_url, "prefill")
    if r.status_code == 200:  # it had already finished: restore the pair for later tests
        switch(pd_pair.decode_url, "decode")
    assert r.status_code == 400
    assert "not idle" in r.text
    t.join(300)
    _, d = result["r"]
    assert d.status_code == 200 and len(d.json()["output_ids"]) == 1000
