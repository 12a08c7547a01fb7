"""The stored what-if brought up to date equals a full scan, whatever happened since.

A seeded random sequence of charges across devices, use cases and days, days passing, purges
(the pipeline's, which brings the stored what-ifs to its day first, and the ledger's alone),
policy edits (epsilon, retention, group moves) and device-wide budgets; after each step
several proposals (tighter caps and a window filter, a longer and a shorter retention, a group
change, a device-wide budget) give the same what-if from their stored summaries as a reference
that decides every account through the gate's rule, on SQLite and PostgreSQL. Without the
day-moved set (the devices whose windows a new day changed) the sequence disagrees.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.errors import PolicyConflict
from dp_governor.budget.reporting import summary
from dp_governor.budget.reporting.loss import spend_passes
from dp_governor.budget.reporting.report import basis_of, finish_report
from dp_governor.budget.reporting.views import WhatIf, what_if, what_if_device_budget
from dp_governor.budget.reporting.what_if_summary import KEPT, PREFIX, advance_what_ifs
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.decide import check
from dp_governor.budget.rule.loosening import loosenings
from dp_governor.budget.storage.tables import ReportSummary
from dp_governor.pipeline.purge import purge
from dp_governor.policies import PolicyCreate, PolicyUpdate
from dp_governor.policies.device import DeviceBudgetCreate, DeviceBudgetVersion, limits_of
from tests.budget.reporting.random_edits import active as _active
from tests.budget.reporting.random_edits import edit as _edit
from tests.budget.reporting.random_edits import pick as _pick

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
DEVICES = [f"device-{i}" for i in range(8)]
OWN = ("a", "b", "c", "d")  # the use cases charged: short retention (:func:`_short_retention`)
STEPS = 40
DEVICE_PROPOSAL = DeviceBudgetCreate(
    epsilon_per_day=12.0, window_days=3, window_epsilon=24.0, lifetime_epsilon=60.0
)


def reference(ledger: Ledger, use_case: str, proposed: PolicyCreate, now: datetime) -> WhatIf:
    """The what-if from one scan of every account, each side decided by the gate's rule."""
    day = utc_day(now)
    with ledger.engine.connect() as conn:
        rows = ledger.policies.proposed(conn, [proposed])
    book = ledger.book()
    after = PolicyBook.build(
        [*book.versions, *rows], book.horizons, book.device, book.device_window
    )
    sides = {"current": book.terms[use_case], "proposed": after.terms[use_case]}
    counts: dict[str, Counter[str]] = {side: Counter() for side in sides}
    for _, state in ledger.accounts():
        for side, t in sides.items():
            idx = state.counted(t)
            if not idx:
                continue
            spent = state.window_spend(day, t.retention_days, idx, t.horizons)
            life = state.lifetime_spend(idx)
            counts[side]["in_window"] += spent > 0
            counts[side]["refused"] += not check(t, day, state).accepted
            counts[side]["over_window"] += bool(t.window_cap_micro and spent > t.window_cap_micro)
            counts[side]["over_lifetime"] += bool(
                t.lifetime_cap_micro and life > t.lifetime_cap_micro
            )
    passes = spend_passes(ledger, now=now, books=[book, after])
    lines = []
    for b, (window, lifetime) in zip((book, after), passes, strict=True):
        report = finish_report(basis_of(b, day, window, lifetime), accountant=ledger.accountant)
        line = next(x for x in report.use_cases if x.use_case == use_case)
        lines.append((line, report.totals.allowed_per_day))
    keys = ("epsilon_per_day", "epsilon_per_window", "epsilon_per_year", "lifetime_bounded")

    def both(figure: str) -> dict[str, int]:
        return {side: counts[side][figure] for side in sides}

    return WhatIf(
        use_case=use_case,
        current_version=book.latest[use_case].version,
        devices_in_window=both("in_window"),
        refused_next_report_today=both("refused"),
        over_window_cap=both("over_window"),
        over_lifetime_cap=both("over_lifetime"),
        effective_epsilon={
            k: {"current": getattr(lines[0][0], k), "proposed": getattr(lines[1][0], k)}
            for k in keys
        },
        totals_allowed_per_day={"current": lines[0][1], "proposed": lines[1][1]},
        loosens=loosenings(book, after),
    )


