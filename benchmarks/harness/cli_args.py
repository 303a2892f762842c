"""Argument types for the benchmarks' command lines: a count or a duration no run can use
(0 workers, a NaN time scale) is refused by argparse (exit 2) before anything starts."""
from __future__ import annotations

import argparse

from pearl_sglang.router.config import finite_float


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def pd_ratio(text: str) -> str:
    """``P:D`` with both >= 1 (``4:12``), as given."""
    p, sep, d = text.partition(":")
    if not (sep and p.isdigit() and d.isdigit() and int(p) >= 1 and int(d) >= 1):
        raise argparse.ArgumentTypeError(f"must be P:D with both >= 1, e.g. 4:12, got {text!r}")
    return text


def known_profile(name: str) -> str:
    """An emulator profile that loads (a bundled name or a JSON path), as given."""
    from pearl_sglang.emulator.profile import ProfileError, load_profile

    try:
        load_profile(name)
    except ProfileError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name
