"""Every use case's cumulative series, brought forward from a stored state by what changed.

The dashboard job's series (:mod:`.series`) from the state stored by its last run
(:class:`~.series_state.SeriesState`, one ``report_summaries`` row, :data:`NAME`, for every use
case, with the charge watermark it counts, :mod:`.changes`). Between that run (day ``D0``,
window from ``F0``) and now (``D1``, from ``F1``), a device's values change only when:

1. it was charged: the charges after the watermark; its old spend is its account row now
   less those charges, read in the same snapshot as the row;
2. the window moved: a device that spent on a day leaving (``F0 .. F1 - 1``) or entering
   (``D0 + 1 .. D1``), found from the charges' ``(use case, day)`` index. The top needs
   neither (its state holds every later start, and a day entering holds only charges the
   watermark does not count, or the few committed before it with a later day: read them);
   the p99 needs the leaving days' devices only where the sample is (key up to its last);
3. the sample's end moved: devices that entered or left the window before it push it back or
   forward. The accounts around it are read in key order until it holds ``min(devices,
   cap)`` devices again; every account between the old end and the new one is read.

Everything else (the device count: the devices' last days of spend, counted per day, lose the
days leaving) follows without reading a device. Each run costs in proportion to the new
charges, a day of charges where the window moved, and the devices between the sample's old
and new end.

Computed from the window's charges instead (in the same snapshot, then stored), exact as
before: when no state was stored, the day went back, or a charged device's row does not hold
its new charges; when the window's length or ``max_cells`` changed (a retention edit: every
device's cumulative spend counts from another first day, and the sample's size ``max_cells //
days`` changes, so every sampled device's values change); when a day of
the stored window is on or before the horizon now (a purge deleted days the state counts, and
which devices held them is gone with them: the purge brings the states to its day first,
:func:`advance_series`). Never stored, so computed every run: a window reaching back past the
horizon (retention raised beyond what was kept), whose first day holds each device's undated
spend (its lifetime less its held days, :mod:`.series`), which moves to the next first day with
every day the window moves, for every device that holds any; and a window longer than
:data:`MAX_KEPT_DAYS` days, whose top over every start (days squared) outgrows a stored row.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np
import orjson
from sqlalchemy import Connection, and_, select

from dp_governor.budget.clock import utc_day
from dp_governor.budget.gate.prepared import load_book
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.changes import (
    NewCharge,
    Watermark,
    account_rows,
    charges_after,
    largest_id,
    settled_id,
    snapshot,
    store_row,
)
from dp_governor.budget.reporting.series import (
    MAX_CELLS,
    CumulativeSeries,
    full_state,
    series_of,
)
from dp_governor.budget.reporting.series_state import DeviceSpend, SeriesState, top_of
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.state import decode
from dp_governor.budget.storage.tables import Account, Charge, ReportSummary

__all__ = ["MAX_KEPT_DAYS", "NAME", "advance_series", "series_brought_forward"]

NAME: Final = "series"  # the ``report_summaries`` row of every use case's state
MAX_KEPT_DAYS: Final = 400  # longer windows are not kept: their top holds days squared cells
_FORMAT: Final = "series-1"  # the ``book`` column: the states' layout
_WALK: Final = 500  # accounts read at a time around the sample's end
_CHARGES = Charge.__table__  # type: ignore[attr-defined]
_ACCOUNTS = Account.__table__  # type: ignore[attr-defined]
_SUMMARIES = ReportSummary.__table__  # type: ignore[attr-defined]
log = logging.getLogger("dpgov.reporting")


class _Stale(Exception):
    """A use case's stored state cannot be brought forward exactly: computed afresh."""


@dataclass(frozen=True, slots=True)
class _Stored:
    """The stored states: their day, the charges they count, each use case's state."""

    day: int
    mark: Watermark
    max_cells: int
    states: dict[str, SeriesState]


@dataclass(frozen=True, slots=True)
class _Device:
    """A device read: its spend on the use case before the new charges and now."""

    old: DeviceSpend
    new: DeviceSpend


