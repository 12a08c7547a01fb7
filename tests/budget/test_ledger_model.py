"""The ledger against a reference model computed from the raw charge log alone.

A Hypothesis state machine interleaves charges, days passing, purges and every kind of policy
edit (epsilon, caps, filter targets, group moves in and out, retention down and up, group size,
retire and re-create), on SQLite and on PostgreSQL. The model keeps only the list of accepted
charges (device, use case, day, epsilon, group size), the policies as edited and the purge's
horizons, and recomputes every answer from them (the filters' from the theorem's condition,
:func:`tests.budget.filter_theorem.theorem_admits`): the gate's decisions, ``status``,
``device_loss``, the effective-epsilon report and its recomputation from an export all agree
with it, and no population lifetime figure ever decreases.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from sqlalchemy import Engine

from budget import Ledger, PolicyConflict, UnknownUseCase, create_db_engine, init_db, utc_day
from budget.reporting.export import export_ledger, read_export, report_from_export
from budget.reporting.loss import device_loss, effective_epsilon
from budget.storage.db import scratch_schema
from policies import PolicyCreate, PolicyUpdate
from policies.model import to_micro
from policies.repository import GROUP_FIELDS
from tests.budget.filter_theorem import theorem_admits
from tests.conftest import PG_URL

SECRET = b"model-secret-model-secret-model-secret"
NAMES = ("a", "b", "c")
DEVICES = ("d1", "d2", "d3")
NONE = -(10**9)


@dataclass(frozen=True)
class Charged:
    """One accepted charge, as the model records it."""

    device: str
    use_case: str
    day: int
    eps: int  # micro-epsilon per report
    group: int


def _fields(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "mechanism": "cms",
        "k": 4,
        "m": 8,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 2,
        "retention_days": 4,
        "window_epsilon_cap": None,
        "lifetime_epsilon_cap": None,
        "window_filter_epsilon": None,
        "window_filter_delta": None,
        "lifetime_filter_epsilon": None,
        "lifetime_filter_delta": None,
        "group_size": 1,
        "budget_group": None,
    }


class LedgerMachine(RuleBasedStateMachine):
    """One ledger and its model; ``server`` (a PostgreSQL URL) is set by the test, or SQLite."""

    server: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.stack = ExitStack()
        url = f"sqlite:///{self.dir / 'model.sqlite'}"
        if self.server:  # a fresh schema per example
            url = self.stack.enter_context(scratch_schema(self.server, "model"))
        self.engine: Engine = create_db_engine(url)
        init_db(self.engine)
        self.ledger = Ledger(self.engine, SECRET)
        self.now = datetime(2026, 1, 1, 20, tzinfo=UTC)
        self.log: list[Charged] = []
        self.policies: dict[str, dict[str, Any]] = {}  # latest fields of every name ever
        self.active: dict[str, bool] = {}
        self.longest: dict[str, int] = {}
        self.horizons: dict[str, int] = {}
        self.population_lifetime = (0, 0.0)  # devices, max: never decrease
        for name in NAMES:
            self._write(name, _fields(name), create=True)

    def teardown(self) -> None:
        self.engine.dispose()
        self.stack.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ------------------------------------------------------------------------------

    @property
    def day(self) -> int:
        return utc_day(self.now)

    def _budget(self, name: str) -> str:
        return str(self.policies[name]["budget_group"] or name)

    def _members(self, budget: str) -> set[str]:
        return {n for n in self.policies if self._budget(n) == budget}

    def _held(self, c: Charged) -> bool:
        return c.day > self.horizons.get(c.use_case, NONE)

    def _spend(self, device: str, members: set[str], day: int, retention: int) -> tuple[int, ...]:
        """Reports today, micro-epsilon today, in the window and over the lifetime."""
        mine = [c for c in self.log if c.device == device and c.use_case in members]
        today = [c.eps for c in mine if c.day == day]
        window = sum(c.eps for c in mine if day - retention < c.day <= day and self._held(c))
        return len(today), sum(today), window, sum(c.eps for c in mine)

    def _expected(self, device: str, name: str) -> str | None:
        """The reason the gate must give (``None``: a filter's boundary, either answer)."""
        p = self.policies[name]
        eps = to_micro(p["epsilon_per_report"])
        members = self._members(self._budget(name))
        reports, _, window, life = self._spend(device, members, self.day, p["retention_days"])
        if reports >= p["max_reports_per_day"]:
            return "daily_cap"
        if p["window_epsilon_cap"] is not None and window + eps > to_micro(p["window_epsilon_cap"]):
            return "window_cap"
        if p["lifetime_epsilon_cap"] is not None and life + eps > to_micro(
            p["lifetime_epsilon_cap"]
        ):
            return "lifetime_cap"
        mine = [c for c in self.log if c.device == device and c.use_case in members]
        recent = [c for c in mine if self.day - p["retention_days"] < c.day and self._held(c)]
        for kind, counted in (("window", recent), ("lifetime", mine)):
            target, delta = p[f"{kind}_filter_epsilon"], p[f"{kind}_filter_delta"]
            if target is None:
                continue
            weights = [c.eps * c.group for c in counted] + [eps * p["group_size"]]
            verdict = theorem_admits(weights, target, delta)
            if not verdict:
                return None if verdict is None else f"{kind}_filter"
        return "accepted"

    def _write(self, name: str, fields: dict[str, Any], *, create: bool = False) -> None:
        """Store a version through the ledger; the model follows only what was stored."""
        try:
            if create:
                self.ledger.policies.create(PolicyCreate.model_validate(fields))
            else:
                change = {k: v for k, v in fields.items() if k != "name"}
                self.ledger.policies.update(name, PolicyUpdate.model_validate(change))
        except (PolicyConflict, ValueError):
            return  # a group's members would disagree, or a filter below a report: not stored
        self.policies[name] = dict(fields)
        self.active[name] = True
        self.longest[name] = max(self.longest.get(name, 0), fields["retention_days"])

    def _edit(self, name: str, **change: Any) -> None:
        if self.active.get(name):
            self._write(name, {**self.policies[name], **change})

    # -- rules ----------------------------------------------------------------------------------

    @rule(device=st.sampled_from(DEVICES), name=st.sampled_from(NAMES))
    def charge(self, device: str, name: str) -> None:
        if not self.active[name]:
            with pytest.raises(UnknownUseCase):
                self.ledger.charge(device, name, now=self.now)
            return
        expected = self._expected(device, name)
        decision = self.ledger.charge(device, name, now=self.now)
        if expected is None:
            assert decision.reason in ("accepted", "window_filter", "lifetime_filter")
        else:
            assert decision.reason == expected
        if decision.accepted:
            p = self.policies[name]
            eps = to_micro(p["epsilon_per_report"])
            self.log.append(Charged(device, name, self.day, eps, p["group_size"]))

    @rule(days=st.integers(1, 4))
    def advance(self, days: int) -> None:
        self.now += timedelta(days=days)

    @rule()
    def purge(self) -> None:
        self.ledger.purge(now=self.now)
        for name, longest in self.longest.items():
            self.horizons[name] = max(self.horizons.get(name, NONE), self.day - longest)

    @rule(name=st.sampled_from(NAMES), eps=st.sampled_from([0.5, 1.0, 2.0]))
    def set_epsilon(self, name: str, eps: float) -> None:
        self._edit(name, epsilon_per_report=eps)

    @rule(
        name=st.sampled_from(NAMES),
        window=st.sampled_from([None, 3.0, 5.0]),
        lifetime=st.sampled_from([None, 6.0, 9.0]),
    )
    def set_caps(self, name: str, window: float | None, lifetime: float | None) -> None:
        self._edit(name, window_epsilon_cap=window, lifetime_epsilon_cap=lifetime)

    @rule(
        name=st.sampled_from(NAMES),
        window=st.sampled_from([None, (3.0, 1e-6), (6.0, 0.05)]),
        lifetime=st.sampled_from([None, (6.0, 1e-9), (9.0, 1e-3)]),
    )
    def set_filters(
        self,
        name: str,
        window: tuple[float, float] | None,
        lifetime: tuple[float, float] | None,
    ) -> None:
        w, life = window or (None, None), lifetime or (None, None)
        self._edit(
            name,
            window_filter_epsilon=w[0],
            window_filter_delta=w[1],
            lifetime_filter_epsilon=life[0],
            lifetime_filter_delta=life[1],
        )

    @rule(name=st.sampled_from(NAMES), retention=st.sampled_from([2, 7]))
    def set_retention(self, name: str, retention: int) -> None:
        self._edit(name, retention_days=retention)

    @rule(name=st.sampled_from(NAMES), size=st.sampled_from([1, 3]))
    def set_group_size(self, name: str, size: int) -> None:
        self._edit(name, group_size=size)

    @rule(name=st.sampled_from(NAMES), group=st.sampled_from(["g", "h"]))
    def join_group(self, name: str, group: str) -> None:
        """Move into a group, taking on its shared terms (those of a current member)."""
        shared: dict[str, Any] = {}
        for other, p in self.policies.items():
            if other != name and self.active[other] and p["budget_group"] == group:
                shared = {f: p[f] for f in GROUP_FIELDS}
        self._edit(name, budget_group=group, **shared)

    @rule(name=st.sampled_from(NAMES))
    def leave_group(self, name: str) -> None:
        self._edit(name, budget_group=None)

    @rule(name=st.sampled_from(NAMES))
    def retire(self, name: str) -> None:
        if self.active[name]:
            self.ledger.policies.delete(name)
            self.active[name] = False

    @rule(name=st.sampled_from(NAMES))
    def recreate(self, name: str) -> None:
        if not self.active[name]:
            self._write(name, self.policies[name], create=True)

    # -- what must agree --------------------------------------------------------------------------

    @rule()
    def status_agrees(self) -> None:
        for device in DEVICES:
            for s in self.ledger.status(device, now=self.now):
                p = self.policies[s.use_case]
                assert s.budget == self._budget(s.use_case)
                reports, today, window, life = self._spend(
                    device, self._members(s.budget), self.day, p["retention_days"]
                )
                assert (s.reports_today, to_micro(s.epsilon_today)) == (reports, today)
                assert to_micro(s.epsilon_window) == window
                assert to_micro(s.epsilon_lifetime) == life

    @rule()
    def device_loss_agrees(self) -> None:
        for device in DEVICES:
            loss = device_loss(self.ledger, device, now=self.now)
            window: dict[str, int] = defaultdict(int)
            lifetime: dict[str, int] = defaultdict(int)
            for c in self.log:
                if c.device != device:
                    continue
                lifetime[c.use_case] += c.eps * c.group
                keep = self.policies[c.use_case]["retention_days"]
                if self.day - keep < c.day <= self.day and self._held(c):
                    window[c.use_case] += c.eps * c.group
            assert {u: to_micro(round(v.epsilon_basic, 6)) for u, v in loss.lifetime.items()} == (
                dict(lifetime)
            )
            assert {u: to_micro(round(v.epsilon_basic, 6)) for u, v in loss.window.items()} == (
                {u: v for u, v in window.items() if v}
            )

    @rule()
    def report_agrees_with_its_export(self) -> None:
        live = effective_epsilon(self.ledger, now=self.now)
        path = self.dir / "ledger.jsonl"
        with path.open("w", encoding="utf-8") as out:
            export_ledger(self.ledger, out, fmt="jsonl", now=self.now)
        assert report_from_export(read_export(path)).to_dict() == live.to_dict()
        totals: dict[str, int] = defaultdict(int)
        for c in self.log:
            totals[c.device] += c.eps * c.group
        spread = live.totals.spent_lifetime
        assert spread.devices == len(totals)
        assert to_micro(round(spread.max, 6)) == max(totals.values(), default=0)
        devices, top = self.population_lifetime
        assert spread.devices >= devices and spread.max >= top  # never decreases
        self.population_lifetime = (spread.devices, spread.max)


def _run(server: str, examples: int) -> None:
    machine: Any = type("Machine", (LedgerMachine,), {"server": server})
    machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()


def test_the_ledger_agrees_with_its_model_on_sqlite() -> None:
    _run("", 50)


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_the_ledger_agrees_with_its_model_on_postgresql() -> None:
    assert PG_URL is not None
    _run(PG_URL, 6)
