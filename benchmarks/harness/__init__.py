"""Replay harness: PEARL's real control plane and router against in-process emulated
workers on a virtual-time event loop (``vtime``), one policy per run (``systems``)."""
