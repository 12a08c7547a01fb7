"""The effective-epsilon report's histograms, stored and brought up to date by what changed.

A :class:`~dp_governor.budget.reporting.population.SpendPass` is a sum over devices of each
device's values (a function of its window and lifetime rows), so the passes now are the stored
passes, less the old values of every device whose rows changed since, plus their new values
(:meth:`SpendPass.subtract`, :meth:`SpendPass.merge`; exact). The stored summary
(``report_summaries``) holds the passes as of a day ``D0``, the charges they count
(:class:`Watermark`), the retention horizons ``H0`` and the digest of the policy versions.
A device's rows change between then and now (day ``D1``, horizons ``H1``) only when:

1. it was charged: the charges the watermark does not count. Its old state is its account row
   now less those charges, read in the same snapshot as the row;
2. the day advanced: a charge of use case ``u`` on a day in ``(D0 - keep_u, D1 - keep_u]``
   left its window, one on a day in ``(D0, D1]`` entered it (``keep_u`` its retention);
   found from the charges' ``(use case, day)`` index;
3. the purge cleared days: only days on or before the horizons, which no window counted if
   ``H0[u] <= H1[u] <= D0 - keep_u`` for every use case (no window reaches back past its
   horizon either, :meth:`~dp_governor.budget.rule.state.AccountState.unheld`);
4. a policy version or a device-wide budget was added: never brought up to date (a budget's
   members may have changed); the digest differs and a full pass is due.

Anything else (the day going back, a horizon past ``D0 - keep_u``, a charge whose slot or day
the row does not hold) is :class:`Stale`: a full pass, stored for the next report. The daily
purge brings the summary to its own day before it deletes anything
(``dp_governor.pipeline.purge``), so its horizons never make the next report a full pass.

Charge ids: SQLite allocates them under its one writer's lock, so they become visible in id
order. PostgreSQL draws them from a sequence before the batch's audit head lock, so a charge
may commit after one with a larger id; a watermark there is ``through``, an id below which every
charge had committed or rolled back when read (the sequence's value while the policy book's
advisory lock, which every charge transaction holds shared, is held exclusively), and the ids
``applied`` above it.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson
from sqlalchemy import ColumnElement, Connection, Engine, and_, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError

from dp_governor.budget.clock import utc_day
from dp_governor.budget.gate.prepared import load_book
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.new_charges import NewCharges
from dp_governor.budget.reporting.population import SpendPass, slot_rows
from dp_governor.budget.rule.book import NO_HORIZON, PolicyBook
from dp_governor.budget.rule.state import AccountState, decode, lifetime_counts, window_counts
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.tables import Account, Charge, ReportSummary
from dp_governor.policies.repository import BOOK_LOCK_KEY

__all__ = [
    "REPORT",
    "Stale",
    "Summary",
    "Watermark",
    "advance_summary",
    "book_digest",
    "brought_forward",
    "joined",
    "report_passes",
    "scan_range",
    "scan_start",
    "settled_full",
]

REPORT: Final = "report"  # the effective-epsilon report's summary
_SUMMARIES = ReportSummary.__table__  # type: ignore[attr-defined]
_CHARGES = Charge.__table__  # type: ignore[attr-defined]
_ACCOUNTS = Account.__table__  # type: ignore[attr-defined]
_KEYS_PER_READ = 500
NewCharge = tuple[int, str, str, str, int, int, int]  # id, device, use case, budget, v, eps, day
log = logging.getLogger("dpgov.reporting")


class Stale(Exception):
    """The stored summary cannot be brought up to date exactly: a full pass is due."""


@dataclass(frozen=True, slots=True)
class Watermark:
    """The charges a summary counts: every id up to ``through``, and the ids ``applied`` above.

    >>> Watermark(10, frozenset({12})).counts(11), Watermark(10, frozenset({12})).counts(12)
    (False, True)
    """

    through: int
    applied: frozenset[int] = frozenset()

    def counts(self, charge_id: int) -> bool:
        """Whether the summary counts the charge ``charge_id``."""
        return charge_id <= self.through or charge_id in self.applied


@dataclass(frozen=True, slots=True)
class Summary:
    """The report's finished passes as of ``day``, the charges and horizons they count."""

    book: str
    day: int
    watermark: Watermark
    horizons: dict[str, int]
    window: SpendPass
    lifetime: SpendPass