def series_brought_forward(
    ledger: Ledger, names: Sequence[str], *, now: datetime, max_cells: int = MAX_CELLS
) -> list[CumulativeSeries]:
    """The series of ``names`` at ``now``, from the stored states where they can be; stored.

    Equal (``==``) to :func:`~.series.cumulative_series` of each on a ledger nobody writes
    meanwhile.
    """
    states = _run(ledger, names, utc_day(now), max_cells, now, fresh=True)
    return [series_of(name, states[name]) for name in names]


def advance_series(ledger: Ledger, *, now: datetime) -> bool:
    """Bring the stored states to ``now`` where they can be; whether any was stored.

    The purge runs this before it raises the horizons, so the days it deletes never make
    the next run compute a series afresh.
    """
    stored = _load(ledger)
    if stored is None:
        return False
    _run(ledger, sorted(stored.states), utc_day(now), stored.max_cells, now, fresh=False)
    return True


def _run(
    ledger: Ledger,
    names: Sequence[str],
    day: int,
    max_cells: int,
    now: datetime,
    *,
    fresh: bool,
) -> dict[str, SeriesState]:
    """The states of ``names`` at ``day`` in one snapshot, stored; afresh where due if ``fresh``."""
    engine = ledger.engine
    stored = _load(ledger)
    if stored is not None and (stored.day > day or stored.max_cells != max_cells):
        stored = None
    settled = settled_id(engine)
    out: dict[str, SeriesState] = {}
    kept: dict[str, SeriesState] = {}
    with snapshot(engine) as conn:
        book = load_book(conn)
        new = charges_after(conn, stored.mark) if stored is not None else []
        forward = _forward(conn, book, stored, names, new, day) if stored is not None else {}
        for name in names:
            if name in forward:
                out[name] = kept[name] = forward[name]
            elif fresh:
                state, keep = full_state(conn, ledger, book, name, day, max_cells)
                out[name] = state
                if keep and state.n_days <= MAX_KEPT_DAYS:
                    kept[name] = state
        mark = _mark(conn, stored, settled)
    _store(ledger, (day, mark, max_cells), book, kept, now)
    return out


def _mark(conn: Connection, stored: _Stored | None, settled: int | None) -> Watermark:
    """The charges the snapshot holds, as a watermark (:mod:`.changes`)."""
    if settled is None:  # SQLite: every id up to the largest committed is
        return Watermark(max(stored.mark.through if stored else 0, largest_id(conn)))
    above = select(_CHARGES.c.id).where(_CHARGES.c.id > settled)
    return Watermark(settled, frozenset(int(i) for (i,) in conn.execute(above)))


def _forward(
    conn: Connection,
    book: PolicyBook,
    stored: _Stored,
    names: Sequence[str],
    new: list[NewCharge],
    day: int,
) -> dict[str, SeriesState]:
    """The stored states of ``names`` that can be brought to ``day``, brought (module docstring)."""
    charged: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for _, dk, use_case, _, _, eps, d in new:
        charged[use_case][dk].append((d, eps))
    out: dict[str, SeriesState] = {}
    for name in names:
        state = stored.states.get(name)
        if state is None or name not in book.latest:
            continue
        n_days = book.latest[name].retention_days
        if state.n_days != n_days or book.horizon(name) >= state.first:
            continue
        try:
            out[name] = _brought(conn, book, state, name, charged[name], stored.day, day)
        except _Stale as exc:
            log.info("the series of %s is computed afresh (%s)", name, exc)
    return out


