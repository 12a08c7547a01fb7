"""Each use case's cumulative series: the top and the p99 device's spend, day by day.

Read from the charges its window holds, through the charges' ``(use_case, day)`` index, so a
series costs in proportion to its use case's charges in the window, not to the ledger times
the use cases. The charges held are the accounts' held days, charge for charge: the gate writes
both in one transaction, a day on or before its use case's retention horizon is held by
neither (the purge deletes both, and every reader ignores what a horizon passed), and
``verify`` checks both against the audit log, per use case and day after the horizon
(:mod:`dp_governor.budget.audit.verify`). Where the window reaches back past the purge's
horizon (retention raised beyond what was kept), the spend no day holds any more is each
device's lifetime spend less its held days, a figure only the accounts hold: that case alone
reads every account.

Here from the window's charges; the dashboard job brings a stored state of it forward by what
changed instead (:mod:`.series_forward`, :mod:`.series_state`), equal to this computation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np
from sqlalchemy import Connection, and_, select

from dp_governor.budget.clock import utc_day
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.series_state import SeriesState, top_of
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.state import lifetime_counts
from dp_governor.budget.storage.tables import Charge

__all__ = [
    "MAX_CELLS",
    "CumulativeSeries",
    "Spends",
    "cumulative_series",
    "full_state",
    "series_of",
    "state_of",
]

MAX_CELLS: Final = 4_000_000  # the p99's sample: at most this many devices x days
_CHARGES = Charge.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class CumulativeSeries:
    """Per day of the window: the most-spent and the p99 device's cumulative epsilon."""

    use_case: str
    days: list[str]
    max: list[float]
    p99: list[float]
    devices: int
    sampled: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Spends:
    """Spend rows of one use case's window, in no particular order.

    ``device`` is each row's device's rank in pseudonym order (``0 .. devices - 1``, every
    rank used; ``keys`` the keys in that order), ``day`` its day's index in the window,
    ``eps`` its micro-epsilon.
    """

    keys: np.ndarray
    device: np.ndarray
    day: np.ndarray
    eps: np.ndarray


def cumulative_series(
    ledger: Ledger, use_case: str, *, now: datetime, max_cells: int = MAX_CELLS
) -> CumulativeSeries:
    """How far the top devices of ``use_case`` have spent over its window, day by day.

    The maximum is exact (cumulative spend only grows, so each day's maximum is the larger of
    the day before's and that day's reporters'). Where the window reaches back past the purge's
    horizon, the spend no day holds any more counts on its first day (an upper bound). The p99
    is over every device when ``devices x days <= max_cells``, else over the devices first in
    pseudonym order, a uniform sample since pseudonyms are HMAC outputs; ``sampled`` says how
    many. Computed from the window's charges; :mod:`.series_forward` brings a stored one
    forward instead.
    """
    with ledger.engine.connect() as conn:
        state, _ = full_state(conn, ledger, ledger.book(), use_case, utc_day(now), max_cells)
    return series_of(use_case, state)


def full_state(
    conn: Connection, ledger: Ledger, book: PolicyBook, use_case: str, today: int, max_cells: int
) -> tuple[SeriesState, bool]:
    """The series' state from the window's charges (in ``conn``); whether it can be kept.

    A window reaching back past the horizon reads every account instead and its first day
    holds the undated spend: not a state later charges bring forward.
    """
    n_days = book.latest[use_case].retention_days
    first = today - n_days + 1
    horizon = book.horizon(use_case)
    if horizon >= first:
        spends = _accounted(ledger, use_case, first, today, horizon)
        return state_of(first, n_days, spends, max_cells), False
    return state_of(first, n_days, _charged(conn, use_case, first, today), max_cells), True


