"""Async shell of the control plane: orchestration, executors, launchers; it reaches the
data path only through its ``DataPlane`` port (``data_plane``)."""
