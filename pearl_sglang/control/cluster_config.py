"""Cluster configuration for launched workers (YAML or JSON), validated into dataclasses.

A minimal file (``examples/`` has complete ones: an emulated cluster, real SGLang on GPUs,
real SGLang on CPU; ``docs/cluster-config.md`` describes every key)::

    engine:
      kind: emulator            # or "sglang"
      model_path: examples/models/qwen3-8b-emulated
      tp_size: 2
      emulator: {profile: qwen3-8b-h800-tp2, time_scale: 50}
    zones:
      dedicated: [node0:0, node0:1, node0:2, node0:3]
      overlap: [train0:0, train0:1, train0:2, train0:3]
    profile: {B: 64, S: 30, delta_L: 1000, r: 300, theta: 1.367, A: 0.0045, b: 3.606e-4,
              t_prefill: 2.222e-5, K: 147456, BW: 8.4e+10, T_over: 0.2, T_env: 150.0,
              K_seq: 4831838208, H_max: 1.196e+11}
    routing_policy: cost        # or cache_aware, round_robin
    time_scale: 50

Exponents need a sign in YAML (``8.4e+10``): PyYAML reads ``8.4e10`` as a string, which is
refused with that hint.

Every key is documented on its dataclass below; unknown keys are errors (a typo must not
silently fall back to a default).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from pearl_sglang.core.decision import Thresholds
from pearl_sglang.core.errors import InvalidConfig
from pearl_sglang.core.gate import INITIAL_TOGGLE_COST_S
from pearl_sglang.core.mode_feedback import ModeFeedback
from pearl_sglang.core.pd_mode import AUTO, COLOCATED, PdMode
from pearl_sglang.core.policy import DecisionConfig
from pearl_sglang.core.pool_usage import UsageThresholds
from pearl_sglang.core.profile import Profile
from pearl_sglang.core.telemetry import ProfileFit
from pearl_sglang.core.state import MAX_TP_SIZE, gpu_node, is_gpu_id
from pearl_sglang.workers.addresses import is_host

ROUTING_POLICIES = ("cost", "cache_aware", "round_robin")  # router/routing_policy.py
MAX_CONFIG_BYTES = 16 << 20


class ConfigError(ValueError):
    """The cluster configuration is invalid; the message names the key."""


def _number(value: Any, where: str, *, positive: bool = False) -> None:
    """A finite number of seconds (or a share): not a bool, a string, nan or inf."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(f"{where} must be a {'positive' if positive else 'non-negative'} finite number, "
                          f"got {value!r}")


def _text(value: Any, where: str, *, empty: bool = True) -> None:
    if not isinstance(value, str) or (not empty and not value):
        raise ConfigError(f"{where} must be a {'' if empty else 'non-empty '}string, got {value!r}")


