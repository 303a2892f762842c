"""SGLang 0.5.23 launch arguments for each rollout role.

One place decides how a colocated, prefill or decode worker is started, so launchers,
tests and the emulator (which accepts the same flags) agree. Facts encoded here:
- PD workers that may change role in place need ``--enable-pd-role-switch``, their own
  bootstrap port each, and ``--disable-radix-cache``: in 0.5.23 a server that started as
  prefill and now decodes crashes on a repeated prompt with the radix cache on.
- Borrowed (overlap) workers need ``--enable-memory-saver`` so ``/release_memory_occupation``
  frees GPU memory; ``--enable-weights-cpu-backup`` lets resume skip a weight reload.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl_sglang.core.state import ROLLOUT_ROLES, Role


@dataclass(frozen=True)
class EngineArgs:
    """Per-cluster engine settings (the same for every worker of the cluster)."""

    model_path: str
    tp_size: int = 1
    transfer_backend: str = "mooncake"
    role_switchable: bool = True
    enable_memory_saver: bool = False
    enable_weights_cpu_backup: bool = False
    max_total_tokens: int | None = None
    device: str | None = None
    dtype: str | None = None
    sleep_on_idle: bool = False
    disable_overlap_schedule: bool = False
    decode_retraction_backup: str | None = None
    extra: tuple[str, ...] = ()

    def validate(self) -> None:
        if not self.model_path:
            raise ValueError("model_path is required")
        if self.tp_size < 1:
            raise ValueError("tp_size must be >= 1")
        if self.role_switchable and self.transfer_backend not in ("mooncake", "mori"):
            raise ValueError("in-place role switch needs the mooncake or mori transfer backend")


def server_args(
    engine: EngineArgs,
    *,
    role: Role,
    host: str,
    port: int,
    bootstrap_port: int | None = None,
    weight_version: str | None = None,
) -> list[str]:
    """The argument list after ``python -m sglang.launch_server``."""
    engine.validate()
    if role not in ROLLOUT_ROLES:
        raise ValueError(f"a {role.value} GPU runs no rollout worker")
    args = ["--model-path", engine.model_path, "--host", host, "--port", str(port)]
    if engine.tp_size != 1:
        args += ["--tp-size", str(engine.tp_size)]
    if engine.device:
        args += ["--device", engine.device]
    if engine.dtype:
        args += ["--dtype", engine.dtype]
    if engine.max_total_tokens:
        args += ["--max-total-tokens", str(engine.max_total_tokens)]
    if engine.sleep_on_idle:
        args.append("--sleep-on-idle")
    if engine.disable_overlap_schedule:
        args.append("--disable-overlap-schedule")
    if engine.enable_memory_saver:
        args.append("--enable-memory-saver")
    if engine.enable_weights_cpu_backup:
        args.append("--enable-weights-cpu-backup")
    if weight_version is not None:
        args += ["--weight-version", weight_version]
    if role is not Role.COLOCATED:
        if bootstrap_port is None:
            raise ValueError(f"a {role.value} worker needs a bootstrap port")
        args += [
            "--disaggregation-mode", role.value,
            "--disaggregation-transfer-backend", engine.transfer_backend,
            "--disaggregation-bootstrap-port", str(bootstrap_port),
        ]
        if engine.decode_retraction_backup:
            args += ["--disaggregation-decode-retraction-backup", engine.decode_retraction_backup]
        if engine.role_switchable:
            args += ["--enable-pd-role-switch", "--disable-radix-cache"]
    args += list(engine.extra)
    return args
