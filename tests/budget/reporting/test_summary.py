"""The stored report summary brought up to date equals a full pass, whatever happened since.

A seeded random sequence of charges across devices, use cases and days, days passing, purges
(the pipeline's, which brings the summary to its day first, and the ledger's alone, which
leaves it behind), and policy edits (epsilon, retention, group moves, retirement and
re-creation); after each step the report's basis equals the one a from-scratch scan of every
account gives, on SQLite and PostgreSQL. On PostgreSQL a charge that commits after one with a
larger id is not missed.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import Connection, text

from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.reporting.central import central_figures
from dp_governor.budget.reporting.loss import (
    effective_epsilon_basis,
    effective_epsilon_passes,
    spend_passes,
)
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.report import ReportBasis, basis_of
from dp_governor.budget.reporting.summary import advance_summary, brought_forward
from dp_governor.budget.reporting.views import spend_spread
from dp_governor.budget.rule.decide import Decision
from dp_governor.pipeline.purge import purge
from dp_governor.policies import PolicyCreate, PolicyUpdate
from tests.budget.reporting.random_edits import active as _active
from tests.budget.reporting.random_edits import edit as _edit
from tests.budget.reporting.random_edits import pick as _pick

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
DEVICES = [f"device-{i}" for i in range(8)]
STEPS = 45


def reference(ledger: Ledger, now: datetime) -> ReportBasis:
    """The basis from one scan of every account, no summary involved."""
    book, day = ledger.book(), utc_day(now)
    ((window, lifetime),) = spend_passes(ledger, now=now, books=[book])
    basis = basis_of(book, day, window, lifetime, computed_at=now.isoformat())
    return replace(basis, central=central_figures(ledger.engine, book.versions, day))


def _spreads_agree(ledger: Ledger, now: datetime) -> None:
    """Each use case's spend histogram in the passes is its per-device spends, in both scopes."""
    _, window, lifetime = effective_epsilon_passes(ledger, now=now)
    for name in _active(ledger):
        for scope, spend in (("window", window), ("lifetime", lifetime)):
            spread = spend_spread(ledger, name, now=now, scope=scope)
            direct = Counter(int(v) for v in np.rint(spread.eps * 1_000_000))
            assert Counter(spend.use_case.get(name, {})) == direct, (name, scope)


def _retired(ledger: Ledger) -> list[str]:
    return sorted(n for n, p in ledger.book().latest.items() if not p.active)


def _step(ledger: Ledger, rng: np.random.Generator, now: datetime) -> datetime:
    """One random change to the ledger; the time after it."""
    kinds = ["charge", "day", "purge", "raw purge", "epsilon", "retention", "move", "retire"]
    weights = np.array([8, 4, 2, 1, 1, 1, 1, 1]) / 19
    kind = kinds[int(rng.choice(len(kinds), p=weights))]
    names = _active(ledger)
    name = _pick(rng, names)
    if kind == "charge":
        for _ in range(int(rng.integers(1, 11))):
            ledger.charge(_pick(rng, DEVICES), _pick(rng, names), now=now)
    elif kind == "day":
        now += timedelta(days=int(rng.integers(1, 4)))
    elif kind == "purge":
        purge(ledger, now=now)
    elif kind == "raw purge":  # without the pipeline: the summary stays behind the horizons
        ledger.purge(now=now)
    elif kind == "epsilon":
        _edit(ledger, name, PolicyUpdate(epsilon_per_report=_pick(rng, [1.0, 2.0, 4.0])))
    elif kind == "retention":
        _edit(ledger, name, PolicyUpdate(retention_days=int(rng.integers(1, 7))))
    elif kind == "move":
        _edit(ledger, name, PolicyUpdate(budget_group=_pick(rng, [None, "g", "h"])))
    elif kind == "retire":
        retired = _retired(ledger)
        if retired and rng.random() < 0.5:
            old = ledger.book().latest[retired[0]]
            data = old.model_dump(include=set(PolicyCreate.model_fields))
            try:  # SFP's split epsilons must add up, a group's shared terms agree
                ledger.policies.create(PolicyCreate(**data), allow_loosen=True)
            except ValueError:
                pass
        elif len(names) > 2:
            ledger.policies.delete(name)
    return now


