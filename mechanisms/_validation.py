"""Errors and checks shared by the mechanisms: parameters, and report bodies as JSON decodes them.

Every message names the field and the value, so the service can return it as it is.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["InvalidReport", "check_epsilon", "check_int", "report_fields", "report_int"]


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


class InvalidReport(ValueError):
    """A report that does not fit its mechanism's parameters; ``field`` names the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"`{field}` {reason}")
        self.field = field
        self.reason = reason


def report_int(data: Mapping[str, Any], name: str, prefix: str, low: int, high: int) -> int:
    """Integer field ``name`` of a report body, in ``[low, high)``, or :class:`InvalidReport`."""
    value = data.get(name)
    if type(value) is int and low <= value < high:  # the common case, without the ABC checks
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidReport(prefix + name, f"must be an integer, got {value!r}")
    if not low <= value < high:
        raise InvalidReport(prefix + name, f"must be in [{low}, {high}), got {value}")
    return value


def report_fields(data: object, expected: set[str], prefix: str) -> Mapping[str, Any]:
    """Report body with exactly the fields ``expected``, or :class:`InvalidReport` naming one."""
    if type(data) is dict and data.keys() == expected:  # the common case, parsed JSON
        return data
    if not isinstance(data, Mapping):
        raise InvalidReport(prefix.rstrip(".") or "report", "must be an object")
    extra = set(data) - expected
    if extra:
        raise InvalidReport(prefix + sorted(extra)[0], "is not a field of this report")
    missing = expected - set(data)
    if missing:
        raise InvalidReport(prefix + sorted(missing)[0], "is required")
    return data
