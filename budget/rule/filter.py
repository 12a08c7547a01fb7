"""The privacy filters the gate enforces: an ``(epsilon, delta)`` target per window or lifetime.

A filter counts a set of slots (a budget's members, or all of a device's) at group-scaled
epsilon, and admits one more report of ``e`` when, with it counted, either the basic sum
``S1`` stays within ``epsilon`` or the advanced-composition filter's ``S2`` within ``V*``
(:func:`dp_governor.budget.privacy.odometer.admit_either`, the same comparisons in exact integers).
A lifetime filter sums every report ever; a window filter the days ``day - window + 1 .. day``,
which makes every window of that length a filtered sequence (docs/odometer.md, "Windows"). Pure
code.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from dp_governor.budget.privacy.odometer import Target, filter_cap_sq
from dp_governor.budget.rule.refusal import Refusal, RefusedBy, free_day
from dp_governor.budget.rule.state import AccountState
from dp_governor.policies.model import from_micro

__all__ = ["FilterTarget", "Filters", "filter_refusal", "filters_of", "target"]


@dataclass(frozen=True, slots=True)
class FilterTarget:
    """A filter's target in micro-epsilon, with ``V*`` in micro-epsilon squared (rounded down)."""

    epsilon_micro: int
    delta: float
    cap_sq: int

    def admits(self, s1: int, s2: int) -> bool:
        """Whether totals ``S1``, ``S2`` (this report counted) are within the target.

        >>> t = target(4_000_000, 1e-9)
        >>> t.admits(4_000_000, 10**13), t.admits(4_000_001, 352_746_556_067)
        (True, True)
        >>> t.admits(4_000_001, 352_746_556_068)
        False
        """
        return s1 <= self.epsilon_micro or s2 <= self.cap_sq


@functools.lru_cache(maxsize=256)
def target(epsilon_micro: int, delta: float) -> FilterTarget:
    """The target ``(epsilon, delta)`` with its ``V*`` (:func:`~.odometer.filter_cap_sq`)."""
    return FilterTarget(
        epsilon_micro, delta, filter_cap_sq(Target(from_micro(epsilon_micro), delta))
    )


@dataclass(frozen=True, slots=True)
class Filters:
    """The filters on one budget (``None``: no such filter); ``window_days`` the window's length."""

    window: FilterTarget | None
    lifetime: FilterTarget | None
    window_days: int


def filters_of(
    window: tuple[int | None, float | None],
    lifetime: tuple[int | None, float | None],
    window_days: int | None,
) -> Filters | None:
    """The filters of ``(micro-epsilon, delta)`` targets (``None``: neither is set)."""
    w, life = _target(*window), _target(*lifetime)
    return None if w is None and life is None else Filters(w, life, window_days or 1)


def _target(epsilon_micro: int | None, delta: float | None) -> FilterTarget | None:
    return None if epsilon_micro is None or delta is None else target(epsilon_micro, delta)


def filter_refusal(
    filters: Filters,
    state: AccountState,
    day: int,
    idx: list[int],
    eps: int,
    horizons: Mapping[str, int],
    refused_by: RefusedBy | None = None,
) -> Refusal | None:
    """The window filter, then the lifetime filter, on slots ``idx`` for one more report.

    ``eps`` is the report's group-scaled micro-epsilon. A window refusal frees on the first
    day enough of ``S1`` or ``S2`` has left the window; one the report alone exceeds, and a
    lifetime refusal, never (``retry_day`` ``None``).
    """
    sq = eps * eps
    window = filters.window
    if window is not None:
        rows = state.scaled_window(day, filters.window_days, idx, horizons)
        s1 = sum(r[1] for r in rows) + eps
        s2 = sum(r[2] for r in rows) + sq
        if not window.admits(s1, s2):
            free = None
            if window.admits(eps, sq):
                fits = lambda a, b: window.admits(a + eps, b + sq)  # noqa: E731
                free = free_day(rows, day, filters.window_days, fits)
            return Refusal("window_filter", free, refused_by)
    lifetime = filters.lifetime
    if lifetime is not None:
        _, s1, s2 = state.scaled_lifetime(idx)
        if not lifetime.admits(s1 + eps, s2 + sq):
            return Refusal("lifetime_filter", None, refused_by)
    return None
