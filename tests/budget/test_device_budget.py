"""The device-wide budget and its quotas: the gate against a model of the raw charge log.

A Hypothesis state machine interleaves charges of three use cases (one at group size 2, one in
a budget group), days passing, purges and edits of the device-wide budget (limits, filter
targets and quotas tightened, loosened, removed), on SQLite and on PostgreSQL. The model keeps
only the accepted charges and recomputes each decision, including which budget refused and when
it frees (the filters' from the theorem's condition,
:func:`tests.budget.privacy.filter_theorem.theorem_admits`). Focused tests pin the refusal names,
quotas preventing starvation and policy-file round trips.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from sqlalchemy import Engine

from dp_governor.budget import Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.clock import day_start
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.policies import PolicyCreate
from dp_governor.policies._files import PolicyFileError, load_device_budget
from dp_governor.policies.device import DeviceBudgetCreate, loosening, write_device_budget
from dp_governor.policies.model import MICRO, to_micro
from tests.budget.privacy.filter_theorem import theorem_admits
from tests.conftest import PG_URL

SECRET = b"device-budget-secret-device-budget-secret"
NAMES = ("a", "b", "c")  # c: group size 2; b: in group "g" with nobody else
EPS = {"a": 1.0, "b": 0.5, "c": 0.25}
RETENTION = 3
MAX_PER_DAY = 3


def _policy(name: str, **extra: Any) -> PolicyCreate:
    fields: dict[str, Any] = {
        "name": name,
        "mechanism": "cms",
        "k": 4,
        "m": 8,
        "epsilon_per_report": EPS.get(name, 1.0),
        "max_reports_per_day": MAX_PER_DAY,
        "retention_days": RETENTION,
        "group_size": 2 if name == "c" else 1,
        "budget_group": "g" if name == "b" else None,
    }
    fields.update(extra)
    return PolicyCreate.model_validate(fields)


@dataclass(frozen=True)
class Charged:
    device: str
    use_case: str
    day: int
    weight: int  # micro-epsilon x group size


SEEN: set[tuple[str | None, str]] = set()  # the outcomes the runs reached
ANY = object()  # a retry day on a filter's boundary: not compared
limits = st.sampled_from([None, None, None, 1.5, 3.0, 5.0])  # mostly none: reach the others
Pair = tuple[float, float] | None
filters = st.sampled_from([None, None, (2.0, 1e-6), (3.0, 0.05), (1.0, 0.3)])


def _body(
    day: float | None,
    window: tuple[int, float | None, Pair] | None,
    life: float | None,
    life_filter: Pair,
    quota: dict[str, float],
) -> DeviceBudgetCreate:
    days, cap, window_filter = window or (None, None, None)
    if cap is None and window_filter is None:
        days = None
    w, lf = window_filter or (None, None), life_filter or (None, None)
    body = DeviceBudgetCreate(
        epsilon_per_day=day,
        window_days=days,
        window_epsilon=cap,
        lifetime_epsilon=life,
        window_filter_epsilon=w[0],
        window_filter_delta=w[1],
        lifetime_filter_epsilon=lf[0],
        lifetime_filter_delta=lf[1],
    )
    return body.model_copy(update={"quotas": quota if body.enabled else {}})


budgets = st.builds(
    _body,
    limits,
    st.one_of(
        st.none(),
        st.tuples(st.integers(1, 5), st.sampled_from([None, 2.0, 3.0, 6.0]), filters),
    ),
    st.one_of(st.none(), st.sampled_from([2.0, 4.0, 8.0])),
    filters,
    st.dictionaries(st.sampled_from(NAMES), st.sampled_from([0.25, 0.5, 1.0]), max_size=3),
)


class DeviceMachine(RuleBasedStateMachine):
    """One ledger with a device-wide budget and its model."""

    server: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.stack = ExitStack()
        url = f"sqlite:///{self.dir / 'device.sqlite'}"
        if self.server:
            url = self.stack.enter_context(scratch_schema(self.server, "devbudget"))
        self.engine: Engine = create_db_engine(url)
        init_db(self.engine)
        self.ledger = Ledger(self.engine, SECRET)
        for name in NAMES:
            self.ledger.policies.create(_policy(name))
        self.now = datetime(2026, 1, 1, 20, tzinfo=UTC)
        self.log: list[Charged] = []
        self.budget: DeviceBudgetCreate | None = None
        self.longest_window = 0
        self.horizon = -(10**9)  # every use case has retention 3: one horizon for all

    def teardown(self) -> None:
        self.engine.dispose()
        self.stack.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def day(self) -> int:
        return utc_day(self.now)

    def _expected(self, device: str, name: str) -> tuple[bool | None, str | None, str, Any]:
        """``(accepted, refused_by, reason, retry_at)``; ``None`` first: a filter's boundary."""
        day = self.day
        mine = [c for c in self.log if c.device == device and c.day > self.horizon]
        members = {"b"} if name == "b" else {name}
        if sum(1 for c in mine if c.use_case in members and c.day == day) >= MAX_PER_DAY:
            return False, "group" if name == "b" else "use_case", "daily_cap", day_start(day + 1)
        b = self.budget
        if b is None or not b.enabled:
            return True, None, "accepted", None
        weight = to_micro(EPS[name]) * (2 if name == "c" else 1)
        alive = [c for c in self.log if c.device == device]
        share = b.quotas.get(name)

        def cap(limit: float | None, who: str) -> int | None:
            if limit is None or (who == "quota" and share is None):
                return None
            return (
                to_micro(limit)
                if who == "device"
                else to_micro(limit) * to_micro(share or 0) // MICRO
            )

        def of(who: str, cs: list[Charged]) -> list[Charged]:
            return cs if who == "device" else [c for c in cs if c.use_case == name]

        for who in ("device", "quota"):
            c = cap(b.epsilon_per_day, who)
            spent = sum(x.weight for x in of(who, mine) if x.day == day)
            if c is not None and spent + weight > c:
                return False, who, "daily_cap", day_start(day + 1) if weight <= c else None
        for who in ("device", "quota"):
            c = cap(b.window_epsilon, who)
            if c is None or b.window_days is None:
                continue
            inside = [x for x in of(who, mine) if x.day > day - b.window_days]
            if sum(x.weight for x in inside) + weight > c:
                if weight > c:
                    return False, who, "window_cap", None
                free = day + 1
                while sum(x.weight for x in inside if x.day > free - b.window_days) + weight > c:
                    free += 1
                return False, who, "window_cap", day_start(free)
        for who in ("device", "quota"):
            c = cap(b.lifetime_epsilon, who)
            if c is not None and sum(x.weight for x in of(who, alive)) + weight > c:
                return False, who, "lifetime_cap", None
        return self._filtered(mine, alive, weight)

    def _filtered(
        self, held: list[Charged], alive: list[Charged], weight: int
    ) -> tuple[bool | None, str | None, str, Any]:
        """The device's window filter, then its lifetime filter, by the theorem's condition."""
        b, day = self.budget, self.day
        assert b is not None
        if b.window_filter_epsilon is not None and b.window_days is not None:
            target = (b.window_filter_epsilon, b.window_filter_delta or 0.0)

            def admits(end: int) -> bool | None:  # a report on day `end`, no other new one
                inside = [x.weight for x in held if end - (b.window_days or 0) < x.day <= end]
                return theorem_admits([*inside, weight], *target)

            verdict = admits(day)
            if verdict is None:
                return None, "device", "window_filter", None
            if not verdict:
                if not theorem_admits([weight], *target):
                    return False, "device", "window_filter", None
                # the first later day it fits, as charges leave the window (by day + window)
                later = range(day + 1, day + b.window_days + 1)
                free = next((d, v) for d, v in ((d, admits(d)) for d in later) if v is not False)
                return False, "device", "window_filter", day_start(free[0]) if free[1] else ANY
        if b.lifetime_filter_epsilon is not None:
            target = (b.lifetime_filter_epsilon, b.lifetime_filter_delta or 0.0)
            verdict = theorem_admits([*(x.weight for x in alive), weight], *target)
            if not verdict:
                return verdict, "device", "lifetime_filter", None
        return True, None, "accepted", None

    @rule(device=st.sampled_from(["d1", "d2"]), name=st.sampled_from(NAMES))
    def charge(self, device: str, name: str) -> None:
        want = self._expected(device, name)
        got = self.ledger.charge(device, name, now=self.now)
        SEEN.add((got.refused_by, got.reason))
        if want[0] is None:  # a filter's boundary: either answer, and the model follows it
            assert got.accepted or (got.refused_by, got.reason) == want[1:3], (got, want)
        else:
            assert (got.accepted, got.refused_by, got.reason) == want[:3], (got, want)
        if not got.accepted and want[0] is False and want[3] is not ANY:
            assert got.retry_at == want[3], (got, want)
        else:
            weight = to_micro(EPS[name]) * (2 if name == "c" else 1)
            self.log.append(Charged(device, name, self.day, weight))

    @rule(days=st.integers(1, 3))
    def advance(self, days: int) -> None:
        self.now += timedelta(days=days)

    @rule()
    def purge(self) -> None:
        self.ledger.purge(now=self.now)
        self.horizon = max(self.horizon, self.day - max(RETENTION, self.longest_window))

    @rule(body=budgets)
    def set_device_budget(self, body: DeviceBudgetCreate) -> None:
        write_device_budget(self.engine, body, actor="model")
        self.budget = body
        self.longest_window = max(self.longest_window, body.window_days or 0)

    @rule(device=st.sampled_from(["d1", "d2"]))
    def view_agrees(self, device: str) -> None:
        shown = self.ledger.device_wide(device, now=self.now)
        b = self.budget
        if b is None or not b.enabled:
            assert shown is None
            return
        assert shown is not None
        mine = [c for c in self.log if c.device == device]
        life = sum(c.weight for c in mine)
        assert to_micro(shown.epsilon_lifetime) == life
        today = sum(c.weight for c in mine if c.day == self.day and c.day > self.horizon)
        assert to_micro(shown.epsilon_today) == today


