"""Integration shims for RL frameworks (ROLL, veRL, slime).

Each shim keeps the framework-facing glue (subclasses, monkey patches) thin and
imports its framework only inside functions, so this package imports without any of
them; the logic sits in framework-independent hook classes that the tests drive with
stand-in training loops.
"""
