"""Every refusal reason of the rule, for every budget that can refuse, at its boundary.

Database-free: terms and account states are built in memory and decided by
:func:`dp_governor.budget.rule.decide.check`, the function the gate and what-if call. Each row
spends up to the limit (the last report that fits is accepted, exactly at the limit) and one
more report is refused, naming the limit, the budget that refused, and the first day it fits
again (``None``: never). Filter boundaries come from the filter's own target, so the table
holds at any ``V*``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from dp_governor.budget.rule.book import Terms
from dp_governor.budget.rule.decide import check, decide_on
from dp_governor.budget.rule.filter import filters_of, target
from dp_governor.budget.rule.refusal import LIMITS, Reason, RefusedBy
from dp_governor.budget.rule.state import AccountState
from dp_governor.policies.device import DeviceLimits

DAY = 20_000  # a UTC day number
EPS = 1_000_000  # one report of epsilon 1, in micro-epsilon
DELTA = 1e-9


def _terms(**changes: Any) -> Terms:
    base = Terms(
        name="a",
        version=1,
        budget="a",
        epsilon=1.0,
        eps_micro=EPS,
        max_reports_per_day=1_000,
        retention_days=5,
        window_cap_micro=None,
        lifetime_cap_micro=None,
        members=frozenset({"a"}),
        ever_members=frozenset({"a"}),
    )
    return replace(base, **changes)


def _device(**limits: Any) -> DeviceLimits:
    fields: dict[str, Any] = {
        "version": 1,
        "day_micro": None,
        "window_days": 5,
        "window_micro": None,
        "lifetime_micro": None,
        "quotas": {},
    }
    return DeviceLimits(**(fields | limits))


def _filter_reports(epsilon_micro: int, eps: int) -> int:
    """The most reports of ``eps`` that a filter of target ``epsilon_micro`` admits."""
    t = target(epsilon_micro, DELTA)
    n = 0
    while t.admits((n + 1) * eps, (n + 1) * eps * eps):
        n += 1
    return n


@dataclass(frozen=True)
class Row:
    """One line of the table: terms, the use case that spends first, and the expected refusal."""

    id: str
    terms: Terms
    spender: str  # whose reports fill the limit ("a" itself, or "b" sharing a budget with it)
    fits: int  # reports that fit before the refusal (all on DAY unless ``spread``)
    reason: Reason
    refused_by: RefusedBy
    retry_day: int | None
    spread: bool = False  # one report a day, ending on DAY (for window limits)


GROUP = {"budget": "g", "members": frozenset({"a", "b"}), "ever_members": frozenset({"a", "b"})}
SMALL = 50_000  # epsilon 0.05 a report: the advanced filter admits more than the basic sum
W_FILTER = filters_of((4 * EPS, DELTA), (None, None), 5)
L_FILTER = filters_of((None, None), (4 * EPS, DELTA), 5)
N_FILTER = _filter_reports(4 * EPS, SMALL)

TABLE = [
    Row("use case: daily cap", _terms(max_reports_per_day=2), "a", 2, "daily_cap", "use_case",
        DAY + 1),
    Row("use case: window cap", _terms(window_cap_micro=3 * EPS), "a", 3, "window_cap",
        "use_case", DAY + 3, spread=True),
    Row("use case: lifetime cap", _terms(lifetime_cap_micro=3 * EPS), "a", 3, "lifetime_cap",
        "use_case", None),
    Row("use case: window filter", _terms(filters=W_FILTER, eps_micro=SMALL), "a", N_FILTER,
        "window_filter", "use_case", DAY + 5),
    Row("use case: lifetime filter", _terms(filters=L_FILTER, eps_micro=SMALL), "a", N_FILTER,
        "lifetime_filter", "use_case", None),
    Row("group: daily cap", _terms(max_reports_per_day=2, **GROUP), "b", 2, "daily_cap",
        "group", DAY + 1),
    Row("group: window cap", _terms(window_cap_micro=3 * EPS, **GROUP), "b", 3, "window_cap",
        "group", DAY + 3, spread=True),
    Row("group: lifetime cap", _terms(lifetime_cap_micro=3 * EPS, **GROUP), "b", 3,
        "lifetime_cap", "group", None),
    Row("group: window filter", _terms(filters=W_FILTER, eps_micro=SMALL, **GROUP), "b", N_FILTER,
        "window_filter", "group", DAY + 5),
    Row("group: lifetime filter", _terms(filters=L_FILTER, eps_micro=SMALL, **GROUP), "b", N_FILTER,
        "lifetime_filter", "group", None),
    Row("device: daily limit", _terms(device=_device(day_micro=2 * EPS)), "b", 2, "daily_cap",
        "device", DAY + 1),
    Row("device: window limit", _terms(device=_device(window_micro=3 * EPS)), "b", 3,
        "window_cap", "device", DAY + 3, spread=True),
    Row("device: lifetime limit", _terms(device=_device(lifetime_micro=3 * EPS)), "b", 3,
        "lifetime_cap", "device", None),
    Row("device: window filter",
        _terms(device=_device(window_filter_micro=4 * EPS, window_filter_delta=DELTA),
               eps_micro=SMALL), "b", N_FILTER, "window_filter", "device", DAY + 5),
    Row("device: lifetime filter",
        _terms(device=_device(lifetime_filter_micro=4 * EPS, lifetime_filter_delta=DELTA),
               eps_micro=SMALL), "b", N_FILTER, "lifetime_filter", "device", None),
    Row("quota: daily", _terms(device=_device(day_micro=4 * EPS, quotas={"a": 500_000})), "a",
        2, "daily_cap", "quota", DAY + 1),
    Row("quota: window", _terms(device=_device(window_micro=6 * EPS, quotas={"a": 500_000})),
        "a", 3, "window_cap", "quota", DAY + 3, spread=True),
    Row("quota: lifetime",
        _terms(device=_device(lifetime_micro=6 * EPS, quotas={"a": 500_000})), "a", 3,
        "lifetime_cap", "quota", None),
]  # fmt: skip


def _days(row: Row) -> list[int]:
    """The days of the ``row.fits`` reports that fill the limit, the last one on DAY."""
    return list(range(DAY - row.fits + 1, DAY + 1)) if row.spread else [DAY] * row.fits


def _state(row: Row, reports: int | None = None) -> AccountState:
    """The account after the first ``reports`` (default: all) of the row's reports."""
    state = AccountState()
    budget = row.terms.budget if row.spender in row.terms.members else row.spender
    for day in _days(row)[:reports]:
        state.charge(row.spender, day, row.terms.eps_micro, 1, 1, budget)
    return state


