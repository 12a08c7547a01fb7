"""The gate: what the charge transaction reads through, prepared once per ledger.

The transaction itself is :func:`dp_governor.budget.gate.charge.charge_batch` (a single report is a
batch of one, :meth:`dp_governor.budget.ledger.Ledger.charge`): the policy book
(:mod:`dp_governor.budget.rule.book`), the devices' rows locked and read, each report decided in
order by the rule (:mod:`dp_governor.budget.rule.decide`), then the rows, the charges, the caller's
inbox rows and the audit entries written before commit. This module holds its parts: device
pseudonyms, the keyed forms of idempotency data, the cached policy book, the hot path's statements
and the write lock.
"""

from __future__ import annotations

import hmac
import threading
from contextlib import AbstractContextManager, nullcontext

from sqlalchemy import Connection, Engine

from dp_governor.budget.audit.log import AuditLog
from dp_governor.budget.errors import UnknownUseCase
from dp_governor.budget.keyed import KeyedHash
from dp_governor.budget.rule.book import PolicyBook, Terms
from dp_governor.budget.storage.db import placeholder, raw_cursor, writer
from dp_governor.budget.storage.tables import RetentionHorizon
from dp_governor.policies.device import device_budget_versions, limits_of
from dp_governor.policies.repository import BOOK_LOCK_KEY, PolicyStore

__all__ = ["Gate", "InternalError", "device_key", "load_book"]


def device_key(secret: bytes, device_id: str) -> str:
    """The device's pseudonym: ``HMAC-SHA256(secret, device id)`` truncated to 128 bits, hex.

    The id is never stored. 128 bits keep collisions out of reach (about 1e-21 for 1e9
    devices) and halve every ledger index against the full 256.
    """
    return hmac.digest(secret, device_id.encode("utf-8"), "sha256")[:16].hex()


class InternalError(AssertionError):
    """A broken invariant: the database disagreed with a decision made under its lock."""