def _run(server: str, examples: int) -> None:
    machine: Any = type("Machine", (DeviceMachine,), {"server": server})
    machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=40,
        derandomize=True,  # the same sequences every run: the coverage check below is stable
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()


def test_the_gate_agrees_with_the_device_budget_model_on_sqlite() -> None:
    SEEN.clear()
    _run("", 60)
    # the runs reached device-wide refusals; which kinds depends on the sequences drawn, so
    # each kind of refusal has its own focused test below
    assert {who for who, _ in SEEN} & {"device", "quota"}, SEEN
    assert {("device", "window_filter"), ("device", "lifetime_filter")} <= SEEN, SEEN


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_the_gate_agrees_with_the_device_budget_model_on_postgresql() -> None:
    assert PG_URL is not None
    _run(PG_URL, 5)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'l.sqlite'}")
    init_db(engine)
    led = Ledger(engine, SECRET)
    for name in NAMES:
        led.policies.create(_policy(name))
    return led


NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def test_each_refusal_names_the_budget_that_refused(ledger: Ledger) -> None:
    ledger.policies.create(_policy("capped", lifetime_epsilon_cap=1.0))
    assert ledger.charge("x", "capped", now=NOW).accepted
    own = ledger.charge("x", "capped", now=NOW)
    assert (own.refused_by, own.reason, own.retry_at) == ("use_case", "lifetime_cap", None)
    for _ in range(MAX_PER_DAY):
        assert ledger.charge("x", "b", now=NOW).accepted
    group = ledger.charge("x", "b", now=NOW)
    assert (group.refused_by, group.reason) == ("group", "daily_cap")
    write_device_budget(
        ledger.engine, DeviceBudgetCreate(epsilon_per_day=3.0, quotas={"a": 0.5})
    )  # spent today: 1.0 (capped) + 1.5 (b) = 2.5
    quota = ledger.charge("y", "a", now=NOW)
    assert quota.accepted
    quota = ledger.charge("y", "a", now=NOW)  # a's share is 1.5: a second 1.0 exceeds it
    assert (quota.refused_by, quota.reason, quota.retry_at) == (
        "quota",
        "daily_cap",
        day_start(utc_day(NOW) + 1),
    )
    device = ledger.charge("x", "a", now=NOW)  # 2.5 + 1.0 > 3.0
    assert (device.refused_by, device.reason) == ("device", "daily_cap")
    assert ledger.charge("x", "c", now=NOW).accepted  # 2.5 + 0.25 x group 2 = 3.0: fits
    full = ledger.charge("x", "c", now=NOW)
    assert (full.refused_by, full.retry_at) == ("device", day_start(utc_day(NOW) + 1))
    assert ledger.charge("x", "c", now=NOW + timedelta(days=1)).accepted


