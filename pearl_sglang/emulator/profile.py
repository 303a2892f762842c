"""Performance profiles: the numbers that make an emulated worker take real time.

A profile is data (``profiles/*.json``, derivations in ``profiles/PROFILES.md``).  This
module only loads it and evaluates the closed-form costs that the engine charges per
iteration, so a test can compare what the engine did against the formula it claims to
follow.  Everything here is pure.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

PROFILE_DIR = Path(__file__).with_name("profiles")


class ProfileError(ValueError):
    """A profile file is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class CostModel:
    """Per-iteration costs of one worker (all of its TP GPUs), in seconds.

    decode iteration = decode_fixed_s + decode_per_seq_s * B
                       + min(B * moe_expert_per_seq_s, moe_expert_max_s)
                       + decode_per_ctx_token_s * (sum of the B context lengths)
    prefill of n tokens starting at context position p
                     = n * prefill_per_token_s + prefill_attn_s * sum(p .. p+n-1)
    An iteration that prefills pays prefill_fixed_s once; a mixed iteration pays the
    decode terms plus the prefill terms.
    """

    decode_fixed_s: float
    decode_per_seq_s: float
    decode_per_ctx_token_s: float
    prefill_fixed_s: float
    prefill_per_token_s: float
    prefill_attn_s: float
    moe_expert_per_seq_s: float = 0.0
    moe_expert_max_s: float = 0.0

    def decode_s(self, batch: int, context_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        return self.decode_batch_s(batch) + self.decode_per_ctx_token_s * context_tokens

    def decode_batch_s(self, batch: int) -> float:
        """The terms of ``decode_s`` that depend on the batch alone (a decode stretch adds
        them once for all its iterations)."""
        moe = min(batch * self.moe_expert_per_seq_s, self.moe_expert_max_s)
        return self.decode_fixed_s + self.decode_per_seq_s * batch + moe

    def prefill_tokens_s(self, n: int, start: int) -> float:
        """Compute time of ``n`` new tokens at positions ``start .. start+n-1``."""
        if n <= 0:
            return 0.0
        positions = n * start + n * (n - 1) // 2
        return n * self.prefill_per_token_s + self.prefill_attn_s * positions


@dataclass(frozen=True)
class Lifecycle:
    """Durations of control operations, in emulated seconds."""

    cold_start_s: float
    role_switch_s: float
    release_s: float
    resume_s: float
    weight_update_disk_s: float
    weight_update_distributed_s: float
    weight_update_tensor_s: float
    flush_cache_s: float = 0.0


@dataclass(frozen=True)
class PerformanceModel:
    """An emulated worker as a performance model: what it serves on (model, hardware, TP),
    what it holds (token and request capacities), what each iteration costs (``cost``) and
    how long control operations take (``lifecycle``). A profile file holds one; the
    decision engine's paper-symbol ``core.profile.Profile`` is another thing."""

    name: str
    model: str
    hardware: str
    tp_size: int
    vocab_size: int
    eos_token_id: int
    context_length: int
    kv_bytes_per_token: int
    max_total_tokens: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    cache_page_tokens: int
    new_token_ratio: float
    eos_probability: float
    kv_bandwidth_bytes_per_s: float
    kv_latency_s: float
    cost: CostModel
    lifecycle: Lifecycle

    def validate(self) -> None:
        for part, where in ((self, ""), (self.cost, "cost."), (self.lifecycle, "lifecycle.")):
            _check_types(part, f"{self.name}: {where}")
        for field in ("tp_size", "context_length"):
            if getattr(self, field) < 1:
                raise ProfileError(f"{self.name}: {field} must be >= 1")
        if self.vocab_size < 64:
            raise ProfileError(f"{self.name}: vocab_size {self.vocab_size} too small")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ProfileError(f"{self.name}: eos_token_id outside the vocabulary")
        for field in ("max_total_tokens", "chunked_prefill_size", "max_prefill_tokens",
                      "max_running_requests", "cache_page_tokens", "kv_bytes_per_token"):
            if getattr(self, field) <= 0:
                raise ProfileError(f"{self.name}: {field} must be positive")
        if not 0.0 <= self.eos_probability < 1.0:
            raise ProfileError(f"{self.name}: eos_probability must be in [0, 1)")
        if self.kv_bandwidth_bytes_per_s <= 0:
            raise ProfileError(f"{self.name}: kv_bandwidth_bytes_per_s must be positive")

    def kv_transfer_s(self, tokens: int) -> float:
        """Uncontended time to move ``tokens`` tokens of KV from prefill to decode."""
        return self.kv_latency_s + tokens * self.kv_bytes_per_token / self.kv_bandwidth_bytes_per_s

    def decode_throughput(self, batch: int, context_tokens_each: int) -> float:
        """Closed-form tokens/s of a steady decode batch."""
        return batch / self.cost.decode_s(batch, batch * context_tokens_each)

    def prefill_throughput(self, tokens: int, start: int = 0) -> float:
        """Closed-form tokens/s of one prefill of ``tokens`` new tokens after ``start``."""
        chunk = self.chunked_prefill_size
        total, done = 0.0, 0
        while done < tokens:
            n = min(chunk, tokens - done)
            total += self.cost.prefill_fixed_s + self.cost.prefill_tokens_s(n, start + done)
            done += n
        return tokens / total

    def replace(self, **changes: object) -> "PerformanceModel":
        return dataclasses.replace(self, **changes)


def _check_types(part: object, where: str) -> None:
    """Every field of a profile's dataclass ``part`` has its declared type, and every
    number is finite and >= 0 (costs, durations, rates, probabilities): a NaN or a string
    would otherwise reach the engine's clock arithmetic."""
    for f in dataclasses.fields(part):
        value = getattr(part, f.name)
        if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ProfileError(f"{where}{f.name} must be an integer, got {value!r}")
        if f.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < math.inf):
            raise ProfileError(f"{where}{f.name} must be a finite number >= 0, got {value!r}")
        if f.type == "str" and not isinstance(value, str):
            raise ProfileError(f"{where}{f.name} must be a string, got {value!r}")


def _from_dict(data: dict) -> PerformanceModel:
    if not isinstance(data, dict) or not isinstance(data.get("cost"), dict) \
            or not isinstance(data.get("lifecycle"), dict):
        raise ProfileError("malformed profile: a JSON object with objects 'cost' and 'lifecycle'")
    try:
        body = {k: v for k, v in data.items() if not k.startswith("_")}
        cost = CostModel(**body.pop("cost"))
        life = Lifecycle(**body.pop("lifecycle"))
        profile = PerformanceModel(cost=cost, lifecycle=life, **body)
    except (KeyError, TypeError) as e:
        raise ProfileError(f"malformed profile: {e}") from e
    profile.validate()
    return profile


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> PerformanceModel:
    """Load a bundled profile by name (``qwen3-8b-h800-tp2``) or a JSON file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ProfileError(
            f"unknown profile {name_or_path!r}; bundled: {', '.join(available_profiles())}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: {e}") from e
    return _from_dict(data)
