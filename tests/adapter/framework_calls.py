"""The HTTP calls each RL framework's rollout path makes to a router or to SGLang servers,
with the file and line of its released source, in the order a step makes them.

``to`` says where the call goes: "router" (PEARL, where the framework expects
sglang-router) or "worker" (an SGLang server the framework launched and registered).
Entries marked ``shim`` are what PEARL's shim sends instead of the framework's own call
listed just before them in the docstring of the scenario. docs/adapter.md shows the same
lists; tests/adapter/test_framework_calls.py replays them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    source: str
    to: str
    method: str
    path: str


SLIME = "slime v0.3.1 (a6272da0d4f3d0a08520c99a2f3b4f6c887960dc)"
SLIME_CALLS = (
    Call("slime/backends/sglang_utils/sglang_engine.py:93", "worker", "GET", "/health_generate"),
    Call("slime/backends/sglang_utils/sglang_engine.py:212", "router", "POST", "/workers"),
    Call("slime/rollout/sglang_rollout.py:201", "router", "POST", "/generate"),
    Call("slime/rollout/sglang_rollout.py:344", "router", "GET", "/workers"),
    # server_control.py:34 (POST {worker}/abort_request abort_all) and :40 (GET
    # {worker}/v1/loads?include=core, until idle) are replaced by the shim:
    Call("pearl_rl_adapter/shims/slime.py abort_through_router", "router", "POST", "/abort_request"),
    Call("slime/backends/sglang_utils/sglang_engine.py:443", "worker", "POST", "/pause_generation"),
    Call("slime/backends/sglang_utils/sglang_engine.py:294", "worker", "GET", "/flush_cache"),
    Call("slime/backends/sglang_utils/sglang_engine.py:387", "worker", "POST", "/update_weights_from_disk"),
    Call("slime/backends/sglang_utils/sglang_engine.py:450", "worker", "POST", "/continue_generation"),
    Call("slime/backends/sglang_utils/sglang_engine.py:347", "worker", "POST", "/release_memory_occupation"),
    Call("slime/backends/sglang_utils/sglang_engine.py:353", "worker", "POST", "/resume_memory_occupation"),
    Call("slime/rollout/sglang_rollout.py:201", "router", "POST", "/generate"),
    Call("slime/backends/sglang_utils/sglang_engine.py:322", "router", "GET", "/workers"),
    Call("slime/backends/sglang_utils/sglang_engine.py:326", "router", "DELETE", "/workers/{id}"),
)

ROLL = "ROLL v0.3.0 (7f9d4d3873a87679c8d070085a4bd3bdeea7e589), SglangRouter"
ROLL_CALLS = (
    Call("roll/distributed/scheduler/router.py:60", "router", "GET", "/workers"),
    Call("roll/distributed/scheduler/router.py:518", "router", "POST", "/generate"),
    # rebalance_on_shrink (router.py:792); its abort_all_worker (router.py:757, POST
    # {worker}/abort_request {"abort_all": true} on every worker) is a no-op under the shim
    Call("roll/distributed/scheduler/router.py:776", "router", "DELETE", "/workers/{quoted url}"),
    Call("roll/distributed/scheduler/router.py:60", "router", "GET", "/workers"),
    # rebalance_on_expand (router.py:817); abort_all_worker again a no-op
    Call("roll/distributed/scheduler/router.py:764", "router", "POST", "/workers"),
    Call("roll/distributed/scheduler/router.py:60", "router", "GET", "/workers"),
    Call("roll/distributed/scheduler/router.py:518", "router", "POST", "/generate"),
    # abort_requests (router.py:740): POST {worker}/abort_request {"rid"} on every worker,
    # replaced by the shim with one abort at PEARL, which knows where each rid runs:
    Call("pearl_rl_adapter/shims/roll.py abort_through_router", "router", "POST", "/abort_request"),
)

VERL = "verl 0.9.1 (PyPI wheel), ServerAdapter over AsyncHttpServerAdapter"
VERL_CALLS = (
    # ServerAdapter.resume(tags) (sglang_rollout.py:286 -> http_server_engine.py:756)
    Call("verl/workers/rollout/sglang_rollout/http_server_engine.py:756", "worker", "POST",
         "/resume_memory_occupation"),
    # update_weights: update_weights_from_tensor (sglang_rollout.py:459 -> :781) carries CUDA IPC
    # handles and cannot cross hosts; PEARL's shim pushes the exported checkpoint instead
    # (POST {router}/update_weights, admin, not replayed here), then veRL flushes:
    Call("verl/workers/rollout/sglang_rollout/http_server_engine.py:815", "worker", "GET", "/flush_cache"),
    Call("verl/workers/rollout/sglang_rollout/http_server_engine.py:756", "worker", "POST",
         "/resume_memory_occupation"),
    # generation: veRL calls its replicas through Ray (no HTTP); the shim's LLM client posts:
    Call("pearl_rl_adapter/shims/verl.py VerlRollout.generate", "router", "POST", "/generate"),
    Call("verl/workers/rollout/sglang_rollout/http_server_engine.py:741", "worker", "POST",
         "/release_memory_occupation"),
    # standalone engines (launch_server=True with router_ip/port) register and unregister:
    Call("verl/workers/rollout/sglang_rollout/http_server_engine.py:286", "router", "POST", "/add_worker"),
    Call("pearl_rl_adapter/shims/verl.py VerlRollout.generate", "router", "POST", "/generate"),
    Call("verl/workers/rollout/sglang_rollout/http_server_engine.py:414", "router", "POST", "/remove_worker"),
)

AREAL = "AReaL v1.0.4 (PyPI wheel areal-1.0.4), RemoteSGLangEngine"
AREAL_CALLS = (
    Call("areal/engine/sglang_remote.py:335", "router", "GET", "/health"),
    Call("areal/engine/sglang_remote.py:90", "router", "POST", "/generate"),
    Call("areal/engine/sglang_remote.py:327", "router", "POST", "/pause_generation"),
    Call("areal/engine/sglang_remote.py:204", "router", "POST", "/update_weights_from_disk"),
    Call("areal/engine/sglang_remote.py:331", "router", "POST", "/continue_generation"),
    Call("areal/engine/sglang_remote.py:90", "router", "POST", "/generate"),
)
# Every call above goes to each of AReaL's server addresses (remote_inf_engine.py:1302,
# _run_request_on_all_servers; generate: remote_inf_engine.py:866, resubmitted after an abort
# with prompt + partial output, :908). Only when rollout is colocated with training
# (rl_trainer.py:136) does AReaL also offload and onload its servers around each train step:
# rl_trainer.py:490 -> sglang_remote.py:339 POST /release_memory_occupation and
# rl_trainer.py:507 -> sglang_remote.py:350 POST /resume_memory_occupation. PEARL's router
# does not answer those (404): not replayed, see docs/adapter.md.
