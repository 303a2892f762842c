"""Router configuration: one dataclass per concern, built from CLI flags."""
from __future__ import annotations

import argparse
import fnmatch
import math
import os
from dataclasses import dataclass, field

from pearl_sglang.core.registered import RegistrationConfig
from pearl_sglang.core.state import MAX_TP_SIZE
from pearl_sglang.core.straggler_isolation import IsolationConfig
from pearl_sglang.router.connections import ConnectionLimits
from pearl_sglang.router.dispatch import DispatchConfig
from pearl_sglang.router.limits import Limits
from pearl_sglang.router.routing_policy import POLICY_NAMES
from pearl_sglang.router.stall import DEFAULT_STALL_S
from pearl_sglang.workers.addresses import check_port, check_worker_url
from pearl_sglang.workers.client import Timeouts

POLICIES = ("static", "pearl")
ISOLATION_SCOPES = ("always", "borrowed")


def finite_float(text: str) -> float:
    """An argparse type: a number, not nan or inf (which pass every ``>`` check but poison
    timers and bounds)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


@dataclass(frozen=True)
class AttachedWorkers:
    """Pre-launched workers (like sglang-router's flags): regular, or prefill/decode."""

    regular: tuple[str, ...] = ()
    prefill: tuple[tuple[str, int], ...] = ()
    decode: tuple[str, ...] = ()

    def validate(self) -> None:
        if self.regular and (self.prefill or self.decode):
            raise ValueError("give either --worker-urls or --prefill/--decode, not both")
        if bool(self.prefill) != bool(self.decode):
            raise ValueError("PD mode needs at least one --prefill and one --decode")
        for url in (*self.regular, *(u for u, _ in self.prefill), *self.decode):
            check_worker_url(url)
        for url, port in self.prefill:
            check_port(port, f"--prefill {url}: bootstrap port")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Security:
    admin_token: str | None = None
    api_key: str | None = None
    # Host patterns (fnmatch) that worker addresses given through the admin API may name;
    # anything else is refused, so the API cannot make the router call arbitrary hosts.
    allowed_worker_hosts: tuple[str, ...] = LOOPBACK_HOSTS

    def worker_host_allowed(self, host: str) -> bool:
        return any(fnmatch.fnmatchcase(host.lower(), p.lower()) for p in self.allowed_worker_hosts)

    def __repr__(self) -> str:  # never print secrets
        return f"Security(admin_token={'set' if self.admin_token else None}, " \
               f"api_key={'set' if self.api_key else None}, allowed_worker_hosts={self.allowed_worker_hosts})"


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "static"
    tp_size: int = 1
    attached: AttachedWorkers = field(default_factory=AttachedWorkers)
    security: Security = field(default_factory=Security)
    limits: Limits = field(default_factory=Limits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    registration: RegistrationConfig = field(default_factory=RegistrationConfig)
    admission_max_waiting: int = 10000
    admission_wait_s: float = 60.0
    health_interval_s: float = 10.0
    failures_to_open: int = 3
    breaker_cooldown_s: float = 30.0
    # None: the cluster config's routing_policy, else "cost".
    routing_policy: str | None = None
    # Read workers' own running + waiting requests this often for placement (0: never;
    # the router's own counts only).
    load_poll_interval_s: float = 2.0
    # How often the connections of non-streaming requests are checked for clients that left.
    client_check_s: float = 0.5
    # Share of the step's running trajectories that /pearl/state names as predicted
    # stragglers (those expected to finish last).
    straggler_share: float = 0.1
    # Send each turn of a header-named trajectory with SGLang's ``priority``: 1 for predicted
    # stragglers, 0 otherwise (workers launched with --enable-priority-scheduling serve them
    # first; a difference under SGLang's preemption threshold only reorders the queue).
    # The router's own admission order follows the same priority (a request held while a
    # reconfiguration finishes is released stragglers first). Off by default.
    straggler_priority: bool = False
    # Once this share of the step's trajectories looks finished (the tail), place predicted
    # stragglers' turns on the least contended workers and keep other turns off theirs
    # (core.straggler_isolation, where the defaults are justified). Off by default.
    straggler_isolation: bool = False
    # "always", or "borrowed": only while training GPUs lent to rollout serve, the capacity
    # that arrives for the tail (measured, isolation in a pool that stays busy costs
    # throughput: benchmarks/README.md, stragglers).
    straggler_isolation_scope: str = "always"
    straggler_tail_share: float = IsolationConfig.tail_share
    # A straggler's second of delay over another request's own (the isolation cost term).
    straggler_isolation_weight: float = IsolationConfig.weight
    straggler_home_margin: float = IsolationConfig.home_margin
    # Plain /generate turns (streamed or not) are read and answered by the router's own
    # HTTP path (router.generate_lane) rather than aiohttp's server; off: aiohttp serves all.
    generate_lane: bool = True

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}, got {self.policy!r}")
        if self.routing_policy is not None and self.routing_policy not in POLICY_NAMES:
            raise ValueError(f"--routing-policy must be one of {POLICY_NAMES}, got {self.routing_policy!r}")
        if not self.load_poll_interval_s >= 0:
            raise ValueError("--load-poll-interval-s must be >= 0")
        if not 0 < self.straggler_share <= 1:
            raise ValueError("--straggler-share must be in (0, 1]")
        if self.straggler_isolation_scope not in ISOLATION_SCOPES:
            raise ValueError(f"--straggler-isolation-scope must be one of {ISOLATION_SCOPES}, "
                             f"got {self.straggler_isolation_scope!r}")
        if not 0 <= self.straggler_tail_share < 1:
            raise ValueError("--straggler-tail-share must be in [0, 1)")
        if not self.straggler_isolation_weight >= 0:
            raise ValueError("--straggler-isolation-weight must be >= 0")
        if not self.straggler_home_margin >= 0:
            raise ValueError("--straggler-home-margin must be >= 0")
        if not 0 <= self.port < 65536:
            raise ValueError("--port must be in [0, 65535]")
        if not 1 <= self.tp_size <= MAX_TP_SIZE:
            raise ValueError(f"--tp-size must be in [1, {MAX_TP_SIZE}]")
        if not self.health_interval_s > 0:
            raise ValueError("--health-interval-s must be > 0")
        if not self.admission_wait_s > 0:
            raise ValueError("--admission-wait-s must be > 0")
        self.attached.validate()
        self.limits.validate()
        self.connections.validate()
        self.dispatch.validate()
        self.registration.validate()
        if not self.timeouts.chunk_s > 0:
            raise ValueError("--stall-s must be > 0")

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
        parser.add_argument("--port", type=int, default=30000)
        parser.add_argument("--policy", default="static", choices=POLICIES,
                            help="with --config: 'pearl' lets the decision engine pick PD mode and ratio "
                                 "and borrow training GPUs; 'static' keeps a colocated deployment that "
                                 "never borrows. Attach mode only routes; with --config, workers "
                                 "registered through the worker API are reshaped in place too "
                                 "(P<->D switches, borrowing), never relaunched")
        parser.add_argument("--routing-policy", default=None, choices=POLICY_NAMES,
                            help="where requests go: 'cost' (default: the least estimated time from the "
                                 "runtime profile, prefix cache and queued work included), 'cache_aware' "
                                 "(sglang-router's rule) or 'round_robin'; overrides the config's "
                                 "routing_policy")
        parser.add_argument("--tp-size", type=int, default=1, help="GPUs per worker (attach mode)")
        parser.add_argument("--worker-urls", nargs="*", default=[], help="colocated workers")
        parser.add_argument("--prefill", nargs=2, action="append", default=[], metavar=("URL", "BOOTSTRAP_PORT"))
        parser.add_argument("--decode", action="append", default=[], metavar="URL")
        parser.add_argument("--admin-token-env", default="PEARL_ADMIN_TOKEN",
                            help="environment variable holding the admin token")
        parser.add_argument("--api-key-env", default="PEARL_API_KEY",
                            help="environment variable holding the inference API key (optional)")
        parser.add_argument("--allowed-worker-hosts", nargs="+", default=list(LOOPBACK_HOSTS), metavar="PATTERN",
                            help="host patterns (fnmatch) the admin API may name as worker hosts "
                                 "(default: loopback only)")
        parser.add_argument("--max-attempts", type=int, default=DispatchConfig.max_attempts)
        parser.add_argument("--internal-stream-interval", type=int,
                            default=DispatchConfig.internal_stream_interval)
        parser.add_argument("--route-wait-s", type=finite_float, default=DispatchConfig.route_wait_s,
                            help="how long a request with no routable worker waits before a 503")
        parser.add_argument("--arriving-wait-s", type=finite_float, default=DispatchConfig.arriving_wait_s,
                            help="the same wait while the control plane brings workers up (joining or "
                                 "relaunching in a new role)")
        parser.add_argument("--admission-wait-s", type=finite_float, default=60.0)
        parser.add_argument("--health-interval-s", type=finite_float, default=10.0,
                            help="probe period of active workers; a worker added through the worker "
                                 "API is polled at most this often until healthy")
        parser.add_argument("--worker-startup-timeout-secs", type=finite_float,
                            default=RegistrationConfig.startup_timeout_s,
                            help="how long a worker added through the worker API may take to turn healthy")
        parser.add_argument("--load-poll-interval-s", type=finite_float, default=2.0,
                            help="read each worker's own running + waiting requests this often for "
                                 "placement (0: only the router's own counts)")
        parser.add_argument("--stall-s", type=finite_float, default=None,
                            help="seconds a worker may stay silent on a stream before it is taken out "
                                 "of routing and its requests move (default: derived from the "
                                 "profile of --config, else 120)")
        conn = parser.add_argument_group("client connections")
        conn.add_argument("--header-timeout-s", type=finite_float, default=ConnectionLimits.header_timeout_s,
                          help="a connection must send a request's headers within this")
        conn.add_argument("--body-timeout-s", type=finite_float, default=ConnectionLimits.body_timeout_s,
                          help="a request's body must arrive within this (408 otherwise)")
        conn.add_argument("--max-connections-per-client", type=int, default=ConnectionLimits.max_per_client)
        conn.add_argument("--shutdown-grace-s", type=finite_float, default=ConnectionLimits.shutdown_grace_s,
                          help="on SIGTERM, requests in flight may finish within this; then they are "
                               "aborted and answer with their output so far")
        conn.add_argument("--max-connections", type=int, default=None,
                          help="client connections in all (default: half of what the descriptor limit "
                               "leaves after a reserve)")
        parser.add_argument("--straggler-share", type=finite_float, default=0.1,
                            help="share of running trajectories /pearl/state names as predicted "
                                 "stragglers (expected to finish last)")
        parser.add_argument("--no-generate-lane", dest="generate_lane", action="store_false",
                            help="serve every request through aiohttp's server, plain /generate "
                                 "turns too (by default the router's own HTTP path answers them)")
        parser.add_argument("--straggler-priority", action="store_true",
                            help="send predicted stragglers' turns with priority 1 (others 0) to "
                                 "workers launched with --enable-priority-scheduling, and release "
                                 "requests the router holds in that order")
        parser.add_argument("--straggler-isolation", action="store_true",
                            help="in the step's tail, place predicted stragglers' turns on the least "
                                 "contended workers and keep other turns off theirs")
        parser.add_argument("--straggler-isolation-scope", choices=ISOLATION_SCOPES, default="always",
                            help="borrowed: isolate only while training GPUs lent to rollout serve "
                                 "(in a pool that stays busy isolation costs throughput)")
        parser.add_argument("--straggler-tail-share", type=finite_float, default=IsolationConfig.tail_share,
                            help="share of the step's trajectories that must look finished before "
                                 "--straggler-isolation applies")
        parser.add_argument("--straggler-isolation-weight", type=finite_float, default=IsolationConfig.weight,
                            help="what a second of a straggler's delay costs, in seconds of another "
                                 "request's own time, when placing other turns")
        parser.add_argument("--straggler-home-margin", type=finite_float, default=IsolationConfig.home_margin,
                            help="how much cheaper (relative) another worker must be before a "
                                 "straggler's turn leaves the worker that holds its prefix")
        Limits.add_cli_args(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "RouterConfig":
        prefill = []
        for url, port in args.prefill:
            if not (port.isascii() and port.isdigit()):
                raise ValueError(f"--prefill bootstrap port must be a number, got {port!r}")
            prefill.append((url, int(port)))
        return cls(
            host=args.host, port=args.port, policy=args.policy, tp_size=args.tp_size,
            attached=AttachedWorkers(regular=tuple(args.worker_urls), prefill=tuple(prefill),
                                     decode=tuple(args.decode)),
            security=Security(admin_token=os.environ.get(args.admin_token_env) or None,
                              api_key=os.environ.get(args.api_key_env) or None,
                              allowed_worker_hosts=tuple(args.allowed_worker_hosts)),
            limits=Limits.from_cli_args(args),
            connections=ConnectionLimits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                                         max_per_client=args.max_connections_per_client,
                                         max_total=args.max_connections,
                                         shutdown_grace_s=args.shutdown_grace_s),
            dispatch=DispatchConfig(max_attempts=args.max_attempts,
                                    internal_stream_interval=args.internal_stream_interval,
                                    route_wait_s=args.route_wait_s, arriving_wait_s=args.arriving_wait_s),
            admission_wait_s=args.admission_wait_s, health_interval_s=args.health_interval_s,
            registration=RegistrationConfig(startup_timeout_s=args.worker_startup_timeout_secs,
                                            poll_interval_s=min(1.0, args.health_interval_s)),
            routing_policy=args.routing_policy, load_poll_interval_s=args.load_poll_interval_s,
            timeouts=Timeouts(chunk_s=args.stall_s if args.stall_s is not None else DEFAULT_STALL_S),
            straggler_share=args.straggler_share, straggler_priority=args.straggler_priority,
            straggler_isolation=args.straggler_isolation, straggler_tail_share=args.straggler_tail_share,
            straggler_isolation_scope=args.straggler_isolation_scope,
            straggler_isolation_weight=args.straggler_isolation_weight,
            straggler_home_margin=args.straggler_home_margin, generate_lane=args.generate_lane,
        )
