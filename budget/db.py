"""Engines for the embedded SQLite default and for PostgreSQL, with the settings the gate needs.

SQLite: WAL journal (readers never block the writer), ``synchronous=NORMAL`` (a commit is durable
at the next checkpoint; the database is never corrupted), a 30 s busy timeout, and write
transactions (through :func:`writer`) opened with ``BEGIN IMMEDIATE`` so that writers serialize
at the start instead of failing on a lock upgrade; pysqlite's own transaction handling is
switched off so that SAVEPOINTs work (the SQLAlchemy recipe). PostgreSQL: psycopg 3, READ
COMMITTED; the gate's ``INSERT ... ON CONFLICT DO UPDATE`` takes the row locks that serialize
one device's charges.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Any

from sqlalchemy import Engine, event, make_url, text
from sqlmodel import SQLModel, create_engine

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "WRITE_OPTION",
    "WalCheckpointer",
    "WriterLock",
    "create_db_engine",
    "init_db",
    "placeholder",
    "scratch_schema",
    "start_checkpointer",
    "writer",
    "writer_lock",
]

WRITE_OPTION = "dpgov_write"


def writer(engine: Engine) -> Engine:
    """The same engine (and pool) whose transactions take SQLite's write lock at BEGIN.

    A transaction that reads and then writes must start with ``BEGIN IMMEDIATE`` on SQLite, or
    it can fail when it upgrades its lock; read-only transactions use a plain ``BEGIN`` and
    never block the writer (WAL).
    """
    return engine.execution_options(**{WRITE_OPTION: True})


class WriterLock:
    """Queues a SQLite file's writers, threads and processes alike, ahead of ``BEGIN IMMEDIATE``.

    SQLite itself serializes writers, but a writer that finds the lock taken sleeps in its busy
    handler (1, 2, 5, 10 ... up to 100 ms between tries) rather than waking when the lock is
    released, so under load the write lock sits idle between transactions and the sleeps are
    the latency tail. Queued here instead, a writer starts the moment the previous one commits:
    on a thread lock within the process, then on ``flock`` of a ``-writer`` file beside the
    database between processes (``dpgov serve --workers N``). Where ``fcntl`` is missing
    (Windows), only the thread lock.
    """

    def __init__(self, path: str) -> None:
        self.database = path
        self.path = path + "-writer"
        self._thread = threading.Lock()
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        self._thread.acquire()
        try:
            if fcntl is not None:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if fcntl is not None and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread.release()


_LOCKS: dict[str, WriterLock] = {}
_LOCKS_GUARD = threading.Lock()


def writer_lock(engine: Engine) -> AbstractContextManager[object]:
    """The lock a hot-path writer holds around its transaction (:class:`WriterLock`).

    One per SQLite file and process, shared by every gate on it; an in-memory SQLite database
    gets a thread lock, PostgreSQL none (its row locks serialize what must be).
    """
    if engine.dialect.name != "sqlite":
        return nullcontext()
    path = engine.url.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return threading.Lock()
    path = os.path.realpath(path)
    with _LOCKS_GUARD:
        found = _LOCKS.get(path)
        if found is None:
            found = _LOCKS[path] = WriterLock(path)
        return found


_NO_AUTOCHECKPOINT = "dpgov_no_autocheckpoint"
log = logging.getLogger(__name__)


class WalCheckpointer:
    """Checkpoints a SQLite file's WAL from a thread of its own, so that writers never do.

    By default the connection whose commit takes the WAL past 1,000 pages copies them into the
    database inside that commit, under the write lock: about 3.6 us a report of a relay's batch,
    and a latency spike for whichever request draws it. Here a daemon thread runs a PASSIVE
    checkpoint every ``interval`` seconds beside the writers (it neither waits for nor blocks
    them). A WAL that keeps growing anyway (writers never pause, so a passive checkpoint never
    finds it fully copied and it never restarts) is truncated once it holds
    ``truncate_bytes``: under the writers' lock, so only the last pages are copied while they
    wait, and with a short busy timeout, so that a long reader delays it instead of the writers.
    """

    def __init__(
        self,
        path: str,
        lock: AbstractContextManager[object],
        *,
        interval: float = 0.05,
        truncate_bytes: int = 64 << 20,
    ) -> None:
        self.path = path
        self.lock = lock
        self.interval = interval
        self.truncate_bytes = truncate_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="dpgov-wal-checkpoint", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread; the last connection's close checkpoints what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def run_once(self) -> tuple[int, int]:
        """One passive checkpoint (and a truncation if due): ``(frames in the WAL, copied)``."""
        if self._conn is None:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA busy_timeout=200")
        conn = self._conn
        _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        if frames * page >= self.truncate_bytes:
            with self.lock:
                busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy:
                log.info("WAL truncation deferred: a reader holds an old snapshot")
        return int(frames), int(copied)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except sqlite3.Error as exc:  # a busy or locked database: the next round retries
                log.warning("WAL checkpoint failed: %s", exc)


def start_checkpointer(engine: Engine) -> WalCheckpointer | None:
    """Move a SQLite file engine's checkpoints to a :class:`WalCheckpointer`; ``None`` if n/a.

    The engine's new connections stop checkpointing at commit (its pool is emptied, so all of
    them are new); stop the checkpointer before disposing of the engine.
    """
    lock = writer_lock(engine)
    if not isinstance(lock, WriterLock):
        return None  # PostgreSQL, or a SQLite database in memory
    engine.dispose()
    engine.update_execution_options(**{_NO_AUTOCHECKPOINT: True})
    checkpointer = WalCheckpointer(lock.database, lock)
    checkpointer.start()
    return checkpointer


def placeholder(engine: Engine) -> str:
    """The driver's parameter marker for raw SQL: ``?`` for sqlite3, ``%s`` for psycopg."""
    return "?" if engine.dialect.paramstyle == "qmark" else "%s"


