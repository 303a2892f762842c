"""An SGLang 0.5.23-compatible worker whose GPUs are a performance model.

Layers: ``profile``/``tokens``/``prefix_cache``/``transfer``/``scheduler`` are pure
pieces of the model; ``engine`` (with ``control``) is one worker's discrete-event
timeline on an injected clock; ``pd`` connects prefill and decode engines (the
benchmark harness runs many in one process on virtual time); ``server``/``http_*`` are
the thin aiohttp shell behind ``python -m pearl_sglang.emulator``, over the ``worker``
its handlers share.  Deliberate
differences from real SGLang are listed in ``DIFFERENCES.md`` next to this file.
"""

__version__ = "0.1.0"

from .engine import Engine, EngineConfig  # noqa: E402
from .pd import PDRegistry  # noqa: E402
from .profile import PerformanceModel, load_profile  # noqa: E402
from .request import (Bootstrap, DisaggregationMode, FinishReason, GenerateRequest, OpResult,  # noqa: E402
                      RequestHandle, RequestRejected, SamplingParams)

__all__ = ["Engine", "EngineConfig", "PDRegistry", "PerformanceModel", "load_profile", "Bootstrap",
           "DisaggregationMode", "FinishReason", "GenerateRequest", "OpResult", "RequestHandle",
           "RequestRejected", "SamplingParams"]
