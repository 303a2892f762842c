"""``python -m pearl_sglang.demo``: PEARL's main job on an emulated cluster, no GPU needed.

Starts PEARL's router with ``--policy pearl`` over a cluster of emulated SGLang workers
(Qwen3-8B on H800-class GPUs, TP2: 2 dedicated workers, up to 6 preemptible workers
following the Bamboo p3 trace, 8 overlap workers on the 16 training GPUs), runs an
asynchronous agentic RL loop against it (SWE-like multi-turn trajectories, staleness 1,
train hooks around every update, a weight push after each), prints progress, and writes
``summary.json`` and ``throughput.png``. ``--system rlboost|roll`` runs a baseline.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import signal
import sys
import time
from pathlib import Path

from pearl_rl_adapter import AsyncPearlClient
from pearl_sglang.aio import cancelled_at_exit
from pearl_sglang.demo import stack as stack_mod
from pearl_sglang.demo.config import DemoConfig
from pearl_sglang.demo.replay import TraceReplayer
from pearl_sglang.demo.report import Reporter
from pearl_sglang.workload import AgenticRLDriver, DriverConfig, TrainerProfile, admin_hooks
from pearl_sglang.workload.presets import load_preset
from pearl_sglang.workload.timebase import EmulatedTime
from pearl_sglang.workload.trace import BAMBOO_P3, mean_workers, read_bamboo, worker_targets


async def run(config: DemoConfig) -> int:
    run_dir = Path(config.out) / f"{config.system}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    clock = EmulatedTime(time_scale=config.time_scale)
    length_s = config.minutes * 60
    targets = worker_targets(read_bamboo(BAMBOO_P3), max_workers=config.max_preemptible_workers,
                             start_s=config.trace_start_h * 3600, length_s=length_s)
    follows_trace = config.system != "roll"
    print(f"PEARL demo: system={config.system}, {config.minutes:g} emulated minutes at {config.time_scale:g}x, "
          f"batch {config.batch_size} in groups of {config.group_size}, preset {config.preset}; preemptible workers "
          f"{'follow the Bamboo p3 trace, mean %.1f' % mean_workers(targets, length_s) if follows_trace else 'off'}; "
          f"run folder {run_dir}", flush=True)
    stack = await stack_mod.start(config, run_dir)
    tasks: list[asyncio.Task] = []
    try:
        # Leaving the block cancels the replay's tasks (a join still waiting has no answer),
        # then closes the client.
        async with AsyncPearlClient(stack.url, admin_token=stack.token) as client, cancelled_at_exit(tasks):
            reporter = Reporter(client, clock)
            driver = AgenticRLDriver(
                stack.url,
                workload=load_preset(config.preset).sweworkload(batch_size=config.batch_size,
                                                                group_size=config.group_size, seed=config.seed),
                trainer_profile=TrainerProfile(seconds_per_step=config.train_step_s),
                config=DriverConfig(request_timeout_s=600.0, carry_over_share=config.carry_over_share or None),
                time=clock,
                hooks=admin_hooks(client, model_path=str(stack.model_dir), run_id="demo"),
                on_step=reporter.on_step)
            reporter.start()
            await reporter.sample()
            print(f"[{0:6.1f} min] cluster ready: {reporter.samples[-1][1]}", flush=True)
            replayer = TraceReplayer(client, targets, clock) if follows_trace else None
            if replayer is not None:
                tasks.append(asyncio.ensure_future(replayer.run()))
            tasks.append(asyncio.ensure_future(reporter.sample_forever(every_s=30.0)))

            async def stop_after_window() -> None:
                await clock.wait(length_s)
                driver.stop()

            tasks.append(asyncio.ensure_future(stop_after_window()))
            await driver.run()
            summary_path, plot_path = reporter.write(run_dir, config.system)
            s = reporter.summary()
            print("\nsummary")
            print(f"  steps                    {s['steps']}")
            print(f"  mean throughput          {s['mean_throughput_tok_s']:.0f} tokens/s (steps after the first)")
            print(f"  generated / trained      {s['generated_tokens']:,} / {s['training_tokens']:,} tokens")
            print(f"  request errors           {s['errors']} (failed trajectories {s['failed_trajectories']})")
            print(f"  migrated requests        {s['migrations']}")
            if replayer is not None:
                a = replayer.answers
                print(f"  trace join/leave answers {a.joins} / {a.leaves}, wrong {len(a.wrong)}")
            for name, phase in s["reconfiguration_phases"].items():
                print(f"  {name:24s} {phase['mean_s'] * config.time_scale:7.2f} emulated s mean over {phase['count']}")
            print(f"  wrote {summary_path} and {plot_path}")
    finally:
        await asyncio.to_thread(stack.router.stop)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pearl_sglang.demo", description=__doc__.splitlines()[0])
    DemoConfig.add_cli_args(parser)
    try:
        config = DemoConfig.from_cli_args(parser.parse_args(argv))
    except ValueError as e:
        parser.error(str(e))
    trace_h = read_bamboo(BAMBOO_P3)[-1].t_s / 3600
    if config.trace_start_h >= trace_h:
        parser.error(f"--trace-start-h must be below the trace's {trace_h:.2f} hours")
    try:
        Path(config.out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--out {config.out}: {e}")
    if importlib.util.find_spec("matplotlib") is None:  # before an hour of emulation, not after
        print("error: the demo draws throughput.png with matplotlib, which the base install lacks: "
              "pip install 'pearl-sglang[demo]'", file=sys.stderr)
        return 2
    loop = asyncio.new_event_loop()
    main_task = loop.create_task(run(config))
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, main_task.cancel)
    try:
        return loop.run_until_complete(main_task)
    except stack_mod.StackFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("\ninterrupted: the router and its workers were stopped", flush=True)
        return 130
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


if __name__ == "__main__":
    raise SystemExit(main())