def create_db_engine(url: str, *, pool_size: int = 10, echo: bool = False) -> Engine:
    """An engine for ``url`` (``sqlite:///path`` or ``postgresql+psycopg://...``)."""
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=pool_size,
            max_overflow=2 * pool_size,
        )
        _configure_sqlite(engine)
        return engine
    if url.startswith("postgresql"):
        return create_engine(
            url, echo=echo, pool_size=pool_size, max_overflow=2 * pool_size, pool_pre_ping=True
        )
    raise ValueError(f"`database_url` must be a sqlite:// or postgresql:// URL, got {url!r}")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA cache_size=-32768")  # 32 MiB of pages per connection
        cursor.execute("PRAGMA mmap_size=268435456")  # read through a 256 MiB memory map
        cursor.execute("PRAGMA foreign_keys=ON")
        if engine.get_execution_options().get(_NO_AUTOCHECKPOINT):
            cursor.execute("PRAGMA wal_autocheckpoint=0")  # a WalCheckpointer's thread does it
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        immediate = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def init_db(engine: Engine) -> None:
    """Create the tables that do not exist yet (ledger, audit and policy tables).

    On PostgreSQL a new ``charges`` is partitioned by day (:mod:`budget.partitions`); a ledger
    made before the packed account state is upgraded (:mod:`budget.migrate`).
    """
    import budget.audit
    import budget.tables  # noqa: F401 - registers the ledger tables
    import policies.model  # noqa: F401 - registers the policy table
    from budget.migrate import migrate_account_state
    from budget.partitions import DAYS_AHEAD, create_partitioned_charges, ensure_partitions

    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            create_partitioned_charges(conn)  # before create_all, which then skips the table
    SQLModel.metadata.create_all(engine)
    migrate_account_state(engine)  # a ledger made before the packed account state
    today = int(time.time() // 86_400)
    ensure_partitions(engine, today - 1, today + DAYS_AHEAD)
    with engine.connect() as conn:
        key = conn.execute(text("SELECT device_key FROM accounts LIMIT 1")).scalar()
    if key is not None and len(key) != 32:
        raise RuntimeError(
            "this database holds device keys in the pre-release 256-bit format; device keys"
            " are now 128-bit, so its budgets would not carry over: start from a new database"
        )


@contextmanager
def scratch_schema(url: str, prefix: str = "scratch") -> Iterator[str]:
    """A throw-away PostgreSQL schema for tests and benchmarks; yields a URL that uses it.

    Every connection made from the yielded URL has ``search_path`` set to the new schema; the
    schema and everything in it is dropped on exit.
    """
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_db_engine(url, pool_size=1)
    try:
        with admin.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        scoped = make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
        try:
            yield scoped.render_as_string(hide_password=False)
        finally:
            with admin.begin() as conn:
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    finally:
        admin.dispose()
