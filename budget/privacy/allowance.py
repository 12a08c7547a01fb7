"""What a budget's caps allow one device at most over a horizon: the worst case of its schedule.

A budget (a use case, or the budget group its members share) has shared caps: ``R`` reports a
day across its members, an epsilon cap ``W`` over every ``w`` consecutive days (the retention
window) and a lifetime epsilon cap ``L``. Members may differ in epsilon per report ``c_i`` (what
the caps count) and group size ``g_i`` (a report is ``c_i g_i``-DP for groups). The worst case
over ``T`` days is the largest ``sum c_i g_i`` over every schedule the gate accepts: per day at
most ``R`` reports; every ``w``-day window at most ``W``; in all at most ``L``.

- One member (or members alike): front-load each ``w``-day block. With ``k = min(floor(W / c),
  R w)`` reports a window, ``n(T) = floor(T / w) k + min(k, R (T mod w))``, then at most
  ``floor(L / c)``. It is exact: any schedule splits into ``ceil(T / w)`` blocks of at most ``w``
  days, each within one window, and the front-loaded schedule reaches the bound (a window
  starting inside a block holds that block's tail and the next one's head, which together are
  one block's reports). E.g. epsilon 4, one a day, window cap 100 over 90 days: 105 reports in
  365 days (420), not ``ceil(365 / 90) = 5`` windows (500).
- Members that differ: without a binding epsilon cap, ``R`` reports a day of the largest
  ``c_i g_i`` (the daily cap counts reports, so the worst case takes the largest first). With a
  window cap, write ``T = q w + r`` and cut the days into pieces ``A_0 B_0 A_1 ... B_{q-1} A_q``
  (``A`` of ``r`` days, ``B`` of ``w - r``): every adjacent pair is inside one window, so costs at
  most ``W``. Weighting the pairs ``(A_k, B_k)`` by ``(q - k) / (q (q + 1))`` and ``(B_k,
  A_{k+1})`` by ``(k + 1) / (q (q + 1))`` writes any schedule's value as an average of
  ``(q + 1) v(A) + q v(B)`` over allowed pairs, so the maximum is the best such pair, and the
  ``w``-periodic schedule repeating it reaches it. That is a two-bin knapsack
  (``|A| <= R r``, ``|B| <= R (w - r)``, ``c(A) + c(B) <= W``) of ``2m`` integer variables,
  solved with HiGHS (``scipy.optimize.milp``) and checked in integers: the solver's optimum is
  an upper bound, the rounded-down, greedily refilled point an allowed schedule; they agree
  unless the numbers defeat floating point. A binding lifetime cap adds the bound of a knapsack
  with ``cost <= L``; the figure is exact when an allowed schedule (one member alone) reaches
  the smaller bound, else it is that upper bound, marked ``exact_value=False``.

For the (epsilon, delta) composition the report also needs a schedule: with one member it is the
maximal one, which dominates every allowed schedule (more events of the same epsilon only add
loss). With members that differ it is ``n_max`` events of the largest ``c_i g_i`` (``n_max`` the
most reports any schedule holds), which dominates every allowed schedule but may not be allowed
itself: ``exact_schedule`` is then False and the composition is an upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, reduce

import numpy as np

__all__ = ["Allowance", "Caps", "allowance", "max_reports"]


@dataclass(frozen=True, slots=True)
class Caps:
    """A budget's shared caps, in micro-epsilon (``None``: not set)."""

    reports_per_day: int
    window_days: int
    window_micro: int | None
    lifetime_micro: int | None


@dataclass(frozen=True, slots=True)
class Allowance:
    """The most one device can spend on a budget over a horizon.

    ``value_micro`` is the largest ``sum(epsilon x group size)`` of any allowed schedule (exact
    when ``exact_value``; else a valid upper bound); ``schedule`` is ``((micro-epsilon x group
    size, reports), ...)``, an allowed schedule reaching it when ``exact_schedule``, else one that
    dominates every allowed schedule.
    """

    value_micro: int
    schedule: tuple[tuple[int, int], ...]
    exact_value: bool
    exact_schedule: bool