def test_the_table_covers_every_reason_for_every_budget_that_can_refuse() -> None:
    seen = {(row.reason, row.refused_by) for row in TABLE}
    for who in ("use_case", "group", "device"):
        assert {(r, who) for r in LIMITS} <= seen, who
    assert {(r, "quota") for r in ("daily_cap", "window_cap", "lifetime_cap")} <= seen
    assert N_FILTER == 141 > 80  # the filter admits more than the basic sum (80 x 0.05 = 4)


def _spender_terms(row: Row) -> Terms:
    """The terms the spender's own reports are decided under.

    ``b`` is a member of the same group, or a use case of its own under the same device limits.
    """
    if row.spender == row.terms.name:
        return row.terms
    if row.spender in row.terms.members:
        return replace(row.terms, name=row.spender)
    alone = frozenset({row.spender})
    return replace(row.terms, name=row.spender, budget=row.spender, members=alone,
                   ever_members=alone)  # fmt: skip


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
def test_the_last_report_that_fits_is_accepted_and_the_next_refused(row: Row) -> None:
    last_day = _days(row)[-1]
    before = _state(row, row.fits - 1)
    last = decide_on(_spender_terms(row), last_day, before)  # charges it when accepted
    assert last.accepted, (row.id, last)
    full = _state(row)
    assert (before.count, before.epsilon_micro) == (full.count, full.epsilon_micro), row.id
    decision = check(row.terms, DAY, before)
    assert not decision.accepted
    assert (decision.reason, decision.refused_by) == (row.reason, row.refused_by)
    expected = (
        None if row.retry_day is None else datetime.fromtimestamp(row.retry_day * 86_400, UTC)
    )
    assert decision.retry_at == expected


@pytest.mark.parametrize("row", TABLE, ids=[row.id for row in TABLE])
def test_a_refusal_changes_nothing_and_an_unrelated_use_case_is_not_refused(row: Row) -> None:
    state = _state(row)
    snapshot = (state.count, state.epsilon_micro, [list(d) for d in state.days],
                [list(s) for s in state.slots])  # fmt: skip
    assert not decide_on(row.terms, DAY, state).accepted
    assert snapshot == (state.count, state.epsilon_micro, state.days, state.slots)
    if row.refused_by in ("group", "use_case") and row.spender == "b":
        other = _terms(name="c", budget="c", members=frozenset({"c"}),
                       ever_members=frozenset({"c"}))  # fmt: skip
        assert check(other, DAY, state).accepted