def test_a_quota_keeps_budget_for_the_other_use_cases(ledger: Ledger) -> None:
    write_device_budget(ledger.engine, DeviceBudgetCreate(lifetime_epsilon=4.0, quotas={"a": 0.5}))
    now = NOW
    taken = 0
    for _ in range(10):
        if ledger.charge("dev", "a", now=now).accepted:
            taken += 1
        now += timedelta(days=1)
    assert taken == 2  # half of 4.0 at 1.0 a report
    others = sum(ledger.charge("dev", "b", now=now + timedelta(days=i)).accepted for i in range(8))
    assert others == 4  # the other half, at 0.5 a report
    shown = ledger.device_wide("dev", now=now)
    assert shown is not None and shown.lifetime_remaining == 0.0
    line = next(q for q in shown.use_cases if q.use_case == "a")
    assert (line.share, line.epsilon_lifetime, line.lifetime_remaining) == (0.5, 2.0, 0.0)


def test_tightening_never_frees_and_loosening_applies(ledger: Ledger) -> None:
    write_device_budget(ledger.engine, DeviceBudgetCreate(lifetime_epsilon=3.0))
    for i in range(3):
        assert ledger.charge("dev", "a", now=NOW + timedelta(days=i)).accepted
    later = NOW + timedelta(days=5)
    assert ledger.charge("dev", "a", now=later).refused_by == "device"
    write_device_budget(ledger.engine, DeviceBudgetCreate(lifetime_epsilon=2.0))
    assert ledger.charge("dev", "c", now=later).refused_by == "device"
    ledger.purge(now=later + timedelta(days=30))  # lifetime carries no dates
    assert ledger.charge("dev", "c", now=later + timedelta(days=30)).refused_by == "device"
    write_device_budget(ledger.engine, DeviceBudgetCreate(lifetime_epsilon=4.0))
    assert ledger.charge("dev", "a", now=later + timedelta(days=30)).accepted
    assert loosening(
        DeviceBudgetCreate(lifetime_epsilon=2.0, quotas={"a": 0.5}),
        DeviceBudgetCreate(lifetime_epsilon=4.0),
    ) == ["device_budget.lifetime_epsilon 2.0 -> 4.0", "device_budget.quotas.a 0.5 -> None"]