def _mapping(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
    return dict(value)


def _build(cls, data: Any, where: str):
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(map(str, set(data) - known))
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    try:
        return cls(**data)
    except (TypeError, InvalidConfig) as e:
        raise ConfigError(f"{where}: {e}") from e


@dataclass(frozen=True)
class EngineConfig:
    """How each rollout worker is started (docs/cluster-config.md has the long form).

    ``kind``: "sglang" or "emulator". ``model_path``: the checkpoint every worker loads at
    start (``weight_version`` names it). ``python``: the interpreter that runs
    ``-m sglang.launch_server`` (empty: the router's own). ``env``: extra environment of
    each worker process. ``extra_args``: more ``sglang.launch_server`` flags, verbatim.
    ``memory_saver``: ``--enable-memory-saver``, needed to lend the overlap zone (it is
    what frees GPU memory on return; it needs CUDA). ``weights_cpu_backup``: keep weights
    in host memory while released, so re-activation needs no reload.
    ``transfer_backend``: KV transfer between prefill and decode workers.
    ``start_timeout_s``: how long a worker may take to become healthy. ``emulator``: the
    emulator's own flags (``profile``, ``time_scale``, ``cold_start``, ``seed``, ...).
    """

    kind: str = "emulator"
    model_path: str = ""
    tp_size: int = 1
    weight_version: str = "default"
    transfer_backend: str = "mooncake"
    memory_saver: bool = True
    weights_cpu_backup: bool = False
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = ""
    emulator: Mapping[str, Any] = field(default_factory=dict)
    start_timeout_s: float = 900.0

    def validate(self) -> None:
        if self.kind not in ("sglang", "emulator"):
            raise ConfigError(f"engine.kind must be 'sglang' or 'emulator', got {self.kind!r}")
        if self.kind == "sglang" and not self.model_path:
            raise ConfigError("engine.model_path is required for SGLang workers")
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) \
                or not 1 <= self.tp_size <= MAX_TP_SIZE:
            raise ConfigError(f"engine.tp_size must be an integer in [1, {MAX_TP_SIZE}]")
        _text(self.weight_version, "engine.weight_version", empty=False)
        for key in ("model_path", "python", "transfer_backend"):
            _text(getattr(self, key), f"engine.{key}")
        for key in ("memory_saver", "weights_cpu_backup"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"engine.{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in self.env.items()):
            raise ConfigError("engine.env must map variable names to string values")
        if not isinstance(self.emulator, Mapping):
            raise ConfigError("engine.emulator must be a mapping of the emulator's flags")
        _number(self.start_timeout_s, "engine.start_timeout_s", positive=True)


@dataclass(frozen=True)
class LauncherConfig:
    """``kind``: "local" (processes on this host) or "ray" (actors where the GPUs are)."""

    kind: str = "local"
    host: str = "127.0.0.1"
    log_dir: str = "runs/logs"
    ray_address: str = "auto"

    def validate(self) -> None:
        if self.kind not in ("local", "ray"):
            raise ConfigError(f"launcher.kind must be 'local' or 'ray', got {self.kind!r}")
        if not is_host(self.host):
            raise ConfigError(f"launcher.host must be a host name or IP address, got {self.host!r}")
        _text(self.log_dir, "launcher.log_dir", empty=False)
        _text(self.ray_address, "launcher.ray_address", empty=False)


@dataclass(frozen=True)
class Zones:
    """GPU ids ``node:index``. Dedicated: rollout's own (preemptible ones join later through
    ``POST /pearl/gpus``); overlap: training GPUs rollout may borrow."""

    dedicated: tuple[str, ...] = ()
    overlap: tuple[str, ...] = ()

    def validate(self, tp_size: int) -> None:
        for name, gpus in (("dedicated", self.dedicated), ("overlap", self.overlap)):
            for gpu in gpus:
                if not is_gpu_id(gpu):
                    raise ConfigError(f"zones.{name}: GPU ids look like 'node:index', got {gpu!r}")
        for name, gpus in (("dedicated", self.dedicated), ("overlap", self.overlap)):
            if len(set(gpus)) != len(gpus):
                raise ConfigError(f"zones.{name} names a GPU twice")
        both = set(self.dedicated) & set(self.overlap)
        if both:
            raise ConfigError(f"GPUs in both zones: {sorted(both)}")
        per_node = Counter(gpu_node(gpu) for gpu in self.dedicated)
        if max(per_node.values(), default=0) < tp_size:
            raise ConfigError(f"zones.dedicated needs at least tp_size={tp_size} GPUs on one node "
                              f"(a TP group never spans nodes); it has {dict(per_node) or 'none'}")


@dataclass(frozen=True)
class GateConfig:
    """Benefit-aware borrowing gate (equation 7). ``enabled: false`` borrows whenever the
    training GPUs are idle (the ablation's ungated toggle); ``borrow: false`` never borrows."""

    toggle_cost_s: float = INITIAL_TOGGLE_COST_S
    alpha: float = 0.3
    enabled: bool = True
    borrow: bool = True
    # Bounded exploration (``core.learning_gate``): at most this fraction of gate calls
    # run unborrowed when equation (7) says borrow but the predicted benefit is at most
    # ``explore_max_benefit_ratio`` times the learned toggle cost.  0 keeps equation (7)
    # exactly (today's replays); see docs/decisions.md for why and when to raise it.
    exploration_rate: float = 0.0
    explore_max_benefit_ratio: float = 2.0
    # What the last step's workers did (``core.pool_usage``): a borrow is refused when the
    # dedicated workers of an unborrowed step, or the borrowed workers of a borrowed one,
    # had a request in flight for less than this share of the time (0: no check).
    min_dedicated_busy_share: float = 0.65
    min_borrowed_busy_share: float = 0.18
    # Replay the last unborrowed step with the overlap workers serving from when lent ones
    # have started serving so far (``core.borrow_replay``); refuse a borrow that would not
    # have saved more than the toggle cost.
    replay_check: bool = True

    def __post_init__(self) -> None:
        from pearl_sglang.core.learning_gate import Exploration

        _number(self.toggle_cost_s, "gate.toggle_cost_s")
        _number(self.alpha, "gate.alpha", positive=True)
        if self.alpha > 1:
            raise ConfigError(f"gate.alpha must be in (0, 1], got {self.alpha!r}")
        for key in ("enabled", "borrow", "replay_check"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"gate.{key} must be true or false, got {getattr(self, key)!r}")
        try:
            Exploration(rate=self.exploration_rate, max_benefit_ratio=self.explore_max_benefit_ratio)
            self.usage
        except (InvalidConfig, TypeError) as e:
            raise ConfigError(f"gate: {e}") from e

    @property
    def usage(self) -> UsageThresholds:
        return UsageThresholds(min_dedicated_busy_share=self.min_dedicated_busy_share,
                               min_borrowed_busy_share=self.min_borrowed_busy_share)


@dataclass(frozen=True)
class Deadlines:
    """Seconds. ``train_begin_s``: returning the training GPUs (stragglers are stopped at
    it). ``leave_s``: default deadline of a GPU leave. ``drain_s``: how long a leaving
    worker may drain before it is stopped. A join has no deadline of its own (it answers
    when its growth ends), and the admission pause is bounded by the router's
    ``--admission-wait-s``."""

    train_begin_s: float = 60.0
    leave_s: float = 30.0
    drain_s: float = 20.0

    def validate(self) -> None:
        for key in ("train_begin_s", "leave_s", "drain_s"):
            _number(getattr(self, key), f"deadlines.{key}", positive=True)


@dataclass(frozen=True)
class WeightsConfig:
    """``max_staleness``: adopted weight pushes a worker may lag and still serve (0: a
    worker that missed the latest push leaves routing and is replaced at once).
    ``group_init_timeout_s``: how long workers wait in ``/init_weights_update_group`` for
    the trainer to join a distributed weight group as rank 0."""

    max_staleness: int = 0
    group_init_timeout_s: float = 600.0

    def validate(self) -> None:
        if isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, int) \
                or self.max_staleness < 0:
            raise ConfigError(f"weights.max_staleness must be an integer >= 0, got {self.max_staleness!r}")
        _number(self.group_init_timeout_s, "weights.group_init_timeout_s", positive=True)