def max_reports(caps: Caps, cost_micro: int, days: int) -> int:
    """Most reports of ``cost_micro`` each the caps allow in ``days`` days (exact, see above).

    >>> max_reports(Caps(1, 90, 100_000_000, None), 4_000_000, 365)
    105
    """
    if days <= 0:
        return 0
    r, w = caps.reports_per_day, caps.window_days
    per_window = r * w if caps.window_micro is None else min(caps.window_micro // cost_micro, r * w)
    full, rest = divmod(days, w)
    n = full * per_window + min(per_window, r * rest)
    if caps.lifetime_micro is not None:
        n = min(n, caps.lifetime_micro // cost_micro)
    return n


def _pareto(members: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The members no other beats on both cost (lower) and value (higher)."""
    kept: list[tuple[int, int]] = []
    for cost, value in sorted(set(members), key=lambda m: (m[0], -m[1])):
        if not kept or value > kept[-1][1]:
            kept.append((cost, value))
    return tuple(kept)


@lru_cache(maxsize=256)
def allowance(members: tuple[tuple[int, int], ...], caps: Caps, days: int) -> Allowance:
    """The worst case of a budget over ``days`` days; ``members`` are ``(cost, value)`` micro.

    ``cost`` is a member's micro-epsilon per report (what the caps count), ``value`` that times
    its group size.
    """
    if not members or days <= 0:
        return Allowance(0, (), True, True)
    front = _pareto(members)
    cheapest = min(c for c, _ in front)
    top = max(v for _, v in front)
    if len(front) == 1:
        n = max_reports(caps, cheapest, days)
        return Allowance(n * top, ((top, n),) if n else (), True, True)
    n_max = max_reports(caps, cheapest, days)
    dominating = ((top, n_max),) if n_max else ()
    r, w = caps.reports_per_day, caps.window_days
    costliest = max(c for c, _ in front)
    window = caps.window_micro
    window_binds = window is not None and window < r * min(w, days) * costliest
    life_binds = caps.lifetime_micro is not None and caps.lifetime_micro < r * days * costliest
    if not window_binds and not life_binds:
        n = r * days  # every day's R reports at the largest value: allowed and dominating
        return Allowance(n * top, ((top, n),), True, True)
    lower, upper = _bounds(front, caps, days)
    return Allowance(upper, dominating, lower == upper, False)


def _bounds(members: tuple[tuple[int, int], ...], caps: Caps, days: int) -> tuple[int, int]:
    """``(allowed value, upper bound)`` of the worst case of members that differ (see above)."""
    r, w = caps.reports_per_day, caps.window_days
    costliest = max(c for c, _ in members)
    q, rest = divmod(days, w)
    window = min(caps.window_micro or costliest * r * w, costliest * r * w)
    # the best pair (A, B): A on the r days counted q + 1 times, B on the w - r counted q times
    costs = [c for c, _ in members] * 2
    weights = [(q + 1) * v for _, v in members] + [q * v for _, v in members]
    m = len(members)
    rows = [
        ([1] * m + [0] * m, r * rest),
        ([0] * m + [1] * m, r * (w - rest) if q else 0),
        (costs, window),
    ]
    lower, upper, _ = _knapsack(weights, rows)
    # an allowed schedule: one member alone, with every cap (the lifetime's too)
    alone = max(max_reports(caps, c, days) * v for c, v in members)
    if caps.lifetime_micro is not None and caps.lifetime_micro < costliest * r * days:
        most = max_reports(caps, min(c for c, _ in members), days)
        life_rows = [([1] * m, most), ([c for c, _ in members], caps.lifetime_micro)]
        found, bound, point = _knapsack([v for _, v in members], life_rows)
        upper = min(upper, bound)
        spent = sum(c * n for (c, _), n in zip(members, point, strict=True))
        # a multiset costing at most one window's cap fits any spread over the days
        lower = found if caps.window_micro is None or spent <= caps.window_micro else alone
    return max(lower, alone), upper


def _knapsack(weights: list[int], rows: list[tuple[list[int], int]]) -> tuple[int, int, list[int]]:
    """``max weights @ x`` over integers ``x >= 0``, ``row @ x <= b``: ``(found, bound, x)``.

    Every coefficient is >= 0, so rounding HiGHS's point down stays allowed; then each variable
    is raised greedily while it fits. ``found`` is that point's value (allowed), ``bound`` the
    solver's optimum plus its absolute gap, rounded down to an integer (an upper bound: its
    tolerances admit points like 49.99999995 where 49 is the most that fits, which only raise
    it). When the two are within one unit they are the exact optimum and ``bound = found``.
    """
    n = len(weights)
    scale = reduce(math.gcd, weights) or 1
    matrix = np.asarray([row for row, _ in rows], dtype=np.float64)
    upper = np.asarray([b for _, b in rows], dtype=np.float64)
    from scipy.optimize import Bounds, LinearConstraint, milp  # scipy loads where it solves

    result = milp(
        -np.asarray([x // scale for x in weights], dtype=np.float64),
        constraints=LinearConstraint(matrix, -np.inf, upper),
        integrality=np.ones(n),
        bounds=Bounds(0, np.inf),
        options={"mip_rel_gap": 0.0, "presolve": True},
    )
    x = [0] * n
    if result.status == 0 and result.x is not None:
        x = [max(0, math.floor(v + 1e-9)) for v in result.x]
    while any(sum(a * v for a, v in zip(row, x, strict=True)) > b for row, b in rows):
        x = [max(0, v - 1) for v in x]  # the tolerance let a point slightly over: step back
    for j in sorted(range(n), key=lambda j: -weights[j]):
        room = min(
            (b - sum(a * v for a, v in zip(row, x, strict=True))) // row[j]
            for row, b in rows
            if row[j]
        )
        x[j] += max(0, room)
    found = sum(wt * v for wt, v in zip(weights, x, strict=True))
    if result.status != 0:  # every variable is in a 0/1 row: at most its bound of the largest
        bound = max(weights) * sum(b for row, b in rows if set(row) <= {0, 1})
        return found, max(found, bound), x
    # the optimum is an integer (in units of ``scale``) at most the solver's plus its absolute
    # gap (1e-6) and float rounding: round that down
    best = -float(result.fun)
    bound = math.floor(best + 1e-12 * abs(best) + 1e-6) * scale
    if found + scale > bound:  # within one unit of the optimum: exact
        return found, found, x
    return found, bound, x