def _brought(
    conn: Connection,
    book: PolicyBook,
    state: SeriesState,
    use_case: str,
    charged: dict[str, list[tuple[int, int]]],
    before: int,
    day: int,
) -> SeriesState:
    """``state`` (of day ``before``) brought to ``day`` and the snapshot's charges.

    Raises:
        _Stale: a charged device's row does not hold its new charges.
    """
    n, old_first, old_last = state.n_days, state.first, state.last
    everyone = state.sampled == state.devices  # no device with spend after the sample's end
    first = day - n + 1
    horizon = book.horizon(use_case)
    touched = sorted(set(charged) | _spenders(conn, use_case, before + 1, day))
    leaving = _spenders(conn, use_case, old_first, min(first - 1, before))
    keys = {*touched, *(k for k in leaving if k <= old_last)}
    read = _read(conn, use_case, horizon, charged, keys)
    try:
        for key in touched:
            state.end(read[key].old, -1)
        devices = sum(state.ends[first - old_first :]) + sum(
            read[k].new.last(first, n) is not None for k in touched
        )
        last = _sample_end(conn, use_case, horizon, state, (first, devices, everyone), read)
        sampled = [d.old for k, d in read.items() if k <= old_last]
        state.count(
            [s.cumulative(old_first, n) for s in sampled if s.last(old_first, n) is not None], -1
        )
        after = state.moved_to(first)
        for key in touched:
            after.end(read[key].new, 1)
        sampled = [d.new for k, d in read.items() if k <= last]
        after.count([s.cumulative(first, n) for s in sampled if s.last(first, n) is not None], 1)
    except ValueError as exc:
        raise _Stale(str(exc)) from None
    after.sampled, after.last = min(devices, state.cap), last
    after.top = np.maximum(after.top, _top(read, touched, first, n))
    return after


def _top(read: dict[str, _Device], keys: list[str], first: int, n_days: int) -> np.ndarray:
    """The top table (:func:`~.series_state.top_of`) of the devices ``keys`` (sorted), now."""
    rows = [
        (i, d - first, e)
        for i, key in enumerate(keys)
        for d, e in sorted(read[key].new.days.items())
        if first <= d < first + n_days
    ]
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return top_of(table[:, 0], table[:, 1], table[:, 2], n_days)


def _sample_end(
    conn: Connection,
    use_case: str,
    horizon: int,
    state: SeriesState,
    now: tuple[int, int, bool],
    read: dict[str, _Device],
) -> str:
    """The key of the new sample's last device (``""``: none); the accounts walked join ``read``.

    The sample is the first ``min(devices, cap)`` devices with spend in the window. Those up
    to the old end that hold spend now (the old sample, less those that left, plus those that
    entered: each one read) decide which way the end moves and how far. ``now``: the new
    window's first day, its devices, and whether the old sample held every device.
    """
    first, devices, everyone = now
    n, old_last = state.n_days, state.last
    size = min(devices, state.cap)
    held = state.sampled + sum(
        (d.new.last(first, n) is not None) - (d.old.last(state.first, n) is not None)
        for key, d in read.items()
        if key <= old_last
    )
    if size == 0:
        return ""
    if held >= size:  # back from the old end, over ``held - size`` devices
        skip = held - size
        for key, d in _walk(conn, use_case, horizon, old_last, read, backward=True):
            if d.new.last(first, n) is not None:
                if skip == 0:
                    return key
                skip -= 1
        raise ValueError("the sample's end is not among the accounts")
    wanted = size - held
    if everyone:  # no device after the old end but those read
        after = sorted(
            k for k, d in read.items() if k > old_last and d.new.last(first, n) is not None
        )
        if len(after) < wanted:
            raise ValueError("fewer devices after the sample's end than counted")
        return after[wanted - 1]
    for key, d in _walk(conn, use_case, horizon, old_last, read, backward=False):
        if d.new.last(first, n) is not None:
            wanted -= 1
            if wanted == 0:
                return key
    raise ValueError("the sample's end is not among the accounts")


