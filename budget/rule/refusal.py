"""A refusal: which limit refused a report, whose budget it is, and when the report fits again.

The rule's checks (:mod:`dp_governor.budget.rule.decide`, :mod:`dp_governor.budget.rule.filter`,
:mod:`dp_governor.budget.rule.device`) each return a :class:`Refusal` or ``None``;
:func:`dp_governor.budget.rule.decide.check` turns the first refusal into the gate's
:class:`~budget.rule.decide.Decision`. Pure code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

__all__ = [
    "LIMITS",
    "REFUSALS",
    "Fits",
    "Reason",
    "Refusal",
    "RefusedBy",
    "free_day",
    "within",
]

Reason = Literal[
    "accepted",
    "daily_cap",
    "window_cap",
    "lifetime_cap",
    "window_filter",
    "lifetime_filter",
    "clock_behind",
]
RefusedBy = Literal["use_case", "group", "device", "quota"]
REFUSALS: tuple[Reason, ...] = get_args(Reason)[1:]
# A budget's limits. ``clock_behind`` is none: the report is dated before what the ledger has
# already recorded or deleted for the device (a purge's horizon, a later charge), so no limit
# could be checked for it (docs/ledger.md, "Dates the ledger can count").
LIMITS: tuple[Reason, ...] = tuple(r for r in REFUSALS if r != "clock_behind")


class Refusal(NamedTuple):
    """One check's refusal (``refused_by`` ``None``: the use case's own budget or its group's).

    ``retry_day`` is the first UTC day a report of the same terms can fit this limit again
    (``None``: never); ``window_left`` and ``lifetime_left`` the epsilon a cap has left.
    """

    reason: Reason
    retry_day: int | None
    refused_by: RefusedBy | None = None
    window_left: float | None = None
    lifetime_left: float | None = None


Fits = Callable[[int, int], bool]


def within(cap: int, eps: int) -> Fits:
    """A cap's test for :func:`free_day`: one more ``eps`` on top of ``S1`` stays within ``cap``.

    >>> within(3, 2)(1, 0), within(3, 2)(2, 0)
    (True, False)
    """
    return lambda s1, _: s1 + eps <= cap


def free_day(rows: list[tuple[int, int, int]], day: int, window: int, fits: Fits) -> int:
    """The first day after ``day`` on which a window check passes again, as spends leave it.

    ``rows`` are the window's ``(day, S1, S2)`` spends without the refused report;
    ``fits(s1, s2)`` says whether the report fits on top of what is left. A day's spends leave
    the window ``window`` days after it; no later report is assumed.

    >>> free_day([(10, 3, 9), (12, 1, 1)], 12, 5, lambda s1, _: s1 + 2 <= 3)
    15
    """
    spends = sorted(rows)
    s1 = sum(r[1] for r in spends)
    s2 = sum(r[2] for r in spends)
    for d, e1, e2 in spends:
        s1 -= e1
        s2 -= e2
        if fits(s1, s2):
            return max(d + window, day + 1)
    return day + 1
