"""Checks of option values shared by the environment's configs: counts, seeds, finite real numbers. Imports nothing
heavy, so that command-line parsers can use it."""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["MAX_SEED", "check_count", "check_seed", "is_real"]


def check_count(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as a Python int >= ``minimum`` (numpy integers accepted); a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} of type {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {int(value)}")
    return int(value)


MAX_SEED: int = 2**63 - 1
"""Largest seed an environment's ``reset`` accepts (seeds are integers in [0, MAX_SEED])."""


def check_seed(seed: Any) -> int | None:
    """``seed`` as a Python int in [0, MAX_SEED], or None; a clear error otherwise."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be None or an integer in [0, {MAX_SEED}], got {seed!r} of type "
                        f"{type(seed).__name__}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {MAX_SEED}] (2^63 - 1), got {int(seed)}")
    return int(seed)


def is_real(v: Any) -> bool:
    """Whether ``v`` is a finite real number (bools are not)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
