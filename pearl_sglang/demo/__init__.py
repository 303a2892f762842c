"""PEARL's main job: an elastic agentic-RL run on an emulated cluster (no GPU needed)."""
