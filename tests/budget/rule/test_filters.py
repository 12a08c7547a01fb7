"""The gate's privacy filters against the filter theorem, on random adaptive sequences.

Each run builds a real ledger (a SQLite file, or a PostgreSQL scratch schema), sets one filter,
per budget or device-wide, over a window or the lifetime, and lets an analyst send reports whose
epsilon (which use case) and timing depend on what the device released and on the refusals so
far. Every decision is compared with the theorem's condition evaluated on the admitted history
(:func:`tests.budget.privacy.filter_theorem.theorem_admits`, not the module's ``V*``), each refusal
with its name, the budget that refused and its retry day (found by trying each later day); then
every window of the filter's length is checked to hold only what the theorem admits
(docs/odometer.md, "Windows"). Focused tests pin the figures, the boundaries in integer micro units,
what-if, and the odometer against the raw charge log.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from dp_governor.budget import Ledger, create_db_engine, init_db, utc_day
from dp_governor.budget.clock import day_start
from dp_governor.budget.privacy.odometer import (
    OdometerState,
    Target,
    filter_cap_sq,
    running_epsilon,
)
from dp_governor.budget.reporting.views import device_timeline, what_if, what_if_device_budget
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.budget.storage.tables import Charge
from dp_governor.policies import Policy, PolicyCreate
from dp_governor.policies.device import DeviceBudgetCreate, write_device_budget
from dp_governor.policies.model import to_micro
from tests.budget.privacy.filter_theorem import theorem_admits
from tests.conftest import PG_URL

SECRET = b"filter-secret-filter-secret-filter-secret"
NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
USE_CASES = {"tiny": (0.01, 1), "small": (0.05, 1), "mid": (0.1, 2), "big": (0.5, 1)}
ORDER = list(USE_CASES)  # smallest group-scaled epsilon first
GROUP = ("tiny", "small", "mid")  # budget "g"; "big" draws from its own budget
WEIGHT = {name: to_micro(eps) * group for name, (eps, group) in USE_CASES.items()}
ANY = object()  # a retry day on the theorem's boundary: not compared


@dataclass(frozen=True)
class Setup:
    """One filter: ``scope`` budget (the group "g") or device, ``kind`` window or lifetime."""

    scope: str
    kind: str
    target: tuple[float, float]
    window: int

    def counts(self, name: str) -> bool:
        """Whether the filter counts (and checks) reports of ``name``."""
        return self.scope == "device" or name in GROUP

    def weights(self, admitted: list[tuple[int, str]], end: int) -> list[int]:
        """The group-scaled micro-epsilons it counts for a report on day ``end``."""
        return [
            WEIGHT[n]
            for d, n in admitted
            if self.counts(n) and (self.kind == "lifetime" or end - self.window < d <= end)
        ]


def _policy(name: str, *, setup: Setup | None = None, **extra: Any) -> PolicyCreate:
    eps, group = USE_CASES.get(name, (0.05, 1))
    fields: dict[str, Any] = {
        "name": name,
        "mechanism": "cms",
        "k": 4,
        "m": 8,
        "epsilon_per_report": eps,
        "max_reports_per_day": 1000,
        "retention_days": 7,
        "group_size": group,
    }
    if setup is not None and name in GROUP:
        fields["budget_group"] = "g"
        if setup.scope == "budget":
            fields["retention_days"] = setup.window
            fields[f"{setup.kind}_filter_epsilon"] = setup.target[0]
            fields[f"{setup.kind}_filter_delta"] = setup.target[1]
    fields.update(extra)
    return PolicyCreate.model_validate(fields)


@contextmanager
def _ledger(server: str | None = None) -> Iterator[Ledger]:
    """A fresh ledger: a SQLite file, or a scratch schema on ``server``; dropped afterwards."""
    with ExitStack() as stack:
        if server:
            url = stack.enter_context(scratch_schema(server, "filters"))
        else:
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/f.sqlite"
        engine = create_db_engine(url)
        stack.callback(engine.dispose)
        init_db(engine)
        yield Ledger(engine, SECRET)


def _install(ledger: Ledger, setup: Setup) -> None:
    for name in USE_CASES:
        ledger.policies.create(_policy(name, setup=setup), allow_loosen=True)
    if setup.scope == "device":
        eps, delta = setup.target
        body: dict[str, Any] = {f"{setup.kind}_filter_epsilon": eps}
        body[f"{setup.kind}_filter_delta"] = delta
        if setup.kind == "window":
            body["window_days"] = setup.window
        write_device_budget(ledger.engine, DeviceBudgetCreate(**body))


def _expected(setup: Setup, admitted: list[tuple[int, str]], name: str, day: int) -> Any:
    """``(verdict, retry day)`` by the theorem; verdict ``None``: on its boundary."""
    if not setup.counts(name):
        return True, None
    w = WEIGHT[name]
    verdict = theorem_admits([*setup.weights(admitted, day), w], *setup.target)
    if verdict is not False or setup.kind == "lifetime" or not theorem_admits([w], *setup.target):
        return verdict, None
    # the first later day the report fits, as reports leave the window (all have by day + window)
    for later in range(day + 1, day + setup.window + 1):
        fits = theorem_admits([*setup.weights(admitted, later), w], *setup.target)
        if fits is not False:
            return False, later if fits else ANY
    raise AssertionError("a report that fits alone must fit once the window is empty")


def _adaptive_run(data: Any, setup: Setup, server: str | None) -> None:
    """The analyst's run against the gate, each decision checked against the theorem."""
    with _ledger(server) as ledger:
        _install(ledger, setup)
        now, last, refused, released_one = NOW, "small", False, True
        admitted: list[tuple[int, str]] = []
        for _ in range(data.draw(st.integers(10, 60), label="reports")):
            # after a refusal: wait longer and ask for less; after a released 1 ask for more
            waits = [0, 0, 1, 2] if refused else [0, 0, 0, 0, 1]
            now += timedelta(days=data.draw(st.sampled_from(waits), label="days waited"))
            i = ORDER.index(last)
            ask = ORDER[max(0, i - 1) : i + 1] if refused or not released_one else ORDER[i : i + 2]
            name = data.draw(st.sampled_from(ask), label="use case")
            day = utc_day(now)
            verdict, retry = _expected(setup, admitted, name, day)
            got = ledger.charge("dev", name, now=now)
            if verdict is None:
                assert got.accepted or got.reason == f"{setup.kind}_filter", got
            else:
                assert got.accepted == verdict, (got, setup, admitted)
            if not got.accepted:
                by = "device" if setup.scope == "device" else "group"
                assert (got.reason, got.refused_by) == (f"{setup.kind}_filter", by), got
                if verdict is False and retry is not ANY:
                    assert got.retry_at == (None if retry is None else day_start(retry)), got
            else:
                admitted.append((day, name))
                eps = USE_CASES[name][0]
                noise = data.draw(st.floats(0.0, 1.0), label="randomized response")
                released_one = noise < math.exp(eps) / (1.0 + math.exp(eps))  # of a true 1
            refused, last = not got.accepted, name
        _every_window_is_admitted(setup, admitted)