def book_digest(book: PolicyBook) -> str:
    """The SHA-256 of every policy version: what a summary's passes depend on besides the rows.

    The passes read each use case's terms, budget members and retention (all from the versions)
    and the horizons (kept beside, checked apart); a device-wide budget changes no pass.
    """
    versions = [p.model_dump(mode="json") for p in book.versions]
    return hashlib.sha256(orjson.dumps(versions, option=orjson.OPT_SORT_KEYS)).hexdigest()


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A read transaction on one snapshot (SQLite: a ``BEGIN``; PostgreSQL: REPEATABLE READ)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


def _settled_id(engine: Engine) -> int | None:
    """PostgreSQL: an id up to which every charge id drawn has committed or rolled back.

    Every charge transaction holds the policy book's advisory lock shared from before it draws
    its ids until it ends; holding it exclusively waits for them, and the sequence's value read
    then is settled. SQLite: ``None`` (ids become visible in order; the snapshot's largest).
    """
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn, conn.begin():
        conn.execute(text(f"SELECT pg_advisory_xact_lock({BOOK_LOCK_KEY})"))
        value = conn.execute(
            text("SELECT pg_sequence_last_value(pg_get_serial_sequence('charges', 'id')::regclass)")
        ).scalar_one()
    return int(value or 0)


def _largest_id(conn: Connection) -> int:
    """The largest charge id the snapshot holds (0: none)."""
    return int(conn.execute(select(func.coalesce(func.max(_CHARGES.c.id), 0))).scalar_one())


def _charges_after(conn: Connection, mark: Watermark) -> list[NewCharge]:
    """The charges the snapshot holds that ``mark`` does not count, in id order."""
    c = _CHARGES.c
    query = (
        select(c.id, c.device_key, c.use_case, c.budget, c.policy_version, c.epsilon_micro, c.day)
        .where(c.id > mark.through)
        .order_by(c.id)
    )
    return [
        (int(i), str(dk), str(uc), str(b), int(v), int(e), int(d))
        for i, dk, uc, b, v, e, d in conn.execute(query)
        if int(i) not in mark.applied
    ]


def _day_moved(conn: Connection, book: PolicyBook, before: int, day: int) -> set[str]:
    """The devices with a charge that left a window, or entered one, from ``before`` to ``day``."""
    c = _CHARGES.c
    found: set[str] = set()
    spans: list[tuple[ColumnElement[bool], ...]] = [(c.day > before, c.day <= day)]
    for use_case, keep in book.retention().items():
        spans.append((c.use_case == use_case, c.day > before - keep, c.day <= day - keep))
    for span in spans:
        query = select(c.device_key).where(and_(*span)).distinct()
        found.update(str(dk) for (dk,) in conn.execute(query))
    return found


def _account_rows(conn: Connection, keys: list[str]) -> dict[str, tuple[Any, ...]]:
    """The ``accounts`` rows (count, micro-epsilon, days, lifetime) of ``keys``."""
    c = _ACCOUNTS.c
    out: dict[str, tuple[Any, ...]] = {}
    for s in range(0, len(keys), _KEYS_PER_READ):
        query = select(c.device_key, c.count, c.epsilon_micro, c.days, c.lifetime).where(
            c.device_key.in_(keys[s : s + _KEYS_PER_READ])
        )
        for dk, *row in conn.execute(query):
            out[str(dk)] = tuple(row)
    return out