def test_the_purge_keeps_the_days_a_device_window_counts(ledger: Ledger) -> None:
    write_device_budget(ledger.engine, DeviceBudgetCreate(window_days=10, window_epsilon=2.0))
    assert ledger.charge("dev", "a", now=NOW).accepted
    assert ledger.charge("dev", "a", now=NOW + timedelta(days=1)).accepted
    ledger.purge(now=NOW + timedelta(days=6))  # past the use case's retention of 3 days
    refused = ledger.charge("dev", "a", now=NOW + timedelta(days=6))
    assert (refused.refused_by, refused.reason) == ("device", "window_cap")
    assert refused.retry_at == day_start(utc_day(NOW) + 10)
    assert ledger.charge("dev", "a", now=NOW + timedelta(days=10)).accepted


def test_the_policy_file_holds_the_device_budget(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "policies: []\ndevice_budget:\n  epsilon_per_day: 2.0\n  lifetime_epsilon: 50.0\n"
        "  quotas: {emoji: 0.5}\n"
    )
    assert load_device_budget(path) == DeviceBudgetCreate(
        epsilon_per_day=2.0, lifetime_epsilon=50.0, quotas={"emoji": 0.5}
    )
    path.write_text("policies: []\ndevice_budget:\n  window_days: 3\n")
    with pytest.raises(PolicyFileError, match="window_days"):
        load_device_budget(path)
    path.write_text("policies: []\ndevice_budget:\n  epsilon_per_day: 1.0\n  quotas: {a: 2}\n")
    with pytest.raises(PolicyFileError, match="quotas"):
        load_device_budget(path)