def _every_window_is_admitted(setup: Setup, admitted: list[tuple[int, str]]) -> None:
    """Every window of the filter's length (the lifetime: everything) holds what it admits."""
    days = [d for d, _ in admitted]
    if not days:
        return
    ends = range(min(days), max(days) + setup.window) if setup.kind == "window" else [max(days)]
    for end in ends:
        weights = setup.weights(admitted, end)
        assert not weights or theorem_admits(weights, *setup.target) is not False, (end, setup)


setups = st.builds(
    Setup,
    scope=st.sampled_from(["budget", "device"]),
    kind=st.sampled_from(["window", "lifetime"]),
    target=st.sampled_from([(1.0, 1e-6), (2.0, 1e-9), (0.5, 1e-3), (4.0, 0.05)]),
    window=st.integers(1, 4),
)


@pytest.mark.parametrize("scope", ["budget", "device"])
@pytest.mark.parametrize("kind", ["window", "lifetime"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), setup=setups)
def test_the_gate_admits_what_the_theorem_allows_on_sqlite(
    data: Any, setup: Setup, scope: str, kind: str
) -> None:
    _adaptive_run(data, Setup(scope, kind, setup.target, setup.window), None)


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), setup=setups)
def test_the_gate_admits_what_the_theorem_allows_on_postgresql(data: Any, setup: Setup) -> None:
    _adaptive_run(data, setup, PG_URL)