def _take_out(state: AccountState, charges: list[NewCharge], book: PolicyBook) -> None:
    """``state`` less ``charges`` (each in its slot and on its day), in place.

    Raises:
        Stale: a charge's version, slot or day is not there to take it from.
    """
    for _, _, use_case, budget, version, eps, day in charges:
        group = book.group_sizes.get((use_case, version))
        slot = (use_case, eps, group, budget)
        i = next((k for k, s in enumerate(state.slots) if (s[0], s[1], s[2], s[4]) == slot), -1)
        entry = next((e for e in state.days if e[0] == day), [])
        if i < 0 or int(state.slots[i][3]) < 1 or len(entry) <= i + 1 or entry[i + 1] < 1:
            raise Stale(f"charge of {use_case!r} on day {day} is not in its account's row")
        state.slots[i][3] = int(state.slots[i][3]) - 1
        entry[i + 1] -= 1
        state.count -= 1
        state.epsilon_micro -= eps


def _check_horizons(book: PolicyBook, summary: Summary) -> None:
    """Raise :class:`Stale` unless every purge since the summary cleared only uncounted days."""
    for use_case, keep in book.retention().items():
        old = summary.horizons.get(use_case, NO_HORIZON)
        new = book.horizon(use_case)
        if not old <= new <= summary.day - keep:
            raise Stale(f"the horizon of {use_case!r} passed the summary's window")


def _copy(book: PolicyBook, spend: SpendPass) -> SpendPass:
    """A finished pass with the same histograms (``spend`` is left as it is)."""
    return SpendPass(book).merge(spend)


def _advance(
    engine: Engine, summary: Summary, day: int, seen: Callable[[str], None] | None = None
) -> tuple[PolicyBook, Summary]:
    """``summary`` brought to ``day`` and the charges now committed, from what changed.

    ``seen`` is told the key of every device whose rows it reads.

    Raises:
        Stale: it cannot be, exactly (see the module docstring).
    """
    if day < summary.day:
        raise Stale("the day went back")
    settled = _settled_id(engine)
    with _snapshot(engine) as conn:
        book = load_book(conn)
        if book_digest(book) != summary.book:
            raise Stale("a policy version was added")
        _check_horizons(book, summary)
        charges = _charges_after(conn, summary.watermark)
        moved = _day_moved(conn, book, summary.day, day) if day > summary.day else set()
        if settled is None:  # SQLite: every id up to the largest committed is
            settled = max(summary.watermark.through, _largest_id(conn))
        by_device: dict[str, list[NewCharge]] = defaultdict(list)
        for charge in charges:
            by_device[charge[1]].append(charge)
        touched = sorted(set(by_device) | moved)
        rows = _account_rows(conn, touched)
    retention = book.retention()
    gone = (SpendPass(book), SpendPass(book))
    new = (SpendPass(book), SpendPass(book))
    for dk in touched:
        if seen is not None:
            seen(dk)
        row = rows.get(dk)
        if row is None:
            raise Stale(f"device {dk!r} was charged but holds no account")
        now, then = decode(*row), decode(*row)
        _take_out(then, by_device.get(dk, []), book)
        gone[0].add(slot_rows(dk, window_counts(then, summary.day, retention, summary.horizons)))
        gone[1].add(slot_rows(dk, lifetime_counts(then)))
        new[0].add(slot_rows(dk, window_counts(now, day, retention, book.horizons)))
        new[1].add(slot_rows(dk, lifetime_counts(now)))
    try:
        window = _copy(book, summary.window).subtract(gone[0].finish()).merge(new[0])
        lifetime = _copy(book, summary.lifetime).subtract(gone[1].finish()).merge(new[1])
    except ValueError as exc:
        raise Stale(str(exc)) from None
    mark = Watermark(settled, frozenset(c[0] for c in charges if c[0] > settled))
    return book, Summary(summary.book, day, mark, dict(book.horizons), window, lifetime)


def scan_start(engine: Engine) -> tuple[PolicyBook, int]:
    """The book a full pass reads under and the charge id its watermark counts through."""
    settled = _settled_id(engine)
    with _snapshot(engine) as conn:
        book = load_book(conn)
        through = settled if settled is not None else _largest_id(conn)
    return book, through