def test_what_if_decides_a_proposed_device_budget_through_the_rule(ledger: Ledger) -> None:
    from dp_governor.budget.reporting.views import what_if_device_budget

    for device in ("p", "q"):
        assert ledger.charge(device, "a", now=NOW).accepted
    assert ledger.charge("q", "b", now=NOW).accepted
    found = what_if_device_budget(
        ledger, DeviceBudgetCreate(epsilon_per_day=1.5, quotas={"b": 0.25}), now=NOW
    )
    assert found["a"] == {"current": {}, "proposed": {"device": 2}}  # 1.0 (+0.5) + 1.0 > 1.5
    # p: 1.0 + 0.5 fits the day, but not b's quota of 0.375; q: 1.5 + 0.5 > 1.5
    assert found["b"] == {"current": {}, "proposed": {"device": 1, "quota": 1}}
    assert found["c"] == {"current": {}, "proposed": {"device": 1}}  # 0.25 x 2 fits p only


def test_a_window_quota_frees_when_its_days_leave_the_window(ledger: Ledger) -> None:
    write_device_budget(
        ledger.engine,
        DeviceBudgetCreate(window_days=3, window_epsilon=4.0, quotas={"a": 0.5}),
    )
    assert ledger.charge("dev", "a", now=NOW).accepted
    assert ledger.charge("dev", "a", now=NOW + timedelta(days=1)).accepted
    refused = ledger.charge("dev", "a", now=NOW + timedelta(days=2))
    assert (refused.refused_by, refused.reason) == ("quota", "window_cap")
    assert refused.retry_at == day_start(utc_day(NOW) + 3) and refused.window_remaining == 0.0
    assert ledger.charge("dev", "b", now=NOW + timedelta(days=2)).accepted  # others still fit
    assert ledger.charge("dev", "a", now=NOW + timedelta(days=3)).accepted


def test_the_device_odometer_reads_the_rows_totals(ledger: Ledger) -> None:
    from dp_governor.budget.privacy.odometer import OdometerState, charge, running_epsilon

    ledger.policies.create(_policy("small", epsilon_per_report=0.05, max_reports_per_day=1000))
    expected = OdometerState()
    for _ in range(141):
        assert ledger.charge("dev", "small", now=NOW).accepted
        expected = charge(expected, 0.05)
    assert ledger.charge("dev", "c", now=NOW).accepted  # 0.25 at group size 2 counts 0.5
    expected = charge(expected, 0.5)
    shown = ledger.device_odometer("dev")
    assert shown.reports == 142 and shown.basic_epsilon == pytest.approx(7.55, abs=1e-12)
    assert shown.odometer_epsilon == running_epsilon(expected, 1e-9)
    assert shown.odometer_epsilon < shown.basic_epsilon  # many small reports: below the sum


def _filter_ledger(tmp: Path) -> Ledger:
    engine = create_db_engine(f"sqlite:///{tmp / 'f.sqlite'}")
    init_db(engine)
    led = Ledger(engine, SECRET)
    for name, eps, group in (("tiny", 0.01, 1), ("small", 0.05, 1), ("mid", 0.1, 2)):
        led.policies.create(
            _policy(name, epsilon_per_report=eps, max_reports_per_day=1000, group_size=group)
        )
    return led


