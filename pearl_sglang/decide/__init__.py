"""``python -m pearl_sglang.decide``: the decision engine and planner from the shell."""
