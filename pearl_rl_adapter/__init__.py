"""PEARL for RL frameworks: the admin client a trainer uses and the shims that wire it in.

``PearlClient`` (blocking) and ``AsyncPearlClient`` (asyncio) speak PEARL's admin API;
``training_step()`` brackets one update with ``train_begin``/``train_finished``;
``tag_headers``/``Trajectory`` label rollout requests for PEARL's telemetry; the
framework shims live in ``pearl_rl_adapter.shims`` and import their framework lazily.
"""
from pearl_rl_adapter.aio import AsyncPearlClient
from pearl_rl_adapter.client import PearlClient
from pearl_rl_adapter.config import ClientConfig
from pearl_rl_adapter.errors import (PearlAuthError, PearlClientClosed, PearlConflict, PearlError, PearlProtocolError,
                                     PearlRejected, PearlTimeout, PearlUnavailable)
from pearl_rl_adapter.results import (DistributedWeights, GpusJoined, GpusLeft, TrainBegun, TrainFinished,
                                      WeightGroup, WeightGroupDestroyed, WeightGroupMember, WeightsUpdated)
from pearl_rl_adapter.rollout import Generated, RolloutClient
from pearl_rl_adapter.telemetry import (EXPECTED_TURNS_HEADER, TRAJECTORY_HEADER, TURN_HEADER, Trajectory, TurnCounter,
                                       tag_headers)

__all__ = [
    "AsyncPearlClient", "ClientConfig", "DistributedWeights", "EXPECTED_TURNS_HEADER", "Generated", "GpusJoined",
    "GpusLeft", "PearlAuthError", "PearlClient", "PearlClientClosed", "PearlConflict", "PearlError",
    "PearlProtocolError", "PearlRejected", "PearlTimeout", "PearlUnavailable", "RolloutClient", "TRAJECTORY_HEADER",
    "TURN_HEADER", "TrainBegun", "TrainFinished", "Trajectory", "TurnCounter", "WeightGroup",
    "WeightGroupDestroyed", "WeightGroupMember", "WeightsUpdated", "tag_headers",
]
