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

Not brought forward from a stored state by the charges since, as the report's summary is
(:mod:`.summary`): each day the window moves, changing the cumulative spend of every device
that spent on the day it leaves, and the p99's sample (the devices first in pseudonym order)
changes on every day of the window whenever a new device sorts into it, so an exact update
would need the sample's whole grid of devices by days kept between runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Engine, and_, select

from dp_governor.budget.clock import day_date, utc_day
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.rule.state import lifetime_counts
from dp_governor.budget.storage.tables import Charge
from dp_governor.policies.model import from_micro

__all__ = ["CumulativeSeries", "cumulative_series"]

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
class _Spends:
    """Spend rows of one use case's window, in no particular order.

    ``device`` is each row's device's rank in pseudonym order (``0 .. devices - 1``, every
    rank used), ``day`` its day's index in the window, ``eps`` its micro-epsilon.
    """

    device: np.ndarray
    day: np.ndarray
    eps: np.ndarray


def cumulative_series(
    ledger: Ledger, use_case: str, *, now: datetime, max_cells: int = 4_000_000
) -> CumulativeSeries:
    """How far the top devices of ``use_case`` have spent over its window, day by day.

    The maximum is exact (cumulative spend only grows, so each day's maximum is the larger of
    the day before's and that day's reporters'). Where the window reaches back past the purge's
    horizon, the spend no day holds any more counts on its first day (an upper bound). The p99
    is over every device when ``devices x days <= max_cells``, else over the devices first in
    pseudonym order, a uniform sample since pseudonyms are HMAC outputs; ``sampled`` says how
    many.
    """
    policy = ledger.policies.get(use_case)
    today = utc_day(now)
    first = today - policy.retention_days + 1
    horizon = ledger.book().horizon(use_case)
    if horizon >= first:
        spends = _accounted(ledger, use_case, first, today, horizon)
    else:
        spends = _charged(ledger.engine, use_case, first, today)
    return _series_of(use_case, first, today, spends, max_cells)


def _ranks(keys: list[str]) -> np.ndarray:
    """Each key's rank among the distinct ``keys`` in code-point order (pseudonym order).

    >>> _ranks(["b", "a", "b", "c"]).tolist()
    [1, 0, 1, 2]
    """
    _, rank = np.unique(np.array(keys, dtype=np.str_), return_inverse=True)
    return rank.astype(np.int64, copy=False)


def _charged(engine: Engine, use_case: str, first: int, today: int) -> _Spends:
    """The charges of ``use_case`` on days ``first .. today`` (all after its horizon)."""
    c = _CHARGES.c
    query = select(c.device_key, c.day, c.epsilon_micro).where(
        and_(c.use_case == use_case, c.day >= first, c.day <= today)
    )
    with engine.connect() as conn:  # the driver's tuples: no Row objects per charge
        rows = conn.execute(query).cursor.fetchall()
    n = len(rows)
    return _Spends(
        _ranks([str(r[0]) for r in rows]),
        np.fromiter((int(r[1]) - first for r in rows), dtype=np.int64, count=n),
        np.fromiter((int(r[2]) for r in rows), dtype=np.int64, count=n),
    )


def _accounted(ledger: Ledger, use_case: str, first: int, today: int, horizon: int) -> _Spends:
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
    return _Spends(_ranks(keys), days, eps)


def _series_of(
    use_case: str, first: int, today: int, spends: _Spends, max_cells: int
) -> CumulativeSeries:
    """The series of a window's spend rows: the exact top, the p99 over every device or a sample.

    Rows are ordered by device then day; a device's running sum at each of its rows is its
    cumulative spend on that row's day.
    """
    n_days = today - first + 1
    days = [day_date(d).isoformat() for d in range(first, today + 1)]
    if spends.eps.size == 0:
        zeros = [0.0] * n_days
        return CumulativeSeries(use_case, days, zeros, list(zeros), 0, 0)
    order = np.lexsort((spends.day, spends.device))
    device, day_idx, eps = spends.device[order], spends.day[order], spends.eps[order]
    starts = np.flatnonzero(np.diff(device, prepend=-1))  # each device's first row
    counts = np.diff(np.append(starts, device.size))
    running = np.cumsum(eps)
    cumulative = running - np.repeat(running[starts] - eps[starts], counts)
    top = np.zeros(n_days, dtype=np.int64)
    np.maximum.at(top, day_idx, cumulative)
    top = np.maximum.accumulate(top)
    n_devices = starts.size
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
        use_case, days, [from_micro(int(v)) for v in top], p99, int(n_devices), int(sampled)
    )