def reference_device(ledger: Ledger, now: datetime) -> dict[str, dict[str, dict[str, int]]]:
    """The device-wide what-if from one scan: every active use case decided on both sides."""
    day, book = utc_day(now), ledger.book()
    version = (book.device.version + 1) if book.device else 1
    after = limits_of(DeviceBudgetVersion.of(DEVICE_PROPOSAL, version, "what-if"))
    out: dict[str, dict[str, Counter[str]]] = {
        n: {"current": Counter(), "proposed": Counter()} for n in book.terms
    }
    for _, state in ledger.accounts():
        for name, terms in book.terms.items():
            for side, t in (("current", terms), ("proposed", replace(terms, device=after))):
                decision = check(t, day, state)
                if not decision.accepted:
                    out[name][side][str(decision.refused_by)] += 1
    return {n: {s: dict(c) for s, c in sides.items()} for n, sides in out.items()}


def _proposals(ledger: Ledger) -> dict[str, tuple[str, PolicyCreate]]:
    """Each kind of proposal against the ledger's policies now, on one active use case."""
    book = ledger.book()
    name = OWN[1] if OWN[1] in book.terms else _active(ledger)[0]
    policy = book.latest[name]
    base = policy.model_dump(include=set(PolicyCreate.model_fields))
    eps = policy.epsilon_per_report

    def made(**change: Any) -> tuple[str, PolicyCreate]:
        return name, PolicyCreate.model_validate({**base, **change})

    return {
        "tighter": made(
            max_reports_per_day=1,
            window_epsilon_cap=2 * eps,
            lifetime_epsilon_cap=5 * eps,
            window_filter_epsilon=3 * eps,
            window_filter_delta=1e-9,
        ),
        "longer": made(retention_days=policy.retention_days + 3),
        "shorter": made(retention_days=max(1, policy.retention_days - 2)),
        "group": made(budget_group=None if policy.budget_group else "g"),
    }


def _step(ledger: Ledger, rng: np.random.Generator, now: datetime) -> datetime:
    """One random change to the ledger; the time after it."""
    kinds = ["charge", "day", "purge", "raw purge", "epsilon", "retention", "move", "device"]
    weights = np.array([10, 5, 3, 1, 1, 1, 1, 1]) / 23
    kind = kinds[int(rng.choice(len(kinds), p=weights))]
    names = _active(ledger)
    name = _pick(rng, names)
    if kind == "charge":
        for _ in range(int(rng.integers(1, 13))):
            ledger.charge(_pick(rng, DEVICES), _pick(rng, names), now=now)
    elif kind == "day":
        now += timedelta(days=int(rng.integers(1, 4)))
    elif kind == "purge":
        purge(ledger, now=now)
    elif kind == "raw purge":  # without the pipeline: the what-ifs stay behind the horizons
        ledger.purge(now=now)
    elif kind == "epsilon":
        _edit(ledger, name, PolicyUpdate(epsilon_per_report=_pick(rng, [2.0, 4.0])))
    elif kind == "retention":
        _edit(ledger, name, PolicyUpdate(retention_days=int(rng.integers(1, 6))))
    elif kind == "move":
        _edit(ledger, name, PolicyUpdate(budget_group=_pick(rng, [None, "g", "h"])))
    else:
        days = int(rng.integers(1, 4))
        body = DeviceBudgetCreate(epsilon_per_day=16.0, window_days=days, window_epsilon=40.0)
        ledger.set_device_budget(body, allow_loosen=True)
    return now