def _ranks(keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``keys`` in code-point order (pseudonym order), and each key's rank there.

    >>> [a.tolist() for a in _ranks(["b", "a", "b", "c"])]
    [['a', 'b', 'c'], [1, 0, 1, 2]]
    """
    distinct, rank = np.unique(np.array(keys, dtype=np.str_), return_inverse=True)
    return distinct, rank.astype(np.int64, copy=False)


def _charged(conn: Connection, use_case: str, first: int, today: int) -> Spends:
    """The charges of ``use_case`` on days ``first .. today`` (all after its horizon)."""
    c = _CHARGES.c
    query = select(c.device_key, c.day, c.epsilon_micro).where(
        and_(c.use_case == use_case, c.day >= first, c.day <= today)
    )
    rows = conn.execute(query).cursor.fetchall()  # the driver's tuples: no Row objects
    n = len(rows)
    return Spends(
        *_ranks([str(r[0]) for r in rows]),
        np.fromiter((int(r[1]) - first for r in rows), dtype=np.int64, count=n),
        np.fromiter((int(r[2]) for r in rows), dtype=np.int64, count=n),
    )


def _accounted(ledger: Ledger, use_case: str, first: int, today: int, horizon: int) -> Spends:
    """From every account: each device's undated spend on ``first``, then its held days.

    The undated spend is the device's lifetime spend on ``use_case`` less its days held
    (those after ``horizon``), the part a window reaching back past the horizon may hold.
    """
    rows: list[tuple[str, int, int]] = []  # (device key, day, micro-epsilon)
    for dk, state in ledger.accounts():
        spent = state.daily().get(use_case, {})
        ever = sum(e * n for (uc, e, _, _), n in lifetime_counts(state).items() if uc == use_case)
        undated = ever - sum(e for d, (_, e) in spent.items() if d > horizon)
        if undated > 0:
            rows.append((dk, first, undated))
        rows.extend((dk, d, e) for d, (_, e) in spent.items() if horizon < d <= today)
    keys = [r[0] for r in rows]
    days = np.array([r[1] - first for r in rows], dtype=np.int64)
    eps = np.array([r[2] for r in rows], dtype=np.int64)
    return Spends(*_ranks(keys), days, eps)


def state_of(first: int, n_days: int, spends: Spends, max_cells: int) -> SeriesState:
    """The series' state (:class:`~.series_state.SeriesState`) of a window's spend rows.

    The top over every device; the p99's histograms over every device when ``devices x days
    <= max_cells``, else over the devices first in pseudonym order.
    """
    cap = max(1, max_cells // n_days)
    if spends.eps.size == 0:
        top = np.zeros((n_days, n_days), dtype=np.int64)
        empty: list[dict[int, int]] = [{} for _ in range(n_days)]
        return SeriesState(first, n_days, cap, top, empty, [0] * n_days, 0, "")
    order = np.lexsort((spends.day, spends.device))
    device, day_idx, eps = spends.device[order], spends.day[order], spends.eps[order]
    cell = device * n_days + day_idx
    starts = np.flatnonzero(np.diff(cell, prepend=-1))  # one row a device and day
    device, day_idx, eps = device[starts], day_idx[starts], np.add.reduceat(eps, starts)
    n_devices = int(device[-1]) + 1
    sampled = min(n_devices, cap)
    grid = np.zeros((sampled, n_days), dtype=np.int64)
    keep = device < sampled
    grid[device[keep], day_idx[keep]] = eps[keep]
    grid = np.cumsum(grid, axis=1)
    hist = []
    for d in range(n_days):
        values, counts = np.unique(grid[:, d][grid[:, d] > 0], return_counts=True)
        hist.append(dict(zip(values.tolist(), counts.tolist(), strict=True)))
    top = top_of(device, day_idx, eps, n_days)
    last_days = np.zeros(n_devices, dtype=np.int64)
    np.maximum.at(last_days, device, day_idx)  # rows hold spend: every device spent on one
    ends = np.bincount(last_days, minlength=n_days).tolist()
    last = str(spends.keys[sampled - 1])
    return SeriesState(first, n_days, cap, top, hist, ends, sampled, last)


def series_of(use_case: str, state: SeriesState) -> CumulativeSeries:
    """The series a state stands for."""
    return CumulativeSeries(
        use_case, state.series_days(), state.maxima(), state.p99(), state.devices, state.sampled
    )
