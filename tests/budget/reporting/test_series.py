"""The cumulative series read from the charges' index equals the one a scan of every account gives.

:func:`reference` is the series as computed before it read the charges: every account's held
days (and, where the window reaches back past the purge's horizon, its undated lifetime spend)
in pseudonym order. A seeded random sequence of charges across devices, use cases and days,
days passing, purges (the pipeline's and the ledger's alone), and policy edits (epsilon,
retention raised and lowered, group moves, retirement and re-creation); after each step every
active use case's series equals the reference exactly (``==``), over every device and over a
sample, on SQLite and PostgreSQL. A window that holds only kept days reads no account.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.clock import day_date
from dp_governor.budget.reporting.series import CumulativeSeries, cumulative_series
from dp_governor.budget.rule.state import lifetime_counts
from dp_governor.pipeline.purge import purge
from dp_governor.policies import PolicyCreate, PolicyUpdate
from dp_governor.policies.model import from_micro
from tests.budget.reporting.random_edits import active as _active
from tests.budget.reporting.random_edits import edit as _edit
from tests.budget.reporting.random_edits import pick as _pick

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
DEVICES = [f"device-{i}" for i in range(12)]
STEPS = 40
CELLS = (4_000_000, 7)  # every device, and a sample of 7 // days devices (at least one)


def reference(ledger: Ledger, use_case: str, *, now: datetime, max_cells: int) -> CumulativeSeries:
    """The series from a scan of every account (the computation before the charges' index)."""
    policy = ledger.policies.get(use_case)
    today = utc_day(now)
    first = today - policy.retention_days + 1
    n_days = policy.retention_days
    horizon = ledger.book().horizon(use_case)
    held = max(first, horizon + 1)
    rows: list[tuple[str, int, int]] = []  # (device key, day, micro-epsilon) in device order
    for dk, state in ledger.accounts():
        spent = state.daily().get(use_case, {})
        if horizon >= first:  # the window reaches past the purge: its undated spend, first
            ever = sum(
                e * n for (uc, e, _, _), n in lifetime_counts(state).items() if uc == use_case
            )
            undated = ever - sum(e for d, (_, e) in spent.items() if d > horizon)
            if undated > 0:
                rows.append((dk, first, undated))
        rows.extend((dk, d, e) for d, (_, e) in sorted(spent.items()) if held <= d <= today)
    days = [day_date(d).isoformat() for d in range(first, today + 1)]
    if not rows:
        zeros = [0.0] * n_days
        return CumulativeSeries(use_case, days, zeros, list(zeros), 0, 0)
    keys = np.array([r[0] for r in rows])
    day_idx = np.array([int(r[1]) - first for r in rows], dtype=np.int64)
    eps = np.array([int(r[2]) for r in rows], dtype=np.int64)
    _, device, counts = np.unique(keys, return_inverse=True, return_counts=True)
    running = np.cumsum(eps)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    offsets = np.repeat(running[starts] - eps[starts], counts)
    cumulative = running - offsets
    top = np.zeros(n_days, dtype=np.int64)
    np.maximum.at(top, day_idx, cumulative)
    top = np.maximum.accumulate(top)
    n_devices = len(counts)
    sampled = min(n_devices, max(1, max_cells // n_days))
    grid = np.zeros((sampled, n_days), dtype=np.int64)
    keep = device < sampled
    np.add.at(grid, (device[keep], day_idx[keep]), eps[keep])
    grid = np.cumsum(grid, axis=1)
    p99 = []
    for d in range(n_days):
        column = grid[:, d]
        active = column[column > 0]
        p99.append(
            from_micro(int(np.percentile(active, 99, method="inverted_cdf")))
            if active.size
            else 0.0
        )
    return CumulativeSeries(
        use_case, days, [from_micro(int(v)) for v in top], p99, n_devices, sampled
    )


def _policy(name: str, **fields: Any) -> PolicyCreate:
    data: dict[str, Any] = {
        "name": name,
        "mechanism": "cms",
        "k": 4,
        "m": 8,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 2,
        "retention_days": 2,
    }
    return PolicyCreate.model_validate({**data, **fields})


def _short_windows(ledger: Ledger) -> None:
    """Use cases that never had a long window (the purge keeps the longest ever), alone."""
    for name in _active(ledger):
        ledger.policies.delete(name)
    for i, name in enumerate(("a", "b", "c", "d")):
        eps = (0.5, 1.0, 2.0, 1.5)[i]
        days = (1, 2, 3, 4)[i]
        ledger.policies.create(_policy(name, epsilon_per_report=eps, retention_days=days))


def _step(ledger: Ledger, rng: np.random.Generator, now: datetime) -> datetime:
    """One random change to the ledger; the time after it."""
    kinds = ["charge", "day", "purge", "raw purge", "epsilon", "retention", "move", "retire"]
    weights = np.array([8, 4, 3, 1, 1, 3, 1, 1]) / 22
    kind = kinds[int(rng.choice(len(kinds), p=weights))]
    names = _active(ledger)
    name = _pick(rng, names)
    if kind == "charge":
        for _ in range(int(rng.integers(1, 16))):
            ledger.charge(_pick(rng, DEVICES), _pick(rng, names), now=now)
    elif kind == "day":
        now += timedelta(days=int(rng.integers(1, 4)))
    elif kind == "purge":  # then a window raised past what it kept
        purge(ledger, now=now)
        kept = ledger.book().spend_keep[name]
        _edit(ledger, name, PolicyUpdate(retention_days=kept + int(rng.integers(1, 4))))
    elif kind == "raw purge":  # the ledger's alone: rows past the horizon may remain a while
        ledger.purge(now=now, rows=1)
    elif kind == "epsilon":
        _edit(ledger, name, PolicyUpdate(epsilon_per_report=_pick(rng, [1.0, 2.0, 4.0])))
    elif kind == "retention":
        _edit(ledger, name, PolicyUpdate(retention_days=int(rng.integers(1, 6))))
    elif kind == "move":
        _edit(ledger, name, PolicyUpdate(budget_group=_pick(rng, [None, "g", "h"])))
    elif kind == "retire":
        retired = sorted(n for n, p in ledger.book().latest.items() if not p.active)
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


def _agree(ledger: Ledger, now: datetime) -> int:
    """Every active use case's series equals the reference; how many reached past a horizon."""
    book, past = ledger.book(), 0
    for name in _active(ledger):
        first = utc_day(now) - book.latest[name].retention_days + 1
        past += book.horizon(name) >= first
        for cells in CELLS:
            got = cumulative_series(ledger, name, now=now, max_cells=cells)
            assert got == reference(ledger, name, now=now, max_cells=cells), (name, cells)
    return past


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_series_from_the_charges_equals_a_scan_of_every_account(
    ledger: Ledger, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    _short_windows(ledger)
    now, past = START, 0
    for _ in range(STEPS):
        now = _step(ledger, rng, now)
        past += _agree(ledger, now)
    assert past > 0  # some windows reached back past a horizon (retention raised after a purge)


def test_a_window_reaching_past_the_horizon_counts_the_undated_spend(ledger: Ledger) -> None:
    ledger.policies.create(_policy("a", max_reports_per_day=1))
    for day in range(4):
        for device in DEVICES[: 3 + day]:
            ledger.charge(device, "a", now=START + timedelta(days=day))
    now = START + timedelta(days=5)
    purge(ledger, now=now)  # days 0 to 3 deleted (a window of 2), the lifetime kept
    ledger.policies.update("a", PolicyUpdate(retention_days=8), allow_loosen=True)
    ledger.charge(DEVICES[0], "a", now=now)  # the window (days -2 to 5) reaches past them
    assert _agree(ledger, now) >= 1
    series = cumulative_series(ledger, "a", now=now)
    assert (series.devices, series.max[0], series.max[-1]) == (6, 4.0, 5.0)


def test_a_window_of_kept_days_reads_no_account(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    for day in range(3):
        for device in DEVICES[: 4 + day]:
            ledger.charge(device, "emoji", now=START + timedelta(days=day))
    now = START + timedelta(days=2)
    expected = reference(ledger, "emoji", now=now, max_cells=4_000_000)

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the series read the accounts")

    monkeypatch.setattr(Ledger, "accounts", refused)
    assert cumulative_series(ledger, "emoji", now=now) == expected
    assert expected.devices == 6 and expected.max[-1] > expected.max[-3] > 0
