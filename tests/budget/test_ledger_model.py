"""The ledger against a reference model computed from the raw charge log alone.

A Hypothesis state machine interleaves charges, days passing, purges and every kind of policy
edit (epsilon, caps, filter targets, a group's shared terms, group moves in, out and back and
forth, a use case or a group taking another budget's name, retention down, up and past its
longest after a purge, group size, retire and re-create inside or outside its group), on SQLite
and on PostgreSQL. The model keeps only the list of accepted charges (device, use case, day,
epsilon, group size, the budget it was charged under), the policies as edited and the purge's
horizons, and recomputes every answer from them under the rule (docs/ledger.md): a budget's
caps count its members' whole history and every charge made under it; a window reaching back
past a horizon counts what it can no longer date. The gate's decisions, ``status``,
``device_loss``, the effective-epsilon report (whose every "bounds the loss at X" must be at
least what some device spent) and its recomputation from an export all agree with it; no
population lifetime figure ever decreases; a write the model says takes another budget's name,
or leaves a group's members disagreeing, is refused; and an edit written without
``allow_loosen`` admits no device's next report that the book before refused (unless the new
report costs less epsilon).
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
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import Engine

from dp_governor.budget import (
    Ledger,
    PolicyConflict,
    UnknownUseCase,
    create_db_engine,
    init_db,
    utc_day,
)
from dp_governor.budget.reporting.export import (
    export_ledger,
    read_export,
    recompute,
    report_from_export,
)
from dp_governor.budget.reporting.loss import device_loss, effective_epsilon
from dp_governor.budget.rule.decide import check
from dp_governor.budget.rule.state import AccountState
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.policies import PolicyCreate
from dp_governor.policies.errors import PolicyLoosens
from dp_governor.policies.model import GroupTerms, to_micro
from dp_governor.policies.repository import GROUP_FIELDS
from tests.budget.privacy.filter_theorem import theorem_admits
from tests.conftest import PG_URL

SECRET = b"model-secret-model-secret-model-secret"
NAMES = ("a", "b", "c")
GROUPS = ("g", "h")
DEVICES = ("d1", "d2")
NONE = -(10**9)


@dataclass(frozen=True)
class Charged:
    """One accepted charge, as the model records it."""

    device: str
    use_case: str
    day: int
    eps: int  # micro-epsilon per report
    group: int
    budget: str  # the budget it was charged under


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


class MembershipMachine(RuleBasedStateMachine):
    """One ledger and its model, edited by the operations that move spend between budgets.

    Charges, days passing with the daily purge, group moves, a group's shared terms, names
    taken and the report; :class:`LedgerMachine` adds every other edit. ``server`` (a
    PostgreSQL URL) is set by the test, or SQLite.
    """

    server: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.stack = ExitStack()
        url = f"sqlite:///{self.dir / 'model.sqlite'}"
        if self.server:  # a fresh schema per example
            url = self.stack.enter_context(scratch_schema(self.server, "model"))
        self.engine: Engine = create_db_engine(url, job_pause=0)  # no server shares it
        init_db(self.engine)
        self.ledger = Ledger(self.engine, SECRET)
        self.now = datetime(2026, 1, 1, 20, tzinfo=UTC)
        self.log: list[Charged] = []
        self.policies: dict[str, dict[str, Any]] = {}  # latest fields of every name ever
        self.active: dict[str, bool] = {}
        self.longest: dict[str, int] = {}
        self.ever: dict[str, set[str]] = defaultdict(set)  # budget -> use cases ever in it
        self.groups: set[str] = set()  # every group any version named
        self.horizons: dict[str, int] = {}
        self.population_lifetime = (0, 0.0)  # devices, max: never decrease
        for name in NAMES:  # a and b share group g from the start
            group = "g" if name in ("a", "b") else None
            self._write([{**_fields(name), "budget_group": group}], create=True)

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

    def _counted(self, device: str, budget: str) -> list[Charged]:
        """The charges a budget's caps count: its members' history, and what it charged."""
        members = self._members(budget)
        return [
            c
            for c in self.log
            if c.device == device and (c.use_case in members or c.budget == budget)
        ]

    def _held(self, c: Charged) -> bool:
        return c.day > self.horizons.get(c.use_case, NONE)

    def _in_window(self, c: Charged, day: int, retention: int) -> bool:
        """Held inside the window, or deleted where the window reaches past the horizon."""
        if self._held(c):
            return day - retention < c.day <= day
        return day - retention < self.horizons[c.use_case] <= day

    def _spend(self, counted: list[Charged], day: int, retention: int) -> tuple[int, ...]:
        """Reports today, micro-epsilon today, in the window and over the lifetime."""
        today = [c.eps for c in counted if c.day == day]
        window = sum(c.eps for c in counted if self._in_window(c, day, retention))
        return len(today), sum(today), window, sum(c.eps for c in counted)

    def _expected(self, device: str, name: str) -> str | None:
        """The reason the gate must give (``None``: a filter's boundary, either answer)."""
        p = self.policies[name]
        eps = to_micro(p["epsilon_per_report"])
        counted = self._counted(device, self._budget(name))
        reports, _, window, life = self._spend(counted, self.day, p["retention_days"])
        if reports >= p["max_reports_per_day"]:
            return "daily_cap"
        if p["window_epsilon_cap"] is not None and window + eps > to_micro(p["window_epsilon_cap"]):
            return "window_cap"
        if p["lifetime_epsilon_cap"] is not None and life + eps > to_micro(
            p["lifetime_epsilon_cap"]
        ):
            return "lifetime_cap"
        recent = [c for c in counted if self._in_window(c, self.day, p["retention_days"])]
        for kind, events in (("window", recent), ("lifetime", counted)):
            target, delta = p[f"{kind}_filter_epsilon"], p[f"{kind}_filter_delta"]
            if target is None:
                continue
            weights = [c.eps * c.group for c in events] + [eps * p["group_size"]]
            verdict = theorem_admits(weights, target, delta)
            if not verdict:
                return None if verdict is None else f"{kind}_filter"
        return "accepted"

    def _keep(self, name: str) -> int:
        """How long a use case's days are kept: the longest retention of any budget-mate ever."""
        mates = {n for members in self.ever.values() if name in members for n in members}
        return max(self.longest[n] for n in mates)

    def _conflict(self, fields: dict[str, Any]) -> bool:
        """Whether the model says a write of ``fields`` must be refused as a conflict.

        A group may not take a use case's name, nor a use case a group's (ever named); a
        group's active members share its terms.
        """
        group = fields["budget_group"]
        names = set(self.policies) | {fields["name"]}
        if group in names or fields["name"] in self.groups | {group} - {None}:
            return True
        if group is None:
            return False
        return any(
            self.active[other] and p["budget_group"] == group and p[f] != fields[f]
            for other, p in self.policies.items()
            if other != fields["name"]
            for f in GROUP_FIELDS
        )

    def _decisions(self) -> dict[tuple[str, str], tuple[bool, int]]:
        """Every (device, active use case)'s next report under the book now: admitted, epsilon."""
        book = self.ledger.book()
        out = {}
        for device in DEVICES:
            with self.engine.connect() as conn:
                state = self.ledger.state_of(conn, self.ledger.device_key(device))
            for name, terms in book.terms.items():
                decision = check(terms, self.day, state or AccountState())
                out[(device, name)] = (decision.accepted, terms.eps_micro)
        return out

    def _write(
        self,
        changes: list[dict[str, Any]],
        *,
        create: bool = False,
        allow_loosen: bool = True,
        group: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """Store versions through the ledger; the model follows only what was stored."""
        try:
            validated = [PolicyCreate.model_validate(f) for f in changes]
        except ValueError:
            return  # e.g. a filter below one report: not a policy
        conflict = group is None and any(self._conflict(f) for f in changes)
        before = self._decisions()
        try:
            if group is not None:
                self.ledger.policies.update_group(
                    group[0], GroupTerms.model_validate(group[1]), allow_loosen=allow_loosen
                )
            elif create:
                self.ledger.policies.create(validated[0], allow_loosen=allow_loosen)
            else:
                self.ledger.policies.write_all(validated, allow_loosen=allow_loosen)
        except PolicyLoosens:
            assert not allow_loosen
            return
        except PolicyConflict as exc:
            assert conflict or group is not None, exc
            return
        except ValueError:
            assert group is not None  # a member's terms that no longer validate
            return
        assert not conflict, f"a conflicting write was stored: {changes}"
        for fields in changes:
            name = fields["name"]
            self.policies[name] = dict(fields)
            self.active[name] = True
            self.longest[name] = max(self.longest.get(name, 0), fields["retention_days"])
            self.ever[self._budget(name)].add(name)
            if fields["budget_group"] is not None:
                self.groups.add(fields["budget_group"])
        if not allow_loosen:
            after = self._decisions()
            for key, (admitted, eps) in after.items():
                was = before.get(key)
                if admitted and was is not None and not was[0]:
                    assert eps < was[1], f"{key} admitted after a write that loosens nothing"

    def _edit(self, name: str, allow_loosen: bool = True, **change: Any) -> None:
        if self.active.get(name):
            self._write([{**self.policies[name], **change}], allow_loosen=allow_loosen)

    # -- rules ----------------------------------------------------------------------------------

    def _charge(self, device: str, name: str) -> None:
        if not self.active[name]:
            with pytest.raises(UnknownUseCase):
                self.ledger.charge(device, name, now=self.now)
            return
        expected = self._expected(device, name)
        decision = self.ledger.charge(device, name, now=self.now)
        if expected is None:
            assert decision.reason in ("accepted", "window_filter", "lifetime_filter")
        else:
            assert decision.reason == expected, (decision, expected)
        if decision.accepted:
            p = self.policies[name]
            eps = to_micro(p["epsilon_per_report"])
            self.log.append(
                Charged(device, name, self.day, eps, p["group_size"], self._budget(name))
            )

    @rule(days=st.integers(1, 6), purge=st.booleans())
    def advance(self, days: int, purge: bool) -> None:
        """Days pass; the daily purge runs, or not yet."""
        self.now += timedelta(days=days)
        if purge:
            self.purge()

    def purge(self) -> None:
        self.ledger.purge(now=self.now)
        for name in self.longest:
            keep = self._keep(name)
            self.horizons[name] = max(self.horizons.get(name, NONE), self.day - keep)

    @rule()
    def charge_everything(self) -> None:
        """Every device sends one report to every use case (spend accumulates fast)."""
        for device in DEVICES:
            for name in NAMES:
                self._charge(device, name)

    @rule(
        group=st.sampled_from(GROUPS),
        per_day=st.sampled_from([1, 2, 3]),
        window=st.sampled_from([None, 3.0]),
        lifetime=st.sampled_from([None, 4.0, 8.0]),
        retention=st.sampled_from([2, 4, 7]),
        loosen=st.booleans(),
    )
    def set_group_terms(
        self,
        group: str,
        per_day: int,
        window: float | None,
        lifetime: float | None,
        retention: int,
        loosen: bool,
    ) -> None:
        """A group's shared terms, for every member at once (tightened or loosened)."""
        members = [
            n for n, p in self.policies.items() if self.active[n] and p["budget_group"] == group
        ]
        if not members:
            return
        shared = {f: self.policies[members[0]][f] for f in GROUP_FIELDS}
        shared.update(
            max_reports_per_day=per_day,
            window_epsilon_cap=window,
            lifetime_epsilon_cap=lifetime,
            retention_days=retention,
        )
        changes = [{**self.policies[n], **shared} for n in members]
        try:
            for fields in changes:
                PolicyCreate.model_validate(fields)
        except ValueError:
            return
        self._write(changes, allow_loosen=loosen, group=(group, shared))

    @rule(
        name=st.sampled_from(NAMES),
        move=st.sampled_from(["g", "h", "leave", "retire", "recreate", "recreate outside"]),
        loosen=st.booleans(),
    )
    def membership(self, name: str, move: str, loosen: bool) -> None:
        """Join a group (taking its shared terms; back and forth), leave it, retire, re-create."""
        if move in GROUPS:
            shared: dict[str, Any] = {}
            for other, p in self.policies.items():
                if other != name and self.active[other] and p["budget_group"] == move:
                    shared = {f: p[f] for f in GROUP_FIELDS}
            self._edit(name, loosen, budget_group=move, **shared)
        elif move == "leave":
            self._edit(name, loosen, budget_group=None)
        elif move == "retire":
            if self.active[name]:
                self.ledger.policies.delete(name)
                self.active[name] = False
        elif not self.active[name]:
            fields = dict(self.policies[name])
            if move == "recreate outside":
                fields["budget_group"] = None
            self._write([fields], create=True)

    @rule(name=st.sampled_from(NAMES), other=st.sampled_from([*NAMES, *GROUPS]))
    def take_a_budgets_name(self, name: str, other: str) -> None:
        """A group named like a use case, or a new use case named like a group: refused."""
        if other in NAMES:
            self._edit(name, budget_group=other)
        elif other not in self.policies:
            self._write([{**_fields(other)}], create=True)

    # -- what must agree --------------------------------------------------------------------------

    @invariant()
    def status_agrees(self) -> None:
        for device in DEVICES:
            for s in self.ledger.status(device, now=self.now):
                p = self.policies[s.use_case]
                assert s.budget == self._budget(s.use_case)
                counted = self._counted(device, s.budget)
                reports, today, window, life = self._spend(counted, self.day, p["retention_days"])
                assert (s.reports_today, to_micro(s.epsilon_today)) == (reports, today)
                assert to_micro(s.epsilon_window) == window
                assert to_micro(s.epsilon_lifetime) == life

    @invariant()
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
                if self._in_window(c, self.day, keep):
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
        # streamed, split into buckets of a few records each: the same report
        assert recompute(path, bucket_bytes=600).to_dict() == live.to_dict()
        totals: dict[str, int] = defaultdict(int)
        for c in self.log:
            totals[c.device] += c.eps * c.group
        spread = live.totals.spent_lifetime
        assert spread.devices == len(totals)
        assert to_micro(round(spread.max, 6)) == max(totals.values(), default=0)
        devices, top = self.population_lifetime
        assert spread.devices >= devices and spread.max >= top  # never decreases
        self.population_lifetime = (spread.devices, spread.max)
        for line in live.use_cases:  # every statement holds against what devices spent
            spent = max(
                (sum(c.eps for c in self._counted(d, line.budget)) for d in DEVICES), default=0
            )
            if line.lifetime_bounded:
                assert line.lifetime_bound is not None
                assert to_micro(line.lifetime_bound) >= spent, line
                assert f"bounds the loss at {line.lifetime_bound:g}" in line.lifetime_note
            p = self.policies[line.use_case]
            if p["lifetime_epsilon_cap"] is None and p["lifetime_filter_epsilon"] is not None:
                # "every device within the filter" only if the raw log says so of every device
                verdicts = {
                    theorem_admits(
                        [c.eps * c.group for c in self._counted(d, line.budget)],
                        p["lifetime_filter_epsilon"],
                        p["lifetime_filter_delta"],
                    )
                    for d in DEVICES
                }
                if "every device's reports are within" in line.lifetime_note:
                    assert False not in verdicts, (line, verdicts)
                elif None not in verdicts:  # off the theorem's boundary: it must say so
                    assert False in verdicts, (line, verdicts)


class LedgerMachine(MembershipMachine):
    """:class:`MembershipMachine` with single charges, every term edit and purges at will."""

    @rule(device=st.sampled_from(DEVICES), name=st.sampled_from(NAMES))
    def charge(self, device: str, name: str) -> None:
        self._charge(device, name)

    @rule()
    def purge_now(self) -> None:
        self.purge()

    @rule(
        name=st.sampled_from(NAMES),
        edit=st.sampled_from(
            [
                {"epsilon_per_report": 0.5},
                {"epsilon_per_report": 1.0},
                {"epsilon_per_report": 2.0},
                {"window_epsilon_cap": None, "lifetime_epsilon_cap": None},
                {"window_epsilon_cap": 3.0, "lifetime_epsilon_cap": 6.0},
                {"window_epsilon_cap": 5.0, "lifetime_epsilon_cap": 9.0},
                {"window_epsilon_cap": 3.0, "lifetime_epsilon_cap": None},
                {"window_filter_epsilon": None, "window_filter_delta": None},
                {"window_filter_epsilon": 3.0, "window_filter_delta": 1e-6},
                {"window_filter_epsilon": 6.0, "window_filter_delta": 0.05},
                {"lifetime_filter_epsilon": None, "lifetime_filter_delta": None},
                {"lifetime_filter_epsilon": 6.0, "lifetime_filter_delta": 1e-9},
                {"lifetime_filter_epsilon": 9.0, "lifetime_filter_delta": 1e-3},
                {"retention_days": 2},
                {"retention_days": 7},
                {"retention_days": 12},
                {"group_size": 1},
                {"group_size": 3},
            ]
        ),
        loosen=st.booleans(),
    )
    def edit_terms(self, name: str, edit: dict[str, Any], loosen: bool) -> None:
        """One use case's terms (a group member's shared ones are refused: they go together)."""
        self._edit(name, loosen, **edit)


def _run(server: str, examples: int, base: type[MembershipMachine] = LedgerMachine) -> None:
    machine: Any = type("Machine", (base,), {"server": server})
    machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()


def test_the_ledger_agrees_with_its_model_on_sqlite() -> None:
    _run("", 60)


def test_the_ledger_agrees_with_its_model_under_membership_edits() -> None:
    _run("", 60, MembershipMachine)


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_the_ledger_agrees_with_its_model_on_postgresql() -> None:
    assert PG_URL is not None
    _run(PG_URL, 6)


def test_a_window_raised_past_a_purge_counts_undated_spend_under_its_own_budget() -> None:
    """The export recomputes what the live report says when a moved member's window grows.

    ``a`` leaves group ``g`` for ``h``, spends, its day is purged, then ``h``'s window grows past
    the purge: the spend it can no longer date counts for ``h`` (the budget it was charged
    under), not for ``g``, which ``a`` once drew from, in the export's report as in the live one.
    """
    machine: Any = type("Machine", (LedgerMachine,), {"server": ""})()
    try:
        machine.membership(loosen=True, move="h", name="a")
        machine.charge_everything()
        machine.advance(days=4, purge=False)
        machine.purge_now()
        machine.set_group_terms(
            group="h", lifetime=None, loosen=False, per_day=1, retention=7, window=None
        )
        machine.report_agrees_with_its_export()
    finally:
        machine.teardown()
