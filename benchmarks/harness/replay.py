"""Replay a trace segment for one system: PEARL's real router and control plane against
in-process emulated workers, on a virtual clock.

Real code: the router (dispatch, migration, telemetry), the control plane (decision
engine, planner, orchestrator, executors, borrowing gate), the RL driver
(``AgenticRLDriver`` with its admin hooks) and the trace replayer, talking to the router
over loopback HTTP, except the driver's turns, which reach it in-process
(``benchmarks.harness.in_process_front_door``; ``--front-door http`` sends them over HTTP,
with the same results).  Emulated: the workers (``pearl_sglang.emulator`` in this process), the agent
environment, the trainer and time (``vtime.VirtualTimeLoop``).  A two-hour segment
therefore replays in CPU time only.  The router's generation calls reach the emulated
workers in-process (``benchmarks.harness.in_process_transport``), as does a PD decode's KV
handoff (``InProcessEmulatorLauncher(in_process_pd=True)``); its control calls use HTTP.
An in-process replay is reproducible to the digit, also on a loaded host. ``--worker-transport http`` sends
the generation calls over loopback HTTP too, for ~1.3x the CPU and results that vary from
run to run by about 1% (measured 2026-12-03: step times 681.06 vs 681.96 s): events at one
virtual instant then run in the order their sockets become readable, which moves some
routing choices (333 vs 338 requests on one worker in the first step).

    .venv/bin/python -m benchmarks.harness.replay --system pearl --segment 1 \
        [--model qwen3-8b] [--minutes 120] [--batch-size 64 --group-size 16] [--out FILE.json]
    .venv/bin/python -m benchmarks.harness.replay --trace-file my-trace.csv --trace-start-h 2.5

``--trace-file`` replays any trace in the Bamboo event format (``t_ms,add|remove,node``
rows) instead of p3; the window then starts at ``--trace-start-h`` (default 0). Every
join and leave answer of the trace replayer is checked against the cluster's table; a
wrong one (or a failed call) fails the replay (``WrongAnswers``) after it finishes.

Throughput of a step (section 6.1) = (rollout generated + training tokens) / step duration,
where a step runs from the previous weight push to its own (``StepResult``).  The run
stops at the end of the window after the step in progress (its training and weight push
complete); steps that end after the window are kept but flagged ``in_window: false``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from aiohttp import web

from benchmarks.harness import vtime
from benchmarks.harness.recording import Recorder, summarize
from benchmarks.harness.systems import (ROLL_LARGE_GPUS, SEGMENT_LENGTH_S, SEGMENTS, System, core_profile, model,
                                        system)
from pearl_rl_adapter import AsyncPearlClient, ClientConfig
from benchmarks.harness.emulator_launcher import InProcessEmulatorLauncher, phases
from benchmarks.harness.in_process_front_door import InProcessFrontDoor
from benchmarks.harness.in_process_transport import InProcessTransport
from pearl_sglang.aio import cancelled_at_exit
from pearl_sglang.control.cluster_config import ClusterConfig
from pearl_sglang.core.state import Activity, StateTable
from pearl_sglang.demo.replay import TraceReplayer
from pearl_sglang.emulator.worker import Worker
from pearl_sglang.router.config import RouterConfig, Security
from pearl_sglang.router.dispatch import DispatchConfig
from pearl_sglang.server.compose import build_app
from pearl_sglang.state_store import StateStore
from pearl_sglang.workers.client import TransportFactory, WorkerClient
from pearl_sglang.workload import AgenticRLDriver, DriverConfig, SweWorkload, TrainerProfile, admin_hooks
from pearl_sglang.workload.presets import DEFAULT_PRESET, available_presets, load_preset
from pearl_sglang.workload.timebase import EmulatedTime
from pearl_sglang.workload.trace import BAMBOO_P3, mean_workers, read_bamboo, worker_targets

log = logging.getLogger("pearl.replay")
TOKEN = "replay-admin-token"


@dataclass(frozen=True)
class ReplayConfig:
    system: str = "pearl"
    model: str = "qwen3-8b"
    segment: Optional[int] = 1                 # SEGMENTS key; or give trace_start_h
    trace_start_h: Optional[float] = None      # overrides segment
    trace_file: Optional[str] = None           # a Bamboo-format trace instead of p3 (window from trace_start_h or 0)
    minutes: float = SEGMENT_LENGTH_S / 60
    batch_size: int = 64
    group_size: int = 16
    preset: str = DEFAULT_PRESET               # workload and profiles (pearl_sglang/workload/presets)
    rewrite_fraction: Optional[float] = None   # None: the preset's; 0 cache-friendly, ~0.9 prefill-heavy
    workload: dict[str, Any] = field(default_factory=dict)  # other SweWorkload fields over the preset's
    emulator_profile_path: Optional[str] = None  # a profile JSON instead of the preset's (calibration)
    train_step_s: Optional[float] = None       # default: the model's
    max_preemptible_workers: int = 6
    steps: Optional[int] = None                # stop after this many steps (else the window)
    seed: int = 0
    stream_interval: int = 64                  # router -> worker chunk interval (router default 16)
    worker_transport: str = "in-process"       # router -> worker /generate: "in-process" or "http"
    front_door: str = "in-process"             # driver -> router /generate: "in-process" or "http"
    engine_stepping: str = "stretch"           # emulator: "stretch" or "iteration" (same results, more CPU)
    sample_every_s: float = 60.0               # topology samples (virtual seconds)
    cold_start: bool = True                    # launched workers wait the profile's cold start
    request_timeout_s: float = 3600.0
    cluster_overrides: dict[str, Any] = field(default_factory=dict)  # merged into the cluster mapping
    # Overrides of the system's deployment (fixed-resource experiments: PD sweep, ablation)
    dedicated_gpus: Optional[int] = None       # reserved rollout GPUs (even)
    follow_trace: Optional[bool] = None        # False: no preemptible GPUs
    pd_mode: Optional[str] = None              # auto, colocated, disaggregated or "P:D"
    router: dict[str, Any] = field(default_factory=dict)  # RouterConfig fields (e.g. straggler_priority)
    engine_args: tuple[str, ...] = ()          # extra worker flags (e.g. --enable-priority-scheduling)
    carry_over_share: Optional[float] = None   # driver: partial rollouts (end at this share; None: off)
    turns_hint_sigma: Optional[float] = None   # driver: X-Pearl-Expected-Turns with this error (None: off)

    def sweworkload(self) -> SweWorkload:
        """The preset's workload with this run's batch, seed and overrides."""
        extra = {} if self.rewrite_fraction is None else {"rewrite_fraction": self.rewrite_fraction}
        return load_preset(self.preset).sweworkload(batch_size=self.batch_size, group_size=self.group_size,
                                                    seed=self.seed, **extra, **self.workload)

    def emulator_profile(self) -> str:
        return self.emulator_profile_path or load_preset(self.preset).profile_for(self.model)

    def start_h(self) -> float:
        if self.trace_start_h is not None:
            return self.trace_start_h
        if self.trace_file is not None:
            return 0.0
        if self.segment not in SEGMENTS:
            raise ValueError(f"segment must be one of {sorted(SEGMENTS)} (or give trace_start_h)")
        return SEGMENTS[self.segment]


def resolve_system(config: ReplayConfig) -> System:
    if config.system == "roll-large":  # the segment's size
        if config.segment not in ROLL_LARGE_GPUS:
            raise ValueError("roll-large needs a segment (or name the size: roll-large-14)")
        sysdef = system(f"roll-large-{ROLL_LARGE_GPUS[config.segment]}")
    else:
        sysdef = system(config.system)
    if config.dedicated_gpus is not None:
        if config.dedicated_gpus < 2 or config.dedicated_gpus % 2:
            raise ValueError("dedicated_gpus must be an even number >= 2 (TP2 workers)")
        sysdef = replace(sysdef, dedicated_workers=config.dedicated_gpus // 2)
    if config.follow_trace is not None:
        sysdef = replace(sysdef, follows_trace=config.follow_trace)
    if config.pd_mode is not None:
        sysdef = replace(sysdef, pd_mode=config.pd_mode)
    return sysdef


def _gpus(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i // 8}:{i % 8}" for i in range(n)]


def cluster_mapping(config: ReplayConfig, sysdef: System, model_dir: Path) -> dict[str, Any]:
    m = model(config.model)
    emulator_profile = config.emulator_profile()
    profile = core_profile(config.model, config.batch_size, emulator_profile=emulator_profile)
    data = {
        "engine": {"kind": "emulator", "model_path": str(model_dir), "tp_size": 2, "weight_version": "step-init",
                   # time_scale 1: the workers' clock is the (virtual) event loop's clock
                   # The in-process launcher waits the profile's cold start before the port opens.
                   "emulator": {"profile": emulator_profile, "time_scale": 1, "seed": config.seed,
                                "engine_stepping": config.engine_stepping,
                                **({} if config.cold_start else {"cold_start": 0})}},
        "zones": {"dedicated": _gpus("reserved", sysdef.rollout_gpus),
                  "overlap": _gpus("train", 2 * sysdef.overlap_workers)},
        "profile": profile.to_dict(),
        "pd_mode": sysdef.pd_mode,
        "gate": {"toggle_cost_s": m.toggle_cost_s, **sysdef.gate},
        "deadlines": {"train_begin_s": 60, "leave_s": 30, "drain_s": 15},
        "time_scale": 1.0,
    }
    if config.engine_args:
        data["engine"]["extra_args"] = list(config.engine_args)
    for key, value in config.cluster_overrides.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) and isinstance(value, dict) else value
    return data


def _front_door(config: ReplayConfig, app: web.Application) -> Optional[InProcessFrontDoor]:
    if config.front_door not in ("in-process", "http"):
        raise ValueError("front_door must be 'in-process' or 'http'")
    return InProcessFrontDoor(app) if config.front_door == "in-process" else None


def _transport_factory(config: ReplayConfig, launchers: list[InProcessEmulatorLauncher]) -> TransportFactory:
    if config.worker_transport == "http":
        return WorkerClient
    if config.worker_transport != "in-process":
        raise ValueError("worker_transport must be 'in-process' or 'http'")

    def resolve(url: str) -> Optional[Worker]:
        return next((w for lc in launchers if (w := lc.worker_at(url)) is not None), None)
    return lambda _session, _timeouts: InProcessTransport(resolve)


class WrongAnswers(RuntimeError):
    """The trace replayer got join or leave answers that were not true of the cluster."""


async def _wait_ready(store: StateStore, timeout_s: float = 3600.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        table = store.table
        topo = table.active_topology()
        moving = [w for w in table.rollout_workers() if w.activity in (Activity.JOINING, Activity.SWITCHING)]
        if (topo.colocated or (topo.prefill and topo.decode)) and not moving:
            return
        await asyncio.sleep(1.0)
    raise RuntimeError(f"the cluster did not become ready: {store.table.to_dict()}")


async def replay_async(config: ReplayConfig, *, verbose: bool = False) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    sysdef = resolve_system(config)
    m = model(config.model)
    window_s = config.minutes * 60
    start_h = config.start_h()
    targets = worker_targets(read_bamboo(config.trace_file or BAMBOO_P3), max_workers=config.max_preemptible_workers,
                             start_s=start_h * 3600, length_s=window_s) if sysdef.follows_trace else []
    real0, cpu0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="pearl-replay-") as tmp:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(
            {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936}))
        cluster = ClusterConfig.from_mapping(cluster_mapping(config, sysdef, model_dir))
        store = StateStore(StateTable.create(tp_size=cluster.engine.tp_size, dedicated_gpus=cluster.zones.dedicated,
                                             overlap_gpus=cluster.zones.overlap))
        launchers: list[InProcessEmulatorLauncher] = []

        def factory(c: ClusterConfig, _session) -> InProcessEmulatorLauncher:
            launchers.append(InProcessEmulatorLauncher(c.engine, in_process_pd=config.worker_transport == "in-process"))
            return launchers[-1]

        router_config = RouterConfig(policy="pearl" if sysdef.name.startswith("pearl") else "static",
                                     security=Security(admin_token=TOKEN), health_interval_s=10.0,
                                     load_poll_interval_s=0,  # the router is the workers' only client
                                     dispatch=DispatchConfig(internal_stream_interval=config.stream_interval),
                                     **config.router)
        app = build_app(router_config, store, cluster, launcher_factory=factory,
                        transport_factory=_transport_factory(config, launchers))
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        tasks: list[asyncio.Task] = []
        client_config = ClientConfig(base_url=url, admin_token=TOKEN, timeout_s=120.0, wait_timeout_s=7200.0)
        try:
            await _wait_ready(store)
            boot_s = loop.time()
            # Leaving the block cancels what the run left running, then closes the client.
            async with AsyncPearlClient(url, config=client_config) as client, cancelled_at_exit(tasks):
                t0 = loop.time()
                recorder = Recorder(client, t0, window_s, verbose=verbose)
                workload = config.sweworkload()
                driver = AgenticRLDriver(
                    url, workload=workload,
                    trainer_profile=TrainerProfile(seconds_per_step=config.train_step_s or m.train_step_s),
                    config=DriverConfig(request_timeout_s=config.request_timeout_s, steps=config.steps,
                                        carry_over_share=config.carry_over_share,
                                        turns_hint_sigma=config.turns_hint_sigma),
                    time=EmulatedTime(), hooks=admin_hooks(client, model_path=str(model_dir), run_id=sysdef.name),
                    on_step=recorder.on_step, front_door=_front_door(config, app))
                replayer = TraceReplayer(client, targets, EmulatedTime()) if targets else None
                if replayer is not None:
                    tasks.append(asyncio.ensure_future(replayer.run()))
                tasks.append(asyncio.ensure_future(recorder.sample_forever(config.sample_every_s)))

                async def stop_after_window() -> None:
                    await asyncio.sleep(window_s)
                    driver.stop()

                tasks.append(asyncio.ensure_future(stop_after_window()))
                await driver.run()
                end_s = loop.time() - t0
                final_state = recorder.last_state
                engines = engine_phases(launchers)
        finally:
            await runner.cleanup()
    stats = loop.stats if isinstance(loop, vtime.VirtualTimeLoop) else None
    control = (final_state or {}).get("control") or {}
    answers = replayer.answers.to_dict() if replayer is not None else None
    if answers and answers["wrong"]:
        raise WrongAnswers(f"{len(answers['wrong'])} wrong join/leave answers of {answers['joins']} joins and "
                           f"{answers['leaves']} leaves: " + "; ".join(answers["wrong"][:5]))
    return {
        "config": {**asdict(config), "system_resolved": asdict(sysdef), "trace_start_h": start_h},
        "summary": summarize(recorder.steps),
        "steps": recorder.steps,
        "samples": recorder.samples,
        "trace": {"targets": [asdict(t) for t in targets],
                  "mean_preemptible_workers": mean_workers(targets, window_s) if targets else 0.0,
                  "answers": answers},
        "reconfiguration_phases": control.get("phases", {}),
        "migrations": (final_state or {}).get("migrations"),
        "launches": sum(lc.launches for lc in launchers),
        "engines": engines,
        "run": {"virtual_s": end_s, "bootstrap_virtual_s": boot_s, "real_s": time.perf_counter() - real0,
                "cpu_s": time.process_time() - cpu0, "loop": asdict(stats) if stats else None,
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
    }


def engine_phases(launchers: list[InProcessEmulatorLauncher]) -> list[dict[str, Any]]:
    """Each emulated worker's tokens and seconds by phase (``emulator.stats``): the running
    ones, then those stopped during the run (``"stopped": True``; preempted or relaunched)."""
    return ([phases(slot, lc.worker(slot)) for lc in launchers for slot in lc.slots()]
            + [{**p, "stopped": True} for lc in launchers for p in lc.retired])


# Prompts are lists of ~10^4 ints, and every young-generation collection traverses the
# new ones; at the default threshold (700) that was ~10% of a replay's CPU. Cycles are
# still collected, ~30x less often (the run reports its peak memory).
_GC_THRESHOLD = (20_000, 20, 100)


def replay(config: ReplayConfig, *, verbose: bool = False) -> dict[str, Any]:
    """Run one replay on a fresh virtual-time loop; returns the JSON-able result."""
    before = gc.get_threshold()
    gc.set_threshold(*_GC_THRESHOLD)
    try:
        return vtime.run(replay_async(config, verbose=verbose))
    finally:
        gc.set_threshold(*before)


def _answers_line(answers: dict[str, Any] | None) -> str:
    if answers is None:
        return "none (no trace)"
    return (f"{answers['joins']} joins ({answers['superseded_joins']} superseded), {answers['leaves']} leaves, "
            f"{len(answers['wrong'])} wrong")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.replay", description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="pearl",
                        help="roll, roll-large (the segment's size) or roll-large-N, rlboost, pearl, "
                             "pearl-forced-pd, pearl-ungated, pearl-no-borrow")
    parser.add_argument("--model", default="qwen3-8b", choices=["qwen3-8b", "qwen3-30b-a3b"])
    parser.add_argument("--segment", type=int, default=1, choices=sorted(SEGMENTS))
    parser.add_argument("--trace-start-h", type=float, default=None)
    parser.add_argument("--trace-file", default=None,
                        help="a preemptible-GPU trace in the Bamboo event format (t_ms,add|remove,node); default p3")
    parser.add_argument("--max-preemptible-workers", type=int, default=6,
                        help="preemptible workers at the trace's peak")
    parser.add_argument("--minutes", type=float, default=SEGMENT_LENGTH_S / 60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=available_presets(),
                        help="workload and worker profiles (pearl_sglang/workload/presets)")
    parser.add_argument("--rewrite-fraction", type=float, default=None,
                        help="share of the context re-prefilled per turn (default: the preset's)")
    parser.add_argument("--train-step-s", type=float, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream-interval", type=int, default=64)
    parser.add_argument("--no-cold-start", action="store_true")
    parser.add_argument("--worker-transport", default="in-process", choices=["in-process", "http"],
                        help="how the router's generation calls reach the emulated workers")
    parser.add_argument("--front-door", default="in-process", choices=["in-process", "http"],
                        help="how the driver's turns reach the router")
    parser.add_argument("--engine-stepping", default="stretch", choices=["stretch", "iteration"],
                        help="emulated engines: runs of unchanging decode iterations as one event, "
                             "or one event per iteration (the same results, more CPU)")
    parser.add_argument("--out", default=None, help="write the result JSON here")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--profile", default=None, help="write a cProfile of the run here")
    return parser


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    return ReplayConfig(system=args.system, model=args.model, segment=args.segment,
                        trace_start_h=args.trace_start_h, trace_file=args.trace_file,
                        max_preemptible_workers=args.max_preemptible_workers,
                        minutes=args.minutes, batch_size=args.batch_size,
                        group_size=args.group_size, preset=args.preset, rewrite_fraction=args.rewrite_fraction,
                        train_step_s=args.train_step_s, steps=args.steps, seed=args.seed,
                        stream_interval=args.stream_interval, cold_start=not args.no_cold_start,
                        worker_transport=args.worker_transport, front_door=args.front_door,
                        engine_stepping=args.engine_stepping)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s %(message)s")
    config = config_from_args(args)
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        result = prof.runcall(replay, config, verbose=not args.quiet)
        prof.dump_stats(args.profile)
    else:
        result = replay(config, verbose=not args.quiet)
    s, run = result["summary"], result["run"]
    where = config.trace_file or f"segment {config.segment}"
    print(f"{config.system} {config.model} preset {config.preset} {where} "
          f"({result['config']['trace_start_h']} h, "
          f"{config.minutes:g} min): {s['steps']} steps, mean {s['mean_throughput_tok_s']:.0f} tok/s "
          f"(token-weighted {s['token_weighted_throughput_tok_s']:.0f}), errors {s['errors']}, "
          f"busiest/mean busy per step max {s['busy_busiest_over_mean_max']}; "
          f"trace answers {_answers_line(result['trace']['answers'])}; "
          f"replayed {run['virtual_s'] / 60:.1f} virtual min in {run['real_s']:.1f} s real "
          f"({run['cpu_s']:.1f} s CPU)", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
