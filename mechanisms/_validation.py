"""Checks for mechanism parameters; messages name the field and the value."""

from __future__ import annotations

import math
import numbers

__all__ = ["check_epsilon", "check_int"]


def check_epsilon(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite real number > 0, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a number, got {value!r}")
    eps = float(value)
    if not math.isfinite(eps) or eps <= 0.0:
        raise ValueError(f"`{name}` must be finite and > 0, got {value!r}")
    return eps


def check_int(name: str, value: object, low: int, high: int) -> int:
    """Return ``value`` as an int if it is an integer in ``[low, high]``, else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {value!r}")
    v = int(value)
    if not low <= v <= high:
        raise ValueError(f"`{name}` must be in [{low}, {high}], got {v}")
    return v