class Gate:
    """The charge transaction's shared parts: engine, keys, policy book, statements."""

    def __init__(self, engine: Engine, secret: bytes, audit: AuditLog) -> None:
        if len(secret) < 32:
            raise ValueError("the device-key secret must be at least 32 bytes")
        self.engine = writer(engine)
        self.audit = audit
        self._keyed = KeyedHash(secret)  # the key's setup done once, not per device
        # Idempotency keys and request fingerprints are stored only under their own key,
        # derived from the device secret (never in the database): a reader of the database
        # alone can neither hash a stored report to find its record nor read a client's key.
        # The label starts with NUL, which no device id may hold, so no device's pseudonym
        # (the same HMAC under the same secret) is ever part of this key.
        self._idem = KeyedHash(hmac.digest(secret, b"\0dp-governor/idempotency/v1", "sha256"))
        ph = placeholder(engine)
        self.postgres = engine.dialect.name == "postgresql"
        self._statements = {k: v.replace("?", ph) for k, v in _HOT_PATH.items()}
        self._statements["book_lock"] = f"SELECT pg_advisory_xact_lock_shared({BOOK_LOCK_KEY})"
        self._statements["begin"] = "BEGIN ISOLATION LEVEL READ COMMITTED"
        self._book: tuple[tuple[int, int], PolicyBook] | None = None
        # SQLite has one writer at a time: queue this process's writers on a lock instead of
        # letting them spin in SQLite's busy handler, whose sleeps (up to 100 ms) are the tail.
        self.write_lock: AbstractContextManager[object] = (
            threading.Lock() if engine.dialect.name == "sqlite" else nullcontext()
        )

    def device_key(self, device_id: str) -> str:
        """The stored pseudonym of ``device_id`` (:func:`device_key`, from a keyed HMAC state)."""
        return self._keyed.digest(device_id.encode("utf-8"))[:16].hex()

    def idempotency_key(self, dk: str, key: str) -> str:
        """The stored form of a device's idempotency key (keyed, 128 bits, hex)."""
        return self._idem.digest(f"key\0{dk}\0{key}".encode())[:16].hex()

    def fingerprint(self, use_case: str, request_hash: str | None) -> str:
        """The stored fingerprint of a request (its use case and body hash), keyed, hex."""
        return self._idem.digest(f"request\0{use_case}\0{request_hash or ''}".encode()).hex()

    def sql(self, name: str) -> str:
        """A hot-path statement in the driver's parameter style (prepared once per gate)."""
        return self._statements[name]

    def revision(self, conn: Connection) -> tuple[int, int]:
        """The policy book's revision: (number of versions, sum of horizons); one cheap query.

        Policy and device-budget versions are only ever added and horizons only ever rise, so
        the pair changes with every change that matters to a decision or a figure.
        """
        cursor = raw_cursor(conn)
        cursor.execute(self.sql("revision"))
        revision = cursor.fetchone()
        return int(revision[0]), int(revision[1])

    def book(self, conn: Connection) -> PolicyBook:
        """The policy book as of this transaction, rebuilt only when its :meth:`revision` moves."""
        return self.book_at(conn, self.revision(conn))

    def book_at(self, conn: Connection, revision: tuple[int, int]) -> PolicyBook:
        """The policy book at ``revision``, just read in ``conn``'s transaction (rebuilt if new)."""
        cached = self._book
        if cached is None or cached[0] != revision:
            cached = (revision, load_book(conn))
            self._book = cached
        return cached[1]

    def cached_book(self) -> tuple[tuple[int, int], PolicyBook] | None:
        """The revision and book last read, with no query (``None`` before the first read).

        What validation and the charge's guesses go by: the charge reads the revision under
        its lock and decides on the book in force.
        """
        return self._book

    def transaction(self, conn: Connection) -> AbstractContextManager[object]:
        """The charge's transaction on ``conn``, fresh from the pool.

        SQLite: ``BEGIN IMMEDIATE`` (:func:`~dp_governor.budget.storage.db.writer`). PostgreSQL:
        the charge sends ``BEGIN`` in its first :meth:`trip` and ``COMMIT`` in its last, so the
        driver is left in autocommit (psycopg would wait for its own ``BEGIN`` before the first
        trip); an error still rolls back.
        """
        if self.postgres:
            conn.execution_options(isolation_level="AUTOCOMMIT")
        return conn.begin()

    def trip(self, conn: Connection) -> AbstractContextManager[object]:
        """Statements sent together and answered in one round trip.

        PostgreSQL: psycopg's pipeline mode, whose exit waits for every answer (a cursor read
        inside waits for the answers so far). SQLite runs in the process: nothing to group.
        """
        if not self.postgres:
            return nullcontext()
        return conn.connection.driver_connection.pipeline()  # type: ignore[union-attr,no-any-return]

    def terms(self, conn: Connection, use_case: str) -> Terms:
        """The terms of ``use_case``'s current policy, from the book."""
        terms = self.book(conn).terms.get(use_case)
        if terms is None:
            raise UnknownUseCase(use_case)
        return terms


def load_book(conn: Connection) -> PolicyBook:
    """The policy book read in ``conn``'s transaction (every version, every horizon)."""
    horizons = RetentionHorizon.__table__  # type: ignore[attr-defined]
    versions = PolicyStore.all_versions_in(conn)
    held = {str(r[0]): int(r[1]) for r in conn.execute(horizons.select())}
    device = device_budget_versions(conn)
    window = max((v.window_days or 0 for v in device), default=0)
    return PolicyBook.build(versions, held, limits_of(device[-1] if device else None), window)


# The hot path as plain SQL that SQLite (>= 3.35) and PostgreSQL both accept; "?" is replaced by
# the driver's placeholder. Prepared once per gate; SQLAlchemy's statement building costs more
# than the database work here.
_HOT_PATH = {
    "revision": (
        "SELECT (SELECT count(*) FROM policies) + (SELECT count(*) FROM device_budgets),"
        " (SELECT coalesce(sum(through_day), 0) FROM retention_horizons)"
    ),
    "insert_state": (
        "INSERT INTO accounts (device_key, count, epsilon_micro, days, lifetime)"
        " VALUES (?, 0, 0, '[]', '[]') ON CONFLICT (device_key) DO NOTHING"
    ),
    # compare-and-set on the count read under the lock (a new row on SQLite: 0, inserted)
    "write_state": (
        "INSERT INTO accounts (device_key, count, epsilon_micro, days, lifetime,"
        " oldest_day) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (device_key) DO UPDATE"
        " SET count = excluded.count, epsilon_micro = excluded.epsilon_micro,"
        " days = excluded.days, lifetime = excluded.lifetime, oldest_day = excluded.oldest_day"
        " WHERE accounts.count = ?"
    ),
    "decide_key": "UPDATE idempotency SET decision = ?, day = ? WHERE device_key = ? AND key = ?",
}