def test_a_budget_filter_admits_more_small_reports_than_a_basic_cap() -> None:
    with _ledger() as ledger:
        limits: dict[str, dict[str, Any]] = {
            "filtered": {"lifetime_filter_epsilon": 4.0, "lifetime_filter_delta": 1e-9},
            "windowed": {"window_filter_epsilon": 4.0, "window_filter_delta": 1e-9},
            "capped": {"lifetime_epsilon_cap": 4.0},
        }
        for name, extra in limits.items():
            ledger.policies.create(_policy(name, retention_days=3, **extra), allow_loosen=True)
        counts = {
            name: sum(ledger.charge("dev", name, now=NOW).accepted for _ in range(200))
            for name in ("filtered", "windowed", "capped")
        }
        assert counts == {"filtered": 141, "windowed": 141, "capped": 80}  # docs/odometer.md
        refused = ledger.charge("dev", "windowed", now=NOW + timedelta(days=2))
        assert (refused.reason, refused.refused_by) == ("window_filter", "use_case")
        assert refused.retry_at == day_start(utc_day(NOW) + 3)  # when day 0 leaves the window
        later = NOW + timedelta(days=3)
        assert sum(ledger.charge("dev", "windowed", now=later).accepted for _ in range(200)) == 141
        again = ledger.charge("dev", "filtered", now=later)
        assert (again.reason, again.retry_at) == ("lifetime_filter", None)


def test_a_window_filter_frees_when_enough_leaves_the_window() -> None:
    with _ledger() as ledger:
        ledger.policies.create(
            _policy(
                "q",
                epsilon_per_report=0.25,
                retention_days=3,
                window_filter_epsilon=1.0,
                window_filter_delta=1e-9,
            ),
            allow_loosen=True,
        )
        for day in (0, 1):  # 0.5 a day: the basic sum reaches 1.0 exactly (S2 is far over V*)
            for _ in range(2):
                assert ledger.charge("dev", "q", now=NOW + timedelta(days=day)).accepted
        refused = ledger.charge("dev", "q", now=NOW + timedelta(days=1))
        assert (refused.reason, refused.retry_at) == ("window_filter", day_start(utc_day(NOW) + 3))
        assert not ledger.charge("dev", "q", now=NOW + timedelta(days=2)).accepted
        assert ledger.charge("dev", "q", now=NOW + timedelta(days=3)).accepted


def test_the_basic_branch_is_exact_in_micro_units() -> None:
    # (1, 1e-9): V* is about 0.0236, below one report's 0.0625, so only the basic sum admits
    with _ledger() as ledger:
        for name, eps in (("exact", 0.25), ("over", 0.250001)):
            ledger.policies.create(
                _policy(
                    name,
                    epsilon_per_report=eps,
                    lifetime_filter_epsilon=1.0,
                    lifetime_filter_delta=1e-9,
                ),
                allow_loosen=True,
            )
        exact = sum(ledger.charge("dev", "exact", now=NOW).accepted for _ in range(10))
        over = sum(ledger.charge("dev", "over", now=NOW).accepted for _ in range(10))
        assert (exact, over) == (4, 3)  # 4 x 0.25 = 1.0 admitted; 4 x 0.250001 is 4 micro over


def _four_squares(r: int) -> list[int]:
    """Four positive integers whose squares sum to ``r`` (Lagrange: one exists for most r)."""

    def split(rest: int, parts: int) -> list[int] | None:
        if parts == 1:
            root = math.isqrt(rest)
            return [root] if root > 0 and root * root == rest else None
        top = math.isqrt(rest - (parts - 1))
        for a in range(top, max(0, top - 300), -1):
            found = split(rest - a * a, parts - 1)
            if found is not None:
                return [a, *found]
        return None

    found = split(r, 4)
    assert found is not None
    return found


def test_the_sum_of_squares_branch_is_exact_in_micro_units() -> None:
    target = Target(4.0, 1e-9)
    cap = filter_cap_sq(target)  # V* in micro-epsilon squared, rounded down
    *parts, last = _four_squares(cap - 141 * 50_000**2)
    with _ledger() as ledger:
        eps = {"small": 50_000, "p0": parts[0], "p1": parts[1], "p2": parts[2]}
        eps |= {"last": last, "next": last + 1}
        for name, micro in eps.items():
            ledger.policies.create(
                _policy(name, epsilon_per_report=micro / 1_000_000), allow_loosen=True
            )
        write_device_budget(
            ledger.engine,
            DeviceBudgetCreate(lifetime_filter_epsilon=4.0, lifetime_filter_delta=1e-9),
        )
        for _ in range(141):
            assert ledger.charge("a", "small", now=NOW).accepted
            assert ledger.charge("b", "small", now=NOW).accepted
        for name in ("p0", "p1", "p2"):
            assert ledger.charge("a", name, now=NOW).accepted
            assert ledger.charge("b", name, now=NOW).accepted
        # S2 = V* exactly with `last` (admitted), one micro-epsilon^2-unit over with `next`
        assert ledger.charge("a", "last", now=NOW).accepted
        refused = ledger.charge("b", "next", now=NOW)
        assert (refused.reason, refused.refused_by) == ("lifetime_filter", "device")
        assert not ledger.charge("a", "p0", now=NOW).accepted  # nothing fits after V*