def _walk(
    conn: Connection,
    use_case: str,
    horizon: int,
    start: str,
    read: dict[str, _Device],
    *,
    backward: bool,
) -> Iterator[tuple[str, _Device]]:
    """The accounts from ``start`` back (``start`` included) or on (excluded), each device once.

    A device not read already holds no new charge: its spend before and now are one.
    """
    c = _ACCOUNTS.c
    cursor = start
    while True:
        if backward:
            where = c.device_key <= cursor if cursor == start else c.device_key < cursor
            query = select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime).where(where)
            query = query.order_by(c.device_key.desc()).limit(_WALK)
        else:
            query = select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime).where(
                c.device_key > cursor
            )
            query = query.order_by(c.device_key).limit(_WALK)
        rows = conn.execute(query).fetchall()
        for key, *row in rows:
            if str(key) not in read:
                spend = _spend(tuple(row), use_case, horizon, str(key))
                read[str(key)] = _Device(spend, spend)
            yield str(key), read[str(key)]
        if len(rows) < _WALK:
            return
        cursor = str(rows[-1][0])


def _spenders(conn: Connection, use_case: str, low: int, high: int) -> set[str]:
    """The devices with a charge of ``use_case`` on a day in ``low .. high``."""
    if low > high:
        return set()
    c = _CHARGES.c
    span = and_(c.use_case == use_case, c.day >= low, c.day <= high)
    return {str(k) for (k,) in conn.execute(select(c.device_key).where(span).distinct())}


def _spend(row: tuple[Any, ...], use_case: str, horizon: int, key: str) -> DeviceSpend:
    """A device's held spend on ``use_case`` (days after ``horizon``) from its ``accounts`` row."""
    daily = decode(*row).daily().get(use_case, {})
    return DeviceSpend(key, {d: e for d, (_, e) in daily.items() if d > horizon})


def _read(
    conn: Connection,
    use_case: str,
    horizon: int,
    charged: dict[str, list[tuple[int, int]]],
    keys: set[str],
) -> dict[str, _Device]:
    """The devices ``keys``: each one's spend now and before its new charges ``charged``.

    Raises:
        _Stale: a device holds no account, or not its new charges.
    """
    rows = account_rows(conn, sorted(keys))
    out: dict[str, _Device] = {}
    for key in sorted(keys):
        row = rows.get(key)
        if row is None:
            raise _Stale(f"device {key!r} spent but holds no account")
        new = _spend(row, use_case, horizon, key)
        old = dict(new.days)
        for d, eps in charged.get(key, []):
            if d <= horizon:
                continue
            left = old.get(d, 0) - eps
            if left < 0:
                raise _Stale(f"a charge of {key!r} on day {d} is not in its account's row")
            if left:
                old[d] = left
            else:
                del old[d]
        out[key] = _Device(DeviceSpend(key, old), new)
    return out


def _load(ledger: Ledger) -> _Stored | None:
    """The stored states (``None``: none, or another layout's)."""
    with ledger.engine.connect() as conn:
        row = conn.execute(select(_SUMMARIES).where(_SUMMARIES.c.name == NAME)).first()
    if row is None or row.book != _FORMAT:
        return None
    passes = orjson.loads(row.passes)
    return _Stored(
        day=int(row.day),
        mark=Watermark(int(row.through), frozenset(orjson.loads(row.applied))),
        max_cells=int(passes["max_cells"]),
        states={str(k): SeriesState.of_json(v) for k, v in passes["states"].items()},
    )


def _store(
    ledger: Ledger,
    at: tuple[int, Watermark, int],
    book: PolicyBook,
    states: dict[str, SeriesState],
    now: datetime,
) -> None:
    """Replace the stored states with ``states``, ``at`` a day, a watermark and ``max_cells``."""
    day, mark, max_cells = at
    passes = {"max_cells": max_cells, "states": {k: s.to_json() for k, s in states.items()}}
    horizons = {name: book.horizon(name) for name in states}
    store_row(
        ledger.engine,
        {
            "name": NAME,
            "book": _FORMAT,
            "day": day,
            "through": mark.through,
            "applied": orjson.dumps(sorted(mark.applied)).decode(),
            "horizons": orjson.dumps(horizons, option=orjson.OPT_SORT_KEYS).decode(),
            "passes": orjson.dumps(passes).decode(),
            "computed_at": now.isoformat(),
        },
    )