def scan_range(
    engine: Engine,
    book: PolicyBook,
    through: int,
    *,
    day: int,
    chunk: int,
    after: str = "",
    until: str | None = None,
    progress: Callable[[int], None] | None = None,
    seen: Callable[[str], None] | None = None,
) -> Summary:
    """The accounts of keys in ``(after, until]``, ``chunk`` a short read, into a summary.

    ``book`` and ``through`` from :func:`scan_start`. Each chunk's snapshot also reads which
    charges after ``through`` its devices' rows hold (:class:`~.new_charges.NewCharges`: the
    :class:`Watermark`'s ``applied``), so :func:`_advance` brings the whole to one snapshot
    after; the summaries of a start's disjoint ranges join into one (:func:`joined`).
    ``seen`` is told every device key read.
    """
    retention, horizons = book.retention(), book.horizons
    window, lifetime = SpendPass(book), SpendPass(book)
    applied: set[int] = set()
    fresh = NewCharges(engine.dialect.name, through)
    a = _ACCOUNTS.c
    read = 0
    while True:
        query = (
            select(a.device_key, a.count, a.epsilon_micro, a.days, a.lifetime)
            .where(a.device_key > after)
            .order_by(a.device_key)
            .limit(chunk)
        )
        if until is not None:
            query = query.where(a.device_key <= until)
        settled = _settled_id(engine) if fresh.settle else None
        with _snapshot(engine) as conn:
            rows = conn.execute(query).cursor.fetchall()
            fresh.read(conn, after, settled)
        if rows:
            applied.update(fresh.take(after, str(rows[-1][0])))
        for dk, count, eps, days, life in rows:
            if seen is not None:
                seen(str(dk))
            state = decode(count, eps, days, life)
            window.add(slot_rows(str(dk), window_counts(state, day, retention, horizons)))
            lifetime.add(slot_rows(str(dk), lifetime_counts(state)))
        read += len(rows)
        if progress is not None:
            progress(read)
        if len(rows) < chunk:
            break
        after = str(rows[-1][0])
    mark = Watermark(through, frozenset(applied))
    return Summary(book_digest(book), day, mark, dict(horizons), window.finish(), lifetime.finish())


def joined(book: PolicyBook, parts: Sequence[Summary]) -> Summary:
    """The summaries of one start's disjoint key ranges (:func:`scan_range`) as one; exact.

    Each counts the charges up to the start's ``through`` and those after it that its own
    devices' rows held when read, so the whole counts their union.
    """
    window, lifetime = SpendPass(book), SpendPass(book)
    applied: set[int] = set()
    for part in parts:
        window.merge(part.window)
        lifetime.merge(part.lifetime)
        applied |= part.watermark.applied
    first = parts[0]
    mark = Watermark(first.watermark.through, frozenset(applied))
    return Summary(first.book, first.day, mark, dict(first.horizons), window, lifetime)


def _full(
    engine: Engine, day: int, chunk: int, progress: Callable[[int], None] | None
) -> tuple[PolicyBook, Summary]:
    """Every account read, ``chunk`` a short read transaction, into a summary of its own."""
    book, through = scan_start(engine)
    return book, scan_range(engine, book, through, day=day, chunk=chunk, progress=progress)


def _stored(engine: Engine, name: str) -> Summary | None:
    """The summary stored under ``name`` (``None``: none), its passes under the book now."""
    with engine.connect() as conn:
        row = conn.execute(select(_SUMMARIES).where(_SUMMARIES.c.name == name)).first()
        if row is None:
            return None
        book = load_book(conn)
    passes = orjson.loads(row.passes)
    return Summary(
        book=str(row.book),
        day=int(row.day),
        watermark=Watermark(int(row.through), frozenset(orjson.loads(row.applied))),
        horizons={str(k): int(v) for k, v in orjson.loads(row.horizons).items()},
        window=SpendPass.of_json(book, passes["window"]),
        lifetime=SpendPass.of_json(book, passes["lifetime"]),
    )