def _short_retention(ledger: Ledger) -> None:
    """Use cases of a few days' retention only, so that windows move and the purge deletes.

    The defaults are retired: their 90 days would keep every day held (the purge keeps the
    longest retention a use case ever had).
    """
    base = ledger.book().latest["lookup-hints"].model_dump(include=set(PolicyCreate.model_fields))
    for i, name in enumerate(OWN):
        ledger.policies.create(
            PolicyCreate.model_validate({**base, "name": name, "retention_days": 1 + i}),
            allow_loosen=True,
        )
    for name in _active(ledger):
        if name not in OWN:
            ledger.policies.delete(name)


def _disagreements(ledger: Ledger, rng: np.random.Generator) -> list[str]:
    """Run the sequence; after each step, the proposals whose what-if differs from the reference."""
    wrong = []
    now = START
    for step in range(STEPS):
        now = _step(ledger, rng, now)
        for kind, (name, proposed) in _proposals(ledger).items():
            try:
                expected = reference(ledger, name, proposed, now)
            except PolicyConflict:  # a write would refuse it: so does the what-if
                with pytest.raises(PolicyConflict):
                    what_if(ledger, name, proposed, now=now)
                continue
            if what_if(ledger, name, proposed, now=now) != expected:
                wrong.append(f"step {step}: {kind}")
        if what_if_device_budget(ledger, DEVICE_PROPOSAL, now=now) != reference_device(ledger, now):
            wrong.append(f"step {step}: device")
    return wrong


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_what_if_brought_up_to_date_equals_a_full_scan(
    ledger: Ledger, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    _short_retention(ledger)
    assert _disagreements(ledger, np.random.default_rng(seed)) == []
    stale = [r.getMessage() for r in caplog.records if PREFIX in r.getMessage()]
    assert stale == [m for m in stale if "stale" in m]
    asked = STEPS * 5
    # most what-ifs started from their summary: a full pass after an edit, a raw purge, or a
    # purge under the longer retention (whose window reaches past what the purge keeps)
    assert len(stale) <= asked // 5, stale


def test_without_the_day_moved_set_the_what_if_disagrees(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation check: devices whose windows a new day changed must be read again."""
    monkeypatch.setattr(summary, "_day_moved", lambda *_: set())
    _short_retention(ledger)
    assert _disagreements(ledger, np.random.default_rng(1))


def test_days_passing_alone_move_the_counts(ledger: Ledger) -> None:
    _short_retention(ledger)
    for back in range(4):
        for device in DEVICES:
            ledger.charge(device, OWN[1], now=START + timedelta(days=back))
    for later in range(3, 10):  # no charge: only the windows and today move
        at = START + timedelta(days=later)
        for name, proposed in _proposals(ledger).values():
            assert what_if(ledger, name, proposed, now=at) == reference(ledger, name, proposed, at)
        assert what_if_device_budget(ledger, DEVICE_PROPOSAL, now=at) == reference_device(
            ledger, at
        )


def test_a_new_day_frees_the_daily_caps_of_yesterdays_devices(ledger: Ledger) -> None:
    """Today is a window too: a device charged only yesterday is refused no more."""
    _short_retention(ledger)
    name, proposed = _proposals(ledger)["tighter"]  # one report a day
    for device in DEVICES:
        ledger.charge(device, name, now=START)
    today = what_if(ledger, name, proposed, now=START)
    assert today.refused_next_report_today["proposed"] == len(DEVICES)
    later = START + timedelta(days=1)
    assert what_if(ledger, name, proposed, now=later) == reference(ledger, name, proposed, later)
    assert what_if_device_budget(ledger, DEVICE_PROPOSAL, now=later) == reference_device(
        ledger, later
    )


def test_a_window_past_the_horizon_is_brought_up_to_date_until_the_next_purge(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """A longer retention reads unheld spend: exact from the summary while the horizon stays."""
    _short_retention(ledger)
    name, proposed = _proposals(ledger)["longer"]  # 3 days past what the purge keeps
    for day in range(6):
        for device in DEVICES[: 3 + day]:
            ledger.charge(device, name, now=START + timedelta(days=day))
    now = START + timedelta(days=5)
    purge(ledger, now=now)
    assert what_if(ledger, name, proposed, now=now) == reference(ledger, name, proposed, now)
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    for later in (now + timedelta(hours=1), now + timedelta(days=1)):
        for device in DEVICES[:4]:
            ledger.charge(device, name, now=later)
        found = what_if(ledger, name, proposed, now=later)
        assert found == reference(ledger, name, proposed, later)
    assert not [r for r in caplog.records if "stale" in r.getMessage()]
    purge(ledger, now=now + timedelta(days=1))  # the horizon moves: a full pass, as exact
    later = now + timedelta(days=1, hours=1)
    assert what_if(ledger, name, proposed, now=later) == reference(ledger, name, proposed, later)
    assert any("horizon" in r.getMessage() for r in caplog.records)


def _stored_names(ledger: Ledger) -> list[str]:
    table = ReportSummary.__table__  # type: ignore[attr-defined]
    with ledger.engine.connect() as conn:
        names = [str(n) for (n,) in conn.execute(table.select().with_only_columns(table.c.name))]
    return sorted(n for n in names if n.startswith(PREFIX))


def test_at_most_kept_what_ifs_are_stored_and_an_edit_drops_them_at_the_purge(
    ledger: Ledger,
) -> None:
    for device in DEVICES:
        ledger.charge(device, "emoji", now=START)
    policy = ledger.book().latest["emoji"]
    base = policy.model_dump(include=set(PolicyCreate.model_fields))
    for i in range(KEPT + 3):  # each a what-if of its own, all with the same bounds to compute
        proposed = PolicyCreate.model_validate({**base, "description": f"proposal {i}"})
        what_if(ledger, "emoji", proposed, now=START + timedelta(minutes=i))
    assert len(_stored_names(ledger)) == KEPT
    ledger.policies.update("emoji", PolicyUpdate(epsilon_per_report=2.0), allow_loosen=True)
    assert advance_what_ifs(ledger, now=START) == 0
    assert _stored_names(ledger) == []


def test_the_purge_brings_the_what_ifs_to_its_day_so_the_next_starts_from_them(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    _short_retention(ledger)
    proposals = _proposals(ledger)
    for day in range(10):
        now = START + timedelta(days=day)
        for device in DEVICES[: 2 + day % 5]:
            ledger.charge(device, OWN[1], now=now)
        for kind in ("tighter", "shorter", "group"):
            name, proposed = proposals[kind]
            assert what_if(ledger, name, proposed, now=now) == reference(
                ledger, name, proposed, now
            )
        purge(ledger, now=now)
    assert not [r for r in caplog.records if "stale" in r.getMessage()]


def test_a_what_if_that_cannot_be_brought_forward_does_not_hold_back_the_purge(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The purge deletes what expired even when a stored what-if fails to move; it goes stale."""
    _short_retention(ledger)
    name, proposed = _proposals(ledger)["shorter"]
    for day in range(6):
        ledger.charge(DEVICES[0], OWN[1], now=START + timedelta(days=day))
    what_if(ledger, name, proposed, now=START + timedelta(days=5))

    def broken(ledger: Ledger, *, now: datetime) -> None:
        raise KeyError("a window the stored what-if does not know")

    monkeypatch.setattr("dp_governor.pipeline.purge.advance_what_ifs", broken)
    later = START + timedelta(days=40)
    result = purge(ledger, now=later)
    assert sum(v for v in result.values() if isinstance(v, int)) > 0, result
    assert any("before the purge failed" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    assert what_if(ledger, name, proposed, now=later) == reference(ledger, name, proposed, later)