@dataclass(frozen=True)
class RecoveryConfig:
    """``pd_probe_backoff_s``: after a group fails its PD probe (the pair cannot transfer
    KV) and is cancelled, wait each delay in turn and re-plan, which relaunches the
    cancelled workers on the same GPUs and pairs them again.
    ``growth_backoff_s``: after a growth stops short of its target for any reason (a
    worker that would not start, a failed weight sync, PD probes that kept failing), the
    control plane re-plans after each delay in turn, then every last delay, until the
    target is reached or an event changes it."""

    pd_probe_backoff_s: tuple[float, ...] = (1.0, 5.0, 20.0)
    growth_backoff_s: tuple[float, ...] = (1.0, 5.0, 20.0, 60.0)

    def validate(self) -> None:
        for key in ("pd_probe_backoff_s", "growth_backoff_s"):
            delays = getattr(self, key)
            if not isinstance(delays, tuple):
                raise ConfigError(f"recovery.{key} must be a list of non-negative seconds, got {delays!r}")
            for d in delays:
                _number(d, f"recovery.{key}")
        if not self.growth_backoff_s:
            raise ConfigError("recovery.growth_backoff_s needs at least one delay")


@dataclass(frozen=True)
class ClusterConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    zones: Zones = field(default_factory=Zones)
    profile: Profile | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    gate: GateConfig = field(default_factory=GateConfig)
    # Per-mode correction of the makespan model learned from finished steps
    # (core.mode_feedback); ``enabled: false`` decides on the model's predictions alone.
    mode_feedback: ModeFeedback = field(default_factory=ModeFeedback)
    deadlines: Deadlines = field(default_factory=Deadlines)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    # "auto" (the decision engine), "colocated", "disaggregated" (the best P:D ratio), or a
    # fixed "P:D" ratio scaled to the budget (benchmarks: the PD sweep, ratio selection).
    pd_mode: PdMode = PdMode(AUTO)
    # The makespan model decisions use (mode and ratio, the borrowing gate): "tail" (the
    # paper's equations with the slowest trajectory's latency floor, on the work that
    # remains) or "paper" (the paper's equations alone). "tail" chose better on the
    # decision-quality quick grid (it refused two useless borrows), but on the elastic
    # replays each model lost one segment to a PD switch and the shortened demo's borrowing
    # became timing-dependent under "tail" (docs/decisions-tail-and-gate.md); "paper" stays
    # the default: on the full grid, with the engine's rates right (profile_fit:
    # workload), "paper" chose within 2% of the best at 24 of 24 points, "tail" at 17.
    makespan_model: str = "paper"
    # Which profile symbols telemetry refits after each step: "all" (the paper's Runtime
    # Tracker) or "workload" (S, r, delta_L, theta, T_env; the engine's rates A, b and
    # t_prefill stay as configured in ``profile``, e.g. measured offline). The online fit
    # of the engine's rates is biased under a contended colocated batch (core.telemetry).
    profile_fit: str = "all"
    # Emulated seconds per real second (the emulator's --time-scale; 1 for real GPUs): the
    # control plane measures on its own clock and converts before fitting the profile.
    time_scale: float = 1.0
    # Where the crash-safe control record lives (None: no persistence; workers then die
    # with the router). See ``control/persistence.py``.
    state_dir: str | None = None
    # How the router places requests: "cost" (the default), "cache_aware" (sglang-router's
    # rule) or "round_robin"; None leaves it to the router's --routing-policy.
    routing_policy: str | None = None

    def validate(self) -> None:
        self.engine.validate()
        self.launcher.validate()
        self.zones.validate(self.engine.tp_size)
        if self.zones.overlap and not self.engine.memory_saver:
            raise ConfigError("zones.overlap needs engine.memory_saver: true: without SGLang's memory saver "
                              "/release_memory_occupation frees nothing, so borrowed training GPUs would be "
                              "reported free while rollout workers still hold their memory (on a CPU build, "
                              "leave zones.overlap empty)")
        self.deadlines.validate()
        self.weights.validate()
        self.recovery.validate()
        if self.profile is None:
            raise ConfigError("profile is required: the decision engine's starting point (paper symbols)")
        _number(self.time_scale, "time_scale", positive=True)
        if not isinstance(self.pd_mode, PdMode):
            raise ConfigError(f"pd_mode must be a PdMode, got {self.pd_mode!r}")
        if not isinstance(self.makespan_model, str) or self.makespan_model not in ("paper", "tail"):
            raise ConfigError(f"makespan_model must be 'paper' or 'tail', got {self.makespan_model!r}")
        if not isinstance(self.profile_fit, str) or self.profile_fit not in {f.value for f in ProfileFit}:
            raise ConfigError(f"profile_fit must be 'all' or 'workload', got {self.profile_fit!r}")
        if self.state_dir is not None:
            _text(self.state_dir, "state_dir", empty=False)
        if self.routing_policy is not None and (not isinstance(self.routing_policy, str)
                                                or self.routing_policy not in ROUTING_POLICIES):
            raise ConfigError(f"routing_policy must be one of {', '.join(ROUTING_POLICIES)}, "
                              f"got {self.routing_policy!r}")

    @property
    def decisions(self) -> DecisionConfig:
        """The part of the configuration the control core decides with."""
        if self.profile is None:
            raise ConfigError("profile is required: the decision engine's starting point (paper symbols)")
        return DecisionConfig(profile=self.profile, pd_mode=self.pd_mode, makespan_model=self.makespan_model,
                              profile_fit=self.profile_fit, thresholds=self.thresholds, borrow=self.gate.borrow,
                              gated=self.gate.enabled, usage=self.gate.usage,
                              replay_check=self.gate.replay_check)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ClusterConfig":
        if not isinstance(data, Mapping):
            raise ConfigError("the cluster configuration must be a mapping")
        top = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(data) - top))
        if unknown:
            raise ConfigError(f"unknown top-level key(s): {', '.join(unknown)}")
        engine = _mapping(data, "engine")
        if "extra_args" in engine:
            if not isinstance(engine["extra_args"], list):
                raise ConfigError("engine.extra_args must be a list of flags")
            engine["extra_args"] = tuple(str(a) for a in engine["extra_args"])
        zones = _mapping(data, "zones")
        for key, gpus in zones.items():
            if not isinstance(gpus, list):
                raise ConfigError(f"zones.{key} must be a list of GPU ids like 'node0:0', got {gpus!r}")
        zones = {k: tuple(v) for k, v in zones.items()}
        recovery = data.get("recovery")
        if isinstance(recovery, Mapping):
            recovery = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in recovery.items()}
        _check_numbers(data.get("profile"), "profile")
        try:
            profile = Profile(**data["profile"]) if data.get("profile") is not None else None
            thresholds = Thresholds(**(data.get("thresholds") or {}))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"profile/thresholds: {e}") from e
        config = cls(
            engine=_build(EngineConfig, engine, "engine"),
            launcher=_build(LauncherConfig, data.get("launcher"), "launcher"),
            zones=_build(Zones, zones, "zones"),
            profile=profile, thresholds=thresholds,
            gate=_build(GateConfig, data.get("gate"), "gate"),
            mode_feedback=_build(ModeFeedback, data.get("mode_feedback"), "mode_feedback"),
            deadlines=_build(Deadlines, data.get("deadlines"), "deadlines"),
            weights=_build(WeightsConfig, data.get("weights"), "weights"),
            recovery=_build(RecoveryConfig, recovery, "recovery"),
            pd_mode=_pd_mode(data.get("pd_mode", AUTO)),
            makespan_model=data.get("makespan_model", "paper"),
            profile_fit=data.get("profile_fit", "all"),
            time_scale=data.get("time_scale", 1.0),
            state_dir=data.get("state_dir"),
            routing_policy=data.get("routing_policy"),
        )
        config.validate()
        return config

    @classmethod
    def load(cls, path: str | Path) -> "ClusterConfig":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: not a regular file")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; is it a cluster configuration?")
        import yaml

        try:
            text = path.read_text()
            data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: JSON, UTF-8
            raise ConfigError(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        return cls.from_mapping(data)


def _check_numbers(section: Any, where: str) -> None:
    """A number YAML left as a string (``5.0e10``: YAML 1.1 wants ``5.0e+10``) is refused
    with the fix, instead of a bare type error."""
    if not isinstance(section, Mapping):
        return
    for key, value in section.items():
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                continue
            raise ConfigError(f"{where}.{key} is the string {value!r}, not a number: YAML reads an exponent "
                              f"without a sign as text; write it as {value.replace('e', 'e+')}")


def _pd_mode(value: Any) -> PdMode:
    try:
        return PdMode(value)
    except InvalidConfig as e:
        raise ConfigError(str(e)) from e


def apply_policy(config: ClusterConfig, policy: str) -> ClusterConfig:
    """``static``: a fixed colocated deployment that never borrows; ``pearl``: as configured."""
    from dataclasses import replace

    if policy == "static":
        return replace(config, pd_mode=PdMode(COLOCATED), gate=replace(config.gate, borrow=False))
    if policy == "pearl":
        return config
    raise ConfigError(f"unknown policy {policy!r}")
