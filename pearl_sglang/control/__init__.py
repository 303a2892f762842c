"""Async shell of the control plane: state store, orchestration, executors, launchers."""
