"""PEARL for SGLang: elastic prefill-decode rollout for agentic RL.

Layers (arrows point down): ``router`` (HTTP shell) -> ``control`` (async shell) ->
``core`` (pure decisions).  ``emulator`` is an SGLang-compatible worker used by tests
and benchmarks; ``engine`` builds real SGLang launch arguments.
"""

__version__ = "0.1.0"
