"""How long a worker may stay silent on a stream before the router calls it stalled.

A worker streams a chunk every ``stream_interval`` decode iterations, after the prompt's
prefill. So the longest healthy silence is the prefill of the largest context the
profile expects (``S * delta_L`` tokens at ``t_prefill``) or one interval of decode
iterations at full batch (``A + b * B`` each), whichever is longer; the bound is a
multiple of that, never below a floor that absorbs scheduling noise. A SIGSTOPped or
wedged worker exceeds it; a slow but live one does not. Pure: no I/O.
"""
from __future__ import annotations

import math

from pearl_sglang.core.profile import Profile

STALL_FACTOR = 10.0
STALL_FLOOR_S = 5.0
# Without a profile (attach mode) the router cannot know the model's speed: a bound that
# a long prefill of a large model stays under.
DEFAULT_STALL_S = 120.0


def stall_bound_s(profile: Profile | None, stream_interval: int, *, time_scale: float = 1.0,
                  factor: float = STALL_FACTOR, floor_s: float = STALL_FLOOR_S) -> float:
    """Seconds of silence after which a stream is stalled. ``time_scale`` is emulated
    seconds per real second (an emulated cluster runs the profile faster)."""
    if profile is None:
        return DEFAULT_STALL_S
    prefill = profile.t_prefill * profile.S * profile.delta_L
    decode = stream_interval * (profile.A + profile.b * profile.B)
    return max(floor_s, factor * max(prefill, decode) / time_scale)


def silent_answer_bound_s(chunk_s: float, max_new_tokens: int, stream_interval: int) -> float:
    """Seconds a worker may take over an answer it sends whole (a non-streaming request):
    a healthy worker would have streamed its prefill and every ``stream_interval`` tokens
    each within the stall bound ``chunk_s``."""
    return chunk_s * (1 + math.ceil(max(1, max_new_tokens) / stream_interval))
