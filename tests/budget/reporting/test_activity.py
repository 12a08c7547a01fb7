"""Accepted and refused reports per day: counts from the charges and the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dp_governor.budget import Ledger
from dp_governor.budget.reporting.activity import daily_activity

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def test_accepted_and_refused_per_day_by_use_case_and_reason(ledger: Ledger) -> None:
    # emoji allows one report a day: each device's second of a day is refused (daily cap)
    for back, devices in ((20, 3), (3, 2), (1, 4), (0, 1)):
        for i in range(devices):
            for _ in range(2):
                ledger.charge(f"d{back}-{i}", "emoji", now=NOW - timedelta(days=back))
    ledger.charge("x", "lookup-hints", now=NOW)
    activity = daily_activity(ledger.engine, now=NOW, days=5)
    assert activity.days == [f"2026-11-{d}" for d in range(18, 23)]
    assert activity.accepted == {"emoji": [0, 2, 0, 4, 1], "lookup-hints": [0, 0, 0, 0, 1]}
    assert activity.refused == {
        "daily_cap": [0, 2, 0, 4, 1],
        "window_cap": [0] * 5,
        "lifetime_cap": [0] * 5,
    }  # the refusals of 20 days ago are before the first day shown
    assert activity.refused_by_use_case == {"emoji/daily_cap": [0, 2, 0, 4, 1]}
    assert "d0-0" not in str(activity.to_dict())  # counts only, never a device


def test_an_empty_ledger_has_zero_days(ledger: Ledger) -> None:
    activity = daily_activity(ledger.engine, now=NOW, days=3)
    assert activity.accepted == {} and activity.refused["daily_cap"] == [0, 0, 0]
    with pytest.raises(ValueError, match="days"):
        daily_activity(ledger.engine, now=NOW, days=0)
