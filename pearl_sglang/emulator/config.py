"""Command line of the emulated worker: ``sglang.launch_server``'s flags plus our own.

A launcher swaps ``python -m sglang.launch_server`` for ``python -m pearl_sglang.emulator``
and keeps its flags.  Flags that shape behaviour are honoured; flags that only matter
to a real GPU process are accepted and ignored (``IGNORED_VALUE_FLAGS`` /
``IGNORED_SWITCHES``); any other flag is tolerated with a warning, so a newer launcher
does not break the emulator.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields
from typing import Optional

from .engine import EngineConfig
from .request import DisaggregationMode

# A start-up no launcher waits for (a day, emulated).
MAX_COLD_START_S = 86400.0

IGNORED_VALUE_FLAGS = (
    "--device", "--load-format", "--dtype", "--disaggregation-decode-retraction-backup",
    "--disaggregation-ib-device", "--disaggregation-decode-allocation-policy",
    "--mem-fraction-static", "--attention-backend", "--log-level", "--random-seed",
    "--cuda-graph-max-bs", "--page-size", "--kv-cache-dtype", "--quantization",
    "--load-balance-method", "--schedule-policy", "--api-key", "--tokenizer-mode",
    "--dist-init-addr", "--nnodes", "--node-rank", "--ep-size", "--pp-size",
    "--sampling-backend", "--grammar-backend", "--reasoning-parser", "--tool-call-parser",
    "--context-length", "--revision", "--download-dir", "--base-gpu-id",
)
IGNORED_SWITCHES = (
    "--sleep-on-idle", "--disable-overlap-schedule", "--trust-remote-code",
    "--skip-server-warmup", "--disable-cuda-graph", "--enable-metrics", "--log-requests",
    "--disable-custom-all-reduce", "--enable-torch-compile", "--skip-tokenizer-init",
    "--enable-deterministic-inference", "--enable-dp-attention", "--disable-shared-experts-fusion",
)


@dataclass(frozen=True)
class EmulatorArgs:
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = "emulated-model"
    served_model_name: Optional[str] = None
    tokenizer_path: Optional[str] = None
    tp_size: int = 1
    dp_size: int = 1
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    enable_memory_saver: bool = False
    enable_weights_cpu_backup: bool = False
    enable_pd_role_switch: bool = False
    weight_version: str = "default"
    max_total_tokens: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    max_running_requests: Optional[int] = None
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
    stream_interval: int = 1
    load_format: str = "auto"
    profile: str = "tiny"
    time_scale: float = 1.0
    seed: int = 0
    pd_timeout: float = 300.0
    health_timeout: float = 20.0
    cold_start: Optional[float] = None
    engine_stepping: str = "auto"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False

    def validate(self) -> None:
        if self.disaggregation_mode not in ("null", "prefill", "decode"):
            raise ValueError(f"invalid --disaggregation-mode {self.disaggregation_mode!r}")
        # NaN compares false with everything: a NaN clock or timeout left the engine
        # spinning on an event time it never reaches, deaf to signals.
        if not 0 < self.time_scale < math.inf:
            raise ValueError(f"--time-scale must be a positive finite number, got {self.time_scale}")
        for flag, value in (("--pd-timeout", self.pd_timeout), ("--health-timeout", self.health_timeout)):
            if not 0 < value < math.inf:
                raise ValueError(f"{flag} must be a positive finite number of seconds, got {value}")
        if self.cold_start is not None and not 0 <= self.cold_start <= MAX_COLD_START_S:
            raise ValueError(f"--cold-start must be in [0, {MAX_COLD_START_S:g}] emulated seconds, "
                             f"got {self.cold_start}")
        if self.stream_interval < 1:
            raise ValueError("--stream-interval must be >= 1")
        if self.tp_size < 1 or self.dp_size < 1:
            raise ValueError(f"--tp-size and --dp-size must be >= 1, got {self.tp_size} and {self.dp_size}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if not 0 <= self.disaggregation_bootstrap_port <= 65535:
            raise ValueError(f"--disaggregation-bootstrap-port must be in [0, 65535], "
                             f"got {self.disaggregation_bootstrap_port}")
        if self.engine_stepping not in ("auto", "stretch", "iteration"):
            raise ValueError(f"invalid --engine-stepping {self.engine_stepping!r}")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        d = EmulatorArgs()
        a = parser.add_argument
        a("--host", default=d.host)
        a("--port", type=int, default=d.port)
        a("--model-path", "--model", dest="model_path", default=d.model_path)
        a("--served-model-name", default=None)
        a("--tokenizer-path", default=None)
        a("--tp-size", "--tp", dest="tp_size", type=int, default=d.tp_size)
        a("--dp-size", "--dp", dest="dp_size", type=int, default=d.dp_size)
        a("--disaggregation-mode", default=d.disaggregation_mode, choices=["null", "prefill", "decode"])
        a("--disaggregation-bootstrap-port", type=int, default=d.disaggregation_bootstrap_port)
        a("--disaggregation-transfer-backend", default=d.disaggregation_transfer_backend)
        a("--enable-memory-saver", action="store_true")
        a("--enable-weights-cpu-backup", action="store_true")
        a("--enable-pd-role-switch", action="store_true")
        a("--weight-version", default=d.weight_version)
        a("--max-total-tokens", type=int, default=None)
        a("--chunked-prefill-size", type=int, default=None)
        a("--max-running-requests", type=int, default=None)
        a("--disable-radix-cache", action="store_true")
        a("--enable-mixed-chunk", action="store_true")
        a("--stream-interval", type=int, default=d.stream_interval)
        a("--enable-priority-scheduling", action="store_true",
          help="order the waiting queue by the request's priority (higher values first), then arrival")
        a("--schedule-low-priority-values-first", action="store_true")
        a("--load-format", default=d.load_format)
        g = parser.add_argument_group("emulator")
        g.add_argument("--profile", default=d.profile,
                       help="performance profile: a bundled name or a JSON path")
        g.add_argument("--time-scale", type=float, default=d.time_scale,
                       help="emulated seconds per real second")
        g.add_argument("--seed", type=int, default=d.seed,
                       help="selects the emulated model; workers that share requests must share it")
        g.add_argument("--pd-timeout", type=float, default=d.pd_timeout,
                       help="emulated seconds a PD request waits for its peer")
        g.add_argument("--health-timeout", type=float, default=d.health_timeout,
                       help="emulated seconds /health waits while paused before 503")
        g.add_argument("--cold-start", type=float, default=None,
                       help="emulated start-up seconds before the port opens (default: profile)")
        g.add_argument("--engine-stepping", default=d.engine_stepping, choices=["auto", "stretch", "iteration"],
                       help="stretch: runs of decode iterations that nothing can change are one event; "
                            "iteration: one event per iteration (same results, more CPU); auto: stretch "
                            "on a virtual-time loop, iteration in real time (a driver woken every "
                            "iteration lets stream readers in between)")
        for flag in IGNORED_VALUE_FLAGS:
            if flag != "--load-format":
                parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
        for flag in IGNORED_SWITCHES:
            parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)

    @staticmethod
    def from_cli_args(ns: argparse.Namespace) -> "EmulatorArgs":
        names = {f.name for f in fields(EmulatorArgs)}
        args = EmulatorArgs(**{k: v for k, v in vars(ns).items() if k in names})
        args.validate()
        return args

    @property
    def role(self) -> DisaggregationMode:
        return DisaggregationMode(self.disaggregation_mode)

    def engine_config(self, *, vocab_size: Optional[int], eos_token_id: Optional[int],
                      special_ids: frozenset[int], context_length: Optional[int],
                      token_low: int = 0, virtual_time: bool = False) -> EngineConfig:
        return EngineConfig(
            role=self.role, model_path=self.model_path, weight_version=self.weight_version,
            max_total_tokens=self.max_total_tokens, chunked_prefill_size=self.chunked_prefill_size,
            max_running_requests=self.max_running_requests,
            priority_sign=((1 if self.schedule_low_priority_values_first else -1)
                           if self.enable_priority_scheduling else None),
            prefix_cache=not self.disable_radix_cache,
            mixed_chunk=self.enable_mixed_chunk, memory_saver=self.enable_memory_saver,
            weights_cpu_backup=self.enable_weights_cpu_backup,
            pd_role_switch=self.enable_pd_role_switch,
            transfer_backend=self.disaggregation_transfer_backend, bootstrap_host=self.host,
            bootstrap_port=self.disaggregation_bootstrap_port, pd_timeout_s=self.pd_timeout,
            vocab_size=vocab_size, eos_token_id=eos_token_id, special_ids=special_ids,
            context_length=context_length, seed=self.seed, token_low=token_low,
            decode_stretches=self.engine_stepping == "stretch" or (
                self.engine_stepping == "auto" and virtual_time))


def parse_args(argv: Optional[list[str]] = None) -> tuple[EmulatorArgs, list[str]]:
    """Parse known flags; return the args and the unknown flags (to warn about)."""
    parser = argparse.ArgumentParser(
        prog="python -m pearl_sglang.emulator",
        description="SGLang 0.5.23-compatible emulated worker with a GPU performance model")
    EmulatorArgs.add_cli_args(parser)
    ns, unknown = parser.parse_known_args(argv)
    return EmulatorArgs.from_cli_args(ns), unknown
