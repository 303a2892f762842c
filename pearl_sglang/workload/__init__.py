"""Emulated agentic RL workload: the SWE-like sampler, the environment, and the
asynchronous RL driver that PEARL's demo and benchmarks run against a router."""
from pearl_sglang.workload.admin_hooks import admin_hooks
from pearl_sglang.workload.driver import AgenticRLDriver, DriverConfig
from pearl_sglang.workload.environment import EmulatedEnvironment, Observation
from pearl_sglang.workload.errors import (
    GenerateError, GenerateFailed, GenerateRejected, GenerateRetryable, TrainingFailed, WorkloadError,
)
from pearl_sglang.workload.results import StepResult, Trajectory, TurnTelemetry, to_turn_records
from pearl_sglang.workload.swe import SweSampler, SweWorkload, TurnPlan
from pearl_sglang.workload.timebase import EmulatedTime, LoopClock
from pearl_sglang.workload.trainer import EmulatedTrainer, Trainer, TrainerProfile, TrainHooks

__all__ = [
    "AgenticRLDriver", "DriverConfig", "EmulatedEnvironment", "EmulatedTime", "EmulatedTrainer",
    "GenerateError", "GenerateFailed", "GenerateRejected", "GenerateRetryable", "LoopClock",
    "Observation", "StepResult", "SweSampler", "SweWorkload", "Trainer", "TrainerProfile",
    "TrainHooks", "TrainingFailed", "Trajectory", "TurnPlan", "TurnTelemetry", "WorkloadError",
    "admin_hooks", "to_turn_records",
]