def _short_retention(ledger: Ledger) -> None:
    """Windows of a few days, so that days leaving them happen within the sequence."""
    for i, name in enumerate(_active(ledger)):
        _edit(ledger, name, PolicyUpdate(retention_days=1 + i % 4))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_summary_brought_up_to_date_equals_a_full_pass(
    ledger: Ledger, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    rng = np.random.default_rng(seed)
    _short_retention(ledger)
    now = START
    for _ in range(STEPS):
        now = _step(ledger, rng, now)
        assert effective_epsilon_basis(ledger, now=now) == reference(ledger, now)
        _spreads_agree(ledger, now)
    stale = [r for r in caplog.records if "stale" in r.getMessage()]
    policy_edits = [r for r in stale if "policy version" in r.getMessage()]
    # most reports started from the summary: a full pass only after an edit or a raw purge
    assert len(stale) - len(policy_edits) <= STEPS // 4, [r.getMessage() for r in stale]
    assert effective_epsilon_basis(ledger, now=now, full=True) == reference(ledger, now)


def test_days_passing_alone_drop_charges_from_the_windows(ledger: Ledger) -> None:
    _short_retention(ledger)
    for back in range(5):
        for device in DEVICES:
            ledger.charge(device, "emoji", now=START + timedelta(days=back))
    now = START + timedelta(days=4)
    assert effective_epsilon_basis(ledger, now=now) == reference(ledger, now)
    for later in range(1, 8):  # no charge: only the windows move
        at = now + timedelta(days=later)
        assert effective_epsilon_basis(ledger, now=at) == reference(ledger, at)


def test_the_purge_brings_the_summary_to_its_day_so_the_next_report_starts_from_it(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    _short_retention(ledger)
    now = START
    for day in range(12):
        now = START + timedelta(days=day)
        for device in DEVICES[: 2 + day % 5]:
            ledger.charge(device, "emoji", now=now)
        assert effective_epsilon_basis(ledger, now=now) == reference(ledger, now)
        purge(ledger, now=now)
    assert not [r for r in caplog.records if "stale" in r.getMessage()]
    assert advance_summary(ledger, now=now)


def test_advance_stores_what_the_report_brings_forward_and_refuses_a_stale_summary(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """``advance_summary`` brings the summary forward as the report does; stale, it says so."""
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    _short_retention(ledger)
    assert not advance_summary(ledger, now=START)  # nothing stored yet
    for device in DEVICES:
        ledger.charge(device, "emoji", now=START)
    assert effective_epsilon_basis(ledger, now=START) == reference(ledger, START)
    now = START + timedelta(days=1)
    for device in DEVICES[:3]:
        ledger.charge(device, "emoji", now=now)
    assert advance_summary(ledger, now=now)
    read: list[str] = []
    assert brought_forward(ledger, now=now, seen=read.append) is not None
    assert read == []  # stored at `now` with every charge: nothing left to read
    later = START + timedelta(days=40)
    ledger.purge(now=later)  # horizons past the summary's windows
    assert not advance_summary(ledger, now=later)
    assert any("stale" in r.getMessage() for r in caplog.records)


def test_a_summary_left_behind_a_purge_is_replaced_by_a_full_pass(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dpgov.reporting")
    _short_retention(ledger)
    for device in DEVICES:
        ledger.charge(device, "emoji", now=START)
    assert effective_epsilon_basis(ledger, now=START) == reference(ledger, START)
    later = START + timedelta(days=40)
    ledger.purge(now=later)  # horizons past the summary's windows
    assert effective_epsilon_basis(ledger, now=later) == reference(ledger, later)
    assert any("horizon" in r.getMessage() for r in caplog.records)


def test_subtract_undoes_merge_and_refuses_a_device_it_does_not_hold(ledger: Ledger) -> None:
    book = ledger.book()
    rows = [("a", "emoji", 4_000_000, 1, 2, "emoji"), ("b", "emoji", 4_000_000, 2, 1, "emoji")]
    whole = SpendPass(book).add(rows).finish()
    part = SpendPass(book).add(rows[1:]).finish()
    rest = SpendPass(book).add(rows[:1]).finish()
    less = SpendPass(book).merge(whole).subtract(part)
    assert (less.use_case, less.budget, less.totals, less.ledgers) == (
        rest.use_case,
        rest.budget,
        rest.totals,
        rest.ledgers,
    )
    with pytest.raises(ValueError, match="took out"):
        SpendPass(book).merge(rest).subtract(part)
    again = SpendPass.of_json(book, whole.to_json())
    assert (again.use_case, again.totals, again.ledgers) == (
        whole.use_case,
        whole.totals,
        whole.ledgers,
    )
    assert isinstance(again.use_case["emoji"], Counter)


def _waiting_for_advisory_lock(conn: Connection) -> bool:
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    return bool(conn.execute(text(query)).scalar_one())


def test_a_charge_committing_after_a_larger_id_is_not_missed(ledger: Ledger) -> None:
    """PostgreSQL draws ids before the commit order is fixed; the report waits for them."""
    if ledger.engine.dialect.name != "postgresql":
        pytest.skip("SQLite allocates charge ids under its one writer's lock, in commit order")
    now = START
    ledger.charge("device-0", "emoji", now=now)
    assert effective_epsilon_basis(ledger, now=now) == reference(ledger, now)  # stored
    inside, release = threading.Event(), threading.Event()

    def hold(_conn: Connection, _decision: Decision) -> None:
        inside.set()  # its id is drawn, its transaction open
        assert release.wait(60)

    slow = threading.Thread(
        target=lambda: ledger.charge("device-1", "emoji", now=now, on_accept=hold)
    )
    slow.start()
    assert inside.wait(60)
    ledger.charge("device-2", "emoji", now=now)  # a larger id, committed first
    done: list[ReportBasis] = []
    report = threading.Thread(target=lambda: done.append(effective_epsilon_basis(ledger, now=now)))
    report.start()
    with ledger.engine.connect() as conn:
        while not _waiting_for_advisory_lock(conn):  # the report waits for the open charge
            assert report.is_alive()
    release.set()
    slow.join(60)
    report.join(60)
    assert done == [reference(ledger, now)]
    assert effective_epsilon_basis(ledger, now=now) == reference(ledger, now)


def test_reports_while_devices_are_charged_end_equal_to_a_full_pass(ledger: Ledger) -> None:
    """Writers and reports at once; once the writers stop, the summary is exact."""
    now = START
    stop = threading.Event()
    errors: list[BaseException] = []

    def charge(offset: int) -> None:
        rng = np.random.default_rng(offset)
        try:
            while not stop.is_set():
                use_case = _pick(rng, ["emoji", "lookup-hints"])
                ledger.charge(_pick(rng, DEVICES), use_case, now=now)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writers = [threading.Thread(target=charge, args=(i,)) for i in range(2)]
    for w in writers:
        w.start()
    for _ in range(6):
        effective_epsilon_basis(ledger, now=now)
    stop.set()
    for w in writers:
        w.join(60)
    assert not errors
    assert effective_epsilon_basis(ledger, now=now) == reference(ledger, now)


def test_the_progress_of_a_report_brought_forward_counts_no_accounts(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[tuple[int, int]] = []
    ledger.scan_progress = lambda done, total: told.append((done, total))
    for device in DEVICES:
        ledger.charge(device, "emoji", now=START)
    effective_epsilon_basis(ledger, now=START)  # a full pass: counted, then read
    n = len(DEVICES)
    assert told[0] == (0, n) and told[-1] == (n, n)

    def refused(_self: Ledger) -> int:
        raise AssertionError("the accounts were counted")

    monkeypatch.setattr(Ledger, "account_count", refused)
    ledger.charge("a-new-device", "emoji", now=START)
    told.clear()
    effective_epsilon_basis(ledger, now=START)  # brought forward: the summary's devices
    assert told == [(n + 1, n + 1)]


class _Taken(Exception):
    """The fence of a job whose lease another process holds now."""


def test_a_job_that_lost_its_lease_stores_no_summary(ledger: Ledger) -> None:
    """The summary's store is one of the job's fenced write steps."""
    from dp_governor.budget.reporting.changes import store_row
    from dp_governor.budget.storage.db import fenced

    def taken(conn: Connection) -> None:
        raise _Taken

    values = {"name": "fenced", "book": "b", "day": 1, "through": 0, "applied": "[]"}
    values |= {"horizons": "{}", "passes": "{}", "computed_at": "2026-11-27T00:00:00+00:00"}
    with fenced(taken), pytest.raises(_Taken):
        store_row(ledger.engine, values)
    with ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM report_summaries WHERE name = 'fenced'"))
        assert stored.scalar_one() == 0
    store_row(ledger.engine, values)  # no job: stored
    with ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM report_summaries WHERE name = 'fenced'"))
        assert stored.scalar_one() == 1