def _store(engine: Engine, name: str, summary: Summary, now: datetime) -> None:
    """Replace the summary stored under ``name``, in one statement (readers see all or none).

    A database that refuses the write (a read-only replica) keeps the summary it had; the
    report computed is exact either way.
    """
    values = {
        "name": name,
        "book": summary.book,
        "day": summary.day,
        "through": summary.watermark.through,
        "applied": orjson.dumps(sorted(summary.watermark.applied)).decode(),
        "horizons": orjson.dumps(summary.horizons, option=orjson.OPT_SORT_KEYS).decode(),
        "passes": orjson.dumps(
            {"window": summary.window.to_json(), "lifetime": summary.lifetime.to_json()}
        ).decode(),
        "computed_at": now.isoformat(),
    }
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    statement = insert(_SUMMARIES).values(**values)
    statement = statement.on_conflict_do_update(
        index_elements=[_SUMMARIES.c.name],
        set_={k: v for k, v in values.items() if k != "name"},
    )
    try:
        with writer(engine).begin() as conn:
            conn.execute(statement)
    except DBAPIError as exc:
        log.warning("the report's summary was not stored: %s", exc.orig)


def _moved(before: Summary, after: Summary) -> bool:
    """Whether ``after`` counts other charges, days or horizons than ``before`` (worth a write)."""
    return (before.day, before.watermark, before.horizons) != (
        after.day,
        after.watermark,
        after.horizons,
    )


def brought_forward(
    ledger: Ledger, *, now: datetime, seen: Callable[[str], None] | None = None
) -> tuple[PolicyBook, Summary] | None:
    """The stored summary brought to ``now`` and stored again; ``None``: a full pass is due.

    ``seen`` is told the key of every device whose rows were read (those that changed).
    """
    engine = ledger.engine
    stored = _stored(engine, REPORT)
    if stored is None:
        return None
    try:
        book, summary = _advance(engine, stored, utc_day(now), seen)
    except Stale as exc:
        log.info("the report's summary is stale (%s): a full pass", exc)
        return None
    if _moved(stored, summary):
        _store(engine, REPORT, summary, now)
    if ledger.scan_progress is not None:  # every device's spend is in the summary
        ledger.scan_progress(ledger.account_count())
    return book, summary


def settled_full(
    engine: Engine, book: PolicyBook, scanned: Summary, *, now: datetime
) -> tuple[PolicyBook, SpendPass, SpendPass]:
    """A full pass's summary brought to one snapshot and stored; its finished passes.

    If the book changed during the scan the passes are as exact as a scan can be, not stored.
    """
    try:  # the chunks' snapshots brought to one
        book, summary = _advance(engine, scanned, scanned.day)
    except Stale:
        return book, scanned.window, scanned.lifetime
    _store(engine, REPORT, summary, now)
    return book, summary.window, summary.lifetime


def report_passes(
    ledger: Ledger, *, now: datetime, chunk: int, full: bool = False
) -> tuple[PolicyBook, SpendPass, SpendPass]:
    """The report's finished (window, lifetime) passes at ``now`` and the book they are under.

    From the stored summary brought up to date when it can be (:func:`brought_forward`), else
    (or with ``full``) from every account, stored for the next report. Equal either way to
    :func:`dp_governor.budget.reporting.loss.spend_passes` on a ledger nobody writes meanwhile.
    """
    if not full and (forward := brought_forward(ledger, now=now)) is not None:
        book, summary = forward
        return book, summary.window, summary.lifetime
    book, scanned = _full(ledger.engine, utc_day(now), chunk, ledger.scan_progress)
    return settled_full(ledger.engine, book, scanned, now=now)


def advance_summary(ledger: Ledger, *, now: datetime) -> bool:
    """Bring the stored report summary to ``now`` if it can be; whether it was.

    The purge runs this before it raises the horizons: the summary then counts no day the
    purge deletes, and the next report starts from it.
    """
    stored = _stored(ledger.engine, REPORT)
    if stored is None:
        return False
    try:
        _, summary = _advance(ledger.engine, stored, utc_day(now))
    except Stale:
        return False
    if _moved(stored, summary):
        _store(ledger.engine, REPORT, summary, now)
    return True
