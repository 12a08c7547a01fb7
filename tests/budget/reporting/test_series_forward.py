"""The series brought forward from the stored states equals the one computed from the charges.

A seeded random sequence of charges (devices whose keys sort anywhere, new ones among them),
days passing, purges (the pipeline's, which brings the states to its day first, and the
ledger's alone), and policy edits (epsilon, retention raised and lowered, group moves,
retirement and re-creation); after each step the dashboard job's series of every active use
case (:func:`series_brought_forward`) equals :func:`cumulative_series` and the scan of every
account (``==``), over every device and over a sample small enough that its end moves, on
SQLite and PostgreSQL; the job runs after most steps, not all (several steps between two
runs). Most runs bring the states forward rather than compute them afresh.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import Connection, text

from dp_governor.budget import Ledger
from dp_governor.budget.reporting import series_forward
from dp_governor.budget.reporting.series import cumulative_series, full_state
from dp_governor.budget.reporting.series_forward import series_brought_forward
from dp_governor.budget.rule.decide import Decision
from dp_governor.pipeline.purge import purge
from tests.budget.reporting import test_series
from tests.budget.reporting.random_edits import active as _active
from tests.budget.reporting.test_series import START, reference

STEPS = 60
KEYS = [f"{h:x}-device" for h in np.random.default_rng(7).integers(0, 2**20, size=24)]


class _Afresh:
    """Counts the series computed afresh (not brought forward)."""

    def __init__(self) -> None:
        self.calls = 0
        self.wrapped = full_state

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return self.wrapped(*args, **kwargs)  # type: ignore[arg-type]


def _agree(ledger: Ledger, now: datetime, cells: int) -> None:
    """The job's series equal the ones from the charges and from every account."""
    names = _active(ledger)
    got = series_brought_forward(ledger, names, now=now, max_cells=cells)
    for name, series in zip(names, got, strict=True):
        assert series == cumulative_series(ledger, name, now=now, max_cells=cells), name
        assert series == reference(ledger, name, now=now, max_cells=cells), name


@pytest.mark.parametrize(("seed", "cells"), [(1, 4_000_000), (2, 9), (3, 14), (4, 5)])
def test_the_series_brought_forward_equals_the_one_from_the_charges(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, seed: int, cells: int
) -> None:
    monkeypatch.setattr(test_series, "DEVICES", KEYS)
    afresh = _Afresh()
    monkeypatch.setattr(series_forward, "full_state", afresh)
    rng, skip = np.random.default_rng(seed), np.random.default_rng(seed + 100)
    test_series._short_windows(ledger)
    now, runs = START, 0
    for _ in range(STEPS):
        now = test_series._step(ledger, rng, now)
        if skip.random() < 0.15:  # a day, then the ledger's purge alone: the window's days go
            now += timedelta(days=1)
            ledger.purge(now=now)
        if skip.random() < 0.3:  # steps between two runs
            continue
        _agree(ledger, now, cells)
        runs += len(_active(ledger))
    assert afresh.calls < runs / 2, (afresh.calls, runs)  # mostly brought forward


def test_the_purge_brings_the_states_to_its_day_first(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    test_series._short_windows(ledger)
    for day in range(3):
        for key in KEYS[: 6 + 3 * day]:
            ledger.charge(key, "b", now=START + timedelta(days=day))
    now = START + timedelta(days=2)
    _agree(ledger, now, 6)
    later = now + timedelta(days=1)
    purge(ledger, now=later)  # deletes days 0 and 1; the stored window (days 1, 2) held day 1
    afresh = _Afresh()
    monkeypatch.setattr(series_forward, "full_state", afresh)
    _agree(ledger, later, 6)
    assert afresh.calls == 0


def test_a_purge_of_the_stored_windows_days_makes_it_computed_afresh(ledger: Ledger) -> None:
    test_series._short_windows(ledger)
    for day in range(3):
        for key in KEYS[: 6 + 3 * day]:
            ledger.charge(key, "b", now=START + timedelta(days=day))
    now = START + timedelta(days=2)
    _agree(ledger, now, 4_000_000)
    later = now + timedelta(days=1)
    ledger.purge(now=later)  # the ledger's alone: day 1, in the stored window, deleted unseen
    _agree(ledger, later, 4_000_000)


def _waiting_for_advisory_lock(conn: Connection) -> bool:
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    return bool(conn.execute(text(query)).scalar_one())


def test_a_charge_committing_after_a_larger_id_is_not_missed(ledger: Ledger) -> None:
    """PostgreSQL draws ids before the commit order is fixed; the series waits for them."""
    if ledger.engine.dialect.name != "postgresql":
        pytest.skip("SQLite allocates charge ids under its one writer's lock, in commit order")
    ledger.charge(KEYS[0], "emoji", now=START)
    _agree(ledger, START, 4_000_000)  # stored
    inside, release = threading.Event(), threading.Event()

    def hold(_conn: Connection, _decision: Decision) -> None:
        inside.set()  # its id is drawn, its transaction open
        assert release.wait(60)

    slow = threading.Thread(
        target=lambda: ledger.charge(KEYS[1], "emoji", now=START, on_accept=hold)
    )
    slow.start()
    assert inside.wait(60)
    ledger.charge(KEYS[2], "emoji", now=START)  # a larger id, committed first
    run = threading.Thread(target=lambda: _agree(ledger, START, 4_000_000))
    run.start()
    with ledger.engine.connect() as conn:
        while not _waiting_for_advisory_lock(conn):  # the run waits for the open charge
            assert run.is_alive()
    release.set()
    slow.join(60)
    run.join(60)
    _agree(ledger, START, 4_000_000)  # the late charge counted once, from the stored state
    assert series_brought_forward(ledger, ["emoji"], now=START)[0].devices == 3
