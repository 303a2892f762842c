import pytest

from pearl_sglang.core.state import Role
from pearl_sglang.engine.launch_args import EngineArgs, server_args


def test_colocated_has_no_disaggregation_flags():
    args = server_args(EngineArgs(model_path="/m", tp_size=2, enable_memory_saver=True),
                       role=Role.COLOCATED, host="127.0.0.1", port=30000, weight_version="v3")
    assert args[:6] == ["--model-path", "/m", "--host", "127.0.0.1", "--port", "30000"]
    assert "--disaggregation-mode" not in args
    assert args[args.index("--tp-size") + 1] == "2"
    assert "--enable-memory-saver" in args
    assert args[args.index("--weight-version") + 1] == "v3"


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_switchable_pd_worker_disables_radix_cache(role):
    args = server_args(EngineArgs(model_path="/m"), role=role, host="h", port=1, bootstrap_port=8998)
    assert args[args.index("--disaggregation-mode") + 1] == role.value
    assert args[args.index("--disaggregation-bootstrap-port") + 1] == "8998"
    assert "--enable-pd-role-switch" in args and "--disable-radix-cache" in args


def test_pd_worker_needs_bootstrap_port():
    with pytest.raises(ValueError, match="bootstrap port"):
        server_args(EngineArgs(model_path="/m"), role=Role.PREFILL, host="h", port=1)


def test_role_switch_needs_mooncake_or_mori():
    with pytest.raises(ValueError, match="mooncake"):
        server_args(EngineArgs(model_path="/m", transfer_backend="nixl"),
                    role=Role.DECODE, host="h", port=1, bootstrap_port=2)


def test_a_training_gpu_gets_no_launch_arguments():
    # One Role for the table and the launchers: the one role that launches nothing is refused.
    with pytest.raises(ValueError, match="training"):
        server_args(EngineArgs(model_path="/m"), role=Role.TRAINING, host="h", port=1)
