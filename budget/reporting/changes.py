"""What changed since a stored figure: the charges after its watermark, read in one snapshot.

Shared by the figures brought forward from a stored state (:mod:`.summary`,
:mod:`.series_forward`).
Charge ids: SQLite allocates them under its one writer's lock, so they become visible in id
order. PostgreSQL draws them from a sequence before the batch's audit head lock, so a charge
may commit after one with a larger id; a watermark there is ``through``, an id below which every
charge had committed or rolled back when read (:func:`settled_id`), and the ids ``applied``
above it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError

from dp_governor.budget.storage.db import write_step
from dp_governor.budget.storage.tables import Account, Charge, ReportSummary
from dp_governor.policies.repository import BOOK_LOCK_KEY

__all__ = [
    "NewCharge",
    "Watermark",
    "account_rows",
    "charges_after",
    "largest_id",
    "settled_id",
    "snapshot",
    "store_row",
]

log = logging.getLogger("dpgov.reporting")
_SUMMARIES = ReportSummary.__table__  # type: ignore[attr-defined]
_CHARGES = Charge.__table__  # type: ignore[attr-defined]
_ACCOUNTS = Account.__table__  # type: ignore[attr-defined]
_KEYS_PER_READ = 500
NewCharge = tuple[int, str, str, str, int, int, int]  # id, device, use case, budget, v, eps, day


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


@contextmanager
def snapshot(engine: Engine) -> Iterator[Connection]:
    """A read transaction on one snapshot (SQLite: a ``BEGIN``; PostgreSQL: REPEATABLE READ)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


def settled_id(engine: Engine) -> int | None:
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


def largest_id(conn: Connection) -> int:
    """The largest charge id the snapshot holds (0: none)."""
    return int(conn.execute(select(func.coalesce(func.max(_CHARGES.c.id), 0))).scalar_one())


def charges_after(conn: Connection, mark: Watermark) -> list[NewCharge]:
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


def account_rows(conn: Connection, keys: list[str]) -> dict[str, tuple[Any, ...]]:
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


def store_row(engine: Engine, values: dict[str, Any]) -> None:
    """Replace the ``report_summaries`` row ``values["name"]`` in one statement (all or none).

    A job's write step (:func:`~dp_governor.budget.storage.db.write_step`): inside a job it
    runs the job's fence first, so a run that lost its lease stores nothing. A database that
    refuses the write (a read-only replica, a lock held past the job's wait) keeps the row it
    had; the figures computed are exact either way.
    """
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    statement = insert(_SUMMARIES).values(**values)
    statement = statement.on_conflict_do_update(
        index_elements=[_SUMMARIES.c.name],
        set_={k: v for k, v in values.items() if k != "name"},
    )
    try:
        with write_step(engine) as conn:
            conn.execute(statement)
    except DBAPIError as exc:
        log.warning("the %s summary was not stored: %s", values["name"], exc.orig)