def test_a_purge_never_frees_a_lifetime_filter() -> None:
    with _ledger() as ledger:
        ledger.policies.create(
            _policy("s", retention_days=1, lifetime_filter_epsilon=1.0, lifetime_filter_delta=1e-9),
            allow_loosen=True,
        )
        taken = sum(ledger.charge("dev", "s", now=NOW).accepted for _ in range(100))
        assert taken == 20  # V* of (1, 1e-9) admits 9 reports of 0.05; the basic sum 20
        later = NOW + timedelta(days=30)
        ledger.purge(now=later)
        assert ledger.charge("dev", "s", now=later).reason == "lifetime_filter"


def test_what_if_decides_proposed_filters_through_the_rule() -> None:
    with _ledger() as ledger:
        ledger.policies.create(_policy("small"), allow_loosen=True)
        sent = {"p": 100, "q": 150, "r": 10}
        for device, n in sent.items():
            for _ in range(n):
                assert ledger.charge(device, "small", now=NOW).accepted
        # the theorem on each device's next report at (4, 1e-9): q's 151st is refused
        refused = sum(not theorem_admits([50_000] * (n + 1), 4.0, 1e-9) for n in sent.values())
        assert refused == 1
        proposed = _policy("small", lifetime_filter_epsilon=4.0, lifetime_filter_delta=1e-9)
        found = what_if(ledger, "small", proposed, now=NOW)
        assert found.refused_next_report_today == {"current": 0, "proposed": refused}
        body = DeviceBudgetCreate(
            window_days=2, window_filter_epsilon=4.0, window_filter_delta=1e-9
        )
        assert what_if_device_budget(ledger, body, now=NOW)["small"] == {
            "current": {},
            "proposed": {"device": refused},
        }


def test_the_odometer_equals_its_recomputation_from_the_charge_log() -> None:
    with _ledger() as ledger:
        for name in USE_CASES:
            ledger.policies.create(_policy(name), allow_loosen=True)
        now = NOW
        for i in range(400):  # mostly small reports, where the odometer is below the sum
            ledger.charge("dev", "big" if i in (7, 70) else ORDER[i % 2], now=now)
            if i == 30:  # a policy edit: later charges count at the new epsilon and group size
                ledger.policies.apply(
                    _policy("tiny", epsilon_per_report=0.02, group_size=3),
                    actor="test",
                    allow_loosen=True,
                )
                now += timedelta(days=1)
        with ledger.engine.connect() as conn:
            c = Charge.__table__.c  # type: ignore[attr-defined]
            charges = conn.execute(select(c.use_case, c.policy_version, c.epsilon_micro)).all()
        group = {(p.name, p.version): p.group_size for p in ledger.book().versions}
        weights = [int(e) * group[(str(u), int(v))] for u, v, e in charges]
        totals = OdometerState(len(weights), sum(weights), sum(w * w for w in weights))
        shown = ledger.device_odometer("dev")
        assert shown.reports == totals.count
        assert to_micro(round(shown.basic_epsilon, 6)) == totals.sum_eps
        assert shown.odometer_epsilon == running_epsilon(totals, shown.delta)
        assert shown.odometer_epsilon < shown.basic_epsilon
        audit = device_timeline(ledger, "dev", now=now)
        assert audit.odometer == shown  # the device audit shows it beside the fixed-schedule loss


def test_a_group_shares_its_filter_and_edits_never_free_it() -> None:
    setup = Setup("budget", "lifetime", (1.0, 1e-9), 7)
    with _ledger() as ledger:
        _install(ledger, setup)
        while ledger.charge("dev", "small", now=NOW).accepted:
            pass
        refused = ledger.charge("dev", "tiny", now=NOW)  # a member: the group's filter refused
        assert (refused.reason, refused.refused_by) == ("lifetime_filter", "group")
        assert ledger.charge("dev", "big", now=NOW).accepted  # outside the group
        current: Policy = ledger.policies.get("tiny")
        assert current.lifetime_filter_epsilon == 1.0
        left = _policy("tiny")  # leaving the group takes tiny's history along, no filter
        ledger.policies.apply(left, actor="test", allow_loosen=True)
        assert ledger.charge("dev", "tiny", now=NOW).accepted
        assert not ledger.charge("dev", "small", now=NOW).accepted  # small's history stays