WEIGHT = {"tiny": 0.01, "small": 0.05, "mid": 0.2}  # epsilon x group size


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), target=st.sampled_from([(1.0, 1e-6), (2.0, 1e-9), (0.5, 1e-3)]))
def test_the_filter_admits_exactly_what_the_theorem_allows(data: Any, target: Any) -> None:
    from dp_governor.budget.privacy.odometer import OdometerState, Target, admit_either, charge

    tmp = Path(tempfile.mkdtemp())
    led = _filter_ledger(tmp)
    try:
        write_device_budget(
            led.engine,
            DeviceBudgetCreate(lifetime_filter_epsilon=target[0], lifetime_filter_delta=target[1]),
        )
        goal = Target(*target)
        admitted = OdometerState()
        refused_last = False
        for _ in range(data.draw(st.integers(5, 80))):
            # adaptive: after a refusal the analyst tends to ask for less
            names = ["tiny", "small"] if refused_last else ["tiny", "small", "mid"]
            name = data.draw(st.sampled_from(names))
            want = admit_either(admitted, WEIGHT[name], goal)
            got = led.charge("dev", name, now=NOW)
            assert got.accepted == want
            if got.accepted:
                admitted = charge(admitted, WEIGHT[name])
            else:
                assert (got.refused_by, got.reason, got.retry_at) == (
                    "device",
                    "lifetime_filter",
                    None,
                )
            refused_last = not got.accepted
    finally:
        led.engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_filter_admits_more_small_reports_than_a_basic_cap(tmp_path: Path) -> None:
    led = _filter_ledger(tmp_path)
    write_device_budget(
        led.engine, DeviceBudgetCreate(lifetime_filter_epsilon=4.0, lifetime_filter_delta=1e-9)
    )
    filtered = sum(led.charge("a", "small", now=NOW).accepted for _ in range(200))
    write_device_budget(led.engine, DeviceBudgetCreate(lifetime_epsilon=4.0))
    basic = sum(led.charge("b", "small", now=NOW).accepted for _ in range(200))
    assert (filtered, basic) == (141, 80)  # docs/odometer.md: the same (4, 1e-9) target


def test_the_device_view_names_the_filter_target(ledger: Ledger) -> None:
    write_device_budget(
        ledger.engine, DeviceBudgetCreate(lifetime_filter_epsilon=4.0, lifetime_filter_delta=1e-9)
    )
    shown = ledger.device_wide("dev", now=NOW)
    assert shown is not None and (shown.lifetime_filter_epsilon, shown.lifetime_filter_delta) == (
        4.0,
        1e-9,
    )
    with pytest.raises(ValueError, match="lifetime_filter_delta"):
        DeviceBudgetCreate(lifetime_filter_epsilon=4.0)


def test_a_window_filter_needs_its_window_and_loosening_names_each_target() -> None:
    with pytest.raises(ValueError, match="`window_days` is required"):
        DeviceBudgetCreate(window_filter_epsilon=4.0, window_filter_delta=1e-9)
    with pytest.raises(ValueError, match="`window_days` needs"):
        DeviceBudgetCreate(window_days=3)
    with pytest.raises(ValueError, match="window_filter_delta"):
        DeviceBudgetCreate(window_days=3, window_filter_epsilon=4.0, window_filter_delta=1.0)
    old = DeviceBudgetCreate(
        window_days=3,
        window_filter_epsilon=4.0,
        window_filter_delta=1e-9,
        lifetime_filter_epsilon=40.0,
        lifetime_filter_delta=1e-9,
    )
    new = DeviceBudgetCreate(window_days=3, window_filter_epsilon=3.0, window_filter_delta=1e-6)
    assert loosening(old, new) == [
        "device_budget.window_filter_delta 1e-09 -> 1e-06",
        "device_budget.lifetime_filter_epsilon 40.0 -> None",
        "device_budget.lifetime_filter_delta 1e-09 -> None",
    ]
