"""Every policy the model accepts gives a complete, finite report (no overflow, no 500)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.reporting.report import Row, build_report
from dp_governor.budget.reporting.text import render_text
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.policies.model import MAX_EPSILON, MICRO, Policy, PolicyCreate, budget_key

EPS_MICRO = st.integers(1, int(MAX_EPSILON * MICRO))
CAP_MICRO = st.integers(1, 10**9 * MICRO)


@st.composite
def budgets(draw: st.DrawFn, index: int) -> list[Policy]:
    """One budget: a use case alone or a group of members with their own epsilon and group size.

    Shared fields (daily cap, retention, caps) agree across a group, as the policy store
    requires; caps are at least every member's epsilon, as the model requires.
    """
    members = draw(st.integers(1, 3))
    epsilons = [draw(EPS_MICRO) for _ in range(members)]
    largest = max(epsilons)
    window = draw(st.none() | CAP_MICRO.filter(lambda c: c >= largest))
    lifetime = draw(st.none() | CAP_MICRO.filter(lambda c: c >= largest))
    shared: dict[str, Any] = {
        "max_reports_per_day": draw(st.integers(1, 1000)),
        "retention_days": draw(st.integers(1, 3650)),
        "window_epsilon_cap": None if window is None else window / MICRO,
        "lifetime_epsilon_cap": None if lifetime is None else lifetime / MICRO,
        "budget_group": f"group-{index}" if members > 1 else None,
    }
    out = []
    for j, eps in enumerate(epsilons):
        created = PolicyCreate.model_validate(
            {
                "name": f"use-{index}-{j}",
                "mechanism": "cms",
                "k": 16,
                "m": 64,
                "epsilon_per_report": eps / MICRO,
                "group_size": draw(st.integers(1, 1000)),
                "delta": draw(st.floats(0, 1, exclude_min=True, exclude_max=True)),
                **shared,
            }
        )
        out.append(Policy(**created.model_dump(), version=1, active=draw(st.booleans())))
    return out


@st.composite
def ledgers(draw: st.DrawFn) -> tuple[list[Policy], list[Row]]:
    """Policies and a few devices' rows of them, with counts the caps could have allowed."""
    policies = [p for i in range(draw(st.integers(1, 3))) for p in draw(budgets(i))]
    rows: list[Row] = []
    for device in range(draw(st.integers(0, 4))):
        for p in draw(st.lists(st.sampled_from(policies), max_size=3, unique_by=lambda p: p.name)):
            count = draw(st.integers(1, 2000))
            eps = round(p.epsilon_per_report * MICRO)
            rows.append((f"dk{device}", p.name, eps, p.group_size, count, budget_key(p)))
    return policies, rows


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ledger=ledgers(),
    delta=st.none() | st.floats(0, 1, exclude_min=True, exclude_max=True),
)
def test_every_accepted_policy_gives_a_finite_report(
    ledger: tuple[list[Policy], list[Row]], delta: float | None
) -> None:
    policies, rows = ledger
    book = PolicyBook.build(policies, {})
    report = build_report(book, 20_000, rows, rows, accountant=Accountant(), delta=delta)
    data = report.to_dict()
    json.dumps(data, allow_nan=False)  # what the API sends: no inf or nan anywhere
    assert _finite(data)
    assert render_text(report)
    t = report.totals
    for loss in (t.allowed_per_day, t.allowed_per_window, t.allowed_per_year):
        assert 0 <= loss.epsilon <= loss.epsilon_basic or loss.bound.startswith("upper bound")
    # a budget's shared caps count once: the day's allowance is at most every use case's own
    active = [p for p in policies if p.active]
    own_day = sum(line.group_epsilon_per_day for line in report.use_cases)
    assert t.allowed_per_day.epsilon_basic <= own_day + 1e-6 * max(1.0, own_day)
    if {budget_key(p) for p in active} == {p.name for p in active}:  # no groups
        assert math.isclose(t.allowed_per_day.epsilon_basic, own_day, rel_tol=1e-12)
    if rows:
        bound = t.device_bound_lifetime
        assert bound is not None and bound.max <= bound.basic_max
