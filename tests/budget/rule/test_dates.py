"""Reports dated where the ledger can no longer count them are refused, whatever the clocks do.

Every check counts the window ending on the report's day, so a report dated before the
device's latest charge (a server whose clock runs behind another's, or was set back) or on a
day a purge already deleted (a purge host whose clock runs ahead, a purge just past midnight
beside a report stamped just before it) would leave a limit unchecked. A Hypothesis state
machine charges two devices under a budget group and a use case of its own with clocks skewed
back and forth, and purges at times ahead of the gate's. The gate must refuse exactly the
reports dated before the first countable day (``clock_behind``, retry at that day), and the
raw log of accepted charges must hold every daily, window and lifetime cap on every day and
every window, which no figure of the service is asked about here.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import Engine

from dp_governor.budget import Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.clock import day_start
from dp_governor.policies import PolicyCreate

SECRET = b"dates-secret-dates-secret-dates-secret"
DEVICES = ("d1", "d2")
GROUP = {"max_reports_per_day": 2, "retention_days": 3, "window_epsilon_cap": 3.0,
         "lifetime_epsilon_cap": 6.0}  # fmt: skip
OWN = {"max_reports_per_day": 1, "retention_days": 2, "window_epsilon_cap": 2.0}
BUDGETS = {"a": "g", "b": "g", "c": "c"}  # a use case -> the budget that counts it
TERMS = {"g": GROUP, "c": OWN}


def _policy(name: str) -> PolicyCreate:
    terms: dict[str, Any] = GROUP if BUDGETS[name] == "g" else OWN
    return PolicyCreate.model_validate(
        {
            "name": name,
            "mechanism": "cms",
            "k": 4,
            "m": 8,
            "epsilon_per_report": 1.0,
            "budget_group": "g" if BUDGETS[name] == "g" else None,
            **terms,
        }
    )


class DatesMachine(RuleBasedStateMachine):
    """One SQLite ledger, charged and purged under skewed clocks; the raw log kept beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.engine = create_db_engine(f"sqlite:///{self.dir / 'dates.sqlite'}", job_pause=0)
        init_db(self.engine)
        self.ledger = Ledger(self.engine, SECRET)
        for name in BUDGETS:
            self.ledger.policies.create(_policy(name))
        self.now = datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)
        self.log: list[tuple[str, str, int]] = []  # (device, use case, day) of each acceptance

    def teardown(self) -> None:
        self.engine.dispose()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _first(self, device: str, name: str) -> int:
        """The first countable day: the budget's latest charge, after every horizon it met."""
        horizons = self.ledger.book().horizons
        budget = BUDGETS[name]  # what the report's limits read: its budget's charges alone
        mine = [(u, d) for dev, u, d in self.log if dev == device and BUDGETS[u] == budget]
        latest = max((d for _, d in mine), default=-(10**9))
        met = {u for u, _ in mine} | {name}
        return max(latest, max(horizons.get(u, -(10**9)) for u in met) + 1)

    @rule(days=st.integers(0, 3), seconds=st.sampled_from([0, 1, 2]))
    def advance(self, days: int, seconds: int) -> None:
        """Time passes (a second or two crosses midnight)."""
        self.now += timedelta(days=days, seconds=seconds)

    @rule(
        device=st.sampled_from(DEVICES),
        name=st.sampled_from(tuple(BUDGETS)),
        skew=st.sampled_from([-3, -1, 0, 0, 0, 1, 2]),
        seconds=st.sampled_from([0, -2, 2]),
    )
    def charge(self, device: str, name: str, skew: int, seconds: int) -> None:
        """A report through a gate whose clock is off by ``skew`` days and a few seconds."""
        when = self.now + timedelta(days=skew, seconds=seconds)
        day = utc_day(when)
        first = self._first(device, name)
        decision = self.ledger.charge(device, name, now=when)
        if day < first:
            assert decision.reason == "clock_behind", (decision, first)
            assert decision.retry_at == day_start(first)
        else:
            assert decision.reason != "clock_behind", (decision, first)
        if decision.accepted:
            self.log.append((device, name, day))

    @rule(ahead=st.sampled_from([0, 0, 1, 3, 6]), seconds=st.sampled_from([0, 2]))
    def purge(self, ahead: int, seconds: int) -> None:
        """The daily purge, from a host whose clock may run ahead of the gate's."""
        self.ledger.purge(now=self.now + timedelta(days=ahead, seconds=seconds))

    @invariant()
    def every_cap_holds_in_the_raw_log(self) -> None:
        per_day: dict[tuple[str, str, int], int] = defaultdict(int)
        for device, name, day in self.log:
            per_day[(device, BUDGETS[name], day)] += 1  # one report of epsilon 1 each
        for device in DEVICES:
            for budget, terms in TERMS.items():
                days = {d: n for (dev, b, d), n in per_day.items() if dev == device and b == budget}
                assert all(n <= terms["max_reports_per_day"] for n in days.values()), days
                width = terms["retention_days"]
                for end in days:  # every window that ends on a charged day (the fullest ones)
                    held = sum(n for d, n in days.items() if end - width < d <= end)
                    assert held <= terms["window_epsilon_cap"], (budget, end, days)
                lifetime = terms.get("lifetime_epsilon_cap")
                assert lifetime is None or sum(days.values()) <= lifetime, (budget, days)


def test_no_clock_skew_or_early_purge_lets_a_report_past_a_cap() -> None:
    machine = settings(
        max_examples=40,
        stateful_step_count=30,
        suppress_health_check=[HealthCheck.too_slow],
    )(DatesMachine)
    machine.TestCase().runTest()


def _ledger_of_c(folder: Path) -> tuple[Engine, Ledger]:
    """A SQLite ledger in ``folder`` with use case ``c`` (a budget of its own)."""
    engine = create_db_engine(f"sqlite:///{folder / 'l.sqlite'}", job_pause=0)
    init_db(engine)
    ledger = Ledger(engine, SECRET)
    ledger.policies.create(_policy("c"))
    return engine, ledger


def test_a_report_dated_on_a_purged_day_is_refused(tmp_path: Path) -> None:
    """A purge host five days ahead: the gate's day is gone; refused, not charged unseen."""
    engine, ledger = _ledger_of_c(tmp_path)
    now = datetime(2026, 1, 10, 12, tzinfo=UTC)
    ledger.purge(now=now + timedelta(days=5))
    decisions = [ledger.charge("dev", "c", now=now) for _ in range(3)]
    assert {d.reason for d in decisions} == {"clock_behind"}
    horizon = ledger.book().horizons["c"]
    assert all(d.retry_at == day_start(horizon + 1) for d in decisions)
    assert ledger.charge("dev", "c", now=day_start(horizon + 1)).accepted
    engine.dispose()


def test_a_report_dated_before_the_devices_latest_charge_is_refused(tmp_path: Path) -> None:
    """A clock set back after charges at later days: refused until it reaches them again."""
    engine, ledger = _ledger_of_c(tmp_path)
    ahead = datetime(2026, 3, 15, 12, tzinfo=UTC)
    assert ledger.charge("dev", "c", now=ahead).accepted
    back = ledger.charge("dev", "c", now=ahead - timedelta(days=5))
    assert back.reason == "clock_behind" and back.retry_at == day_start(utc_day(ahead))
    assert ledger.charge("other", "c", now=ahead - timedelta(days=5)).accepted  # its own dates
    ledger.policies.create(_policy("a"))  # another budget reads none of c's charges
    assert ledger.charge("dev", "a", now=ahead - timedelta(days=5)).accepted
    engine.dispose()
