"""Engines for the embedded SQLite default and for PostgreSQL, with the settings the gate needs.

SQLite: WAL journal (readers never block the writer), ``synchronous=NORMAL`` (a commit is durable
at the next checkpoint; the database is never corrupted), ``secure_delete`` (deleted content is
zeroed, whatever the platform's build defaults to), a busy timeout (30 s by default), and write
transactions (through :func:`writer`) opened with ``BEGIN IMMEDIATE`` so that writers
serialize at the start instead of failing on a lock upgrade; pysqlite's own transaction handling
is switched off so that SAVEPOINTs work (the SQLAlchemy recipe). PostgreSQL: psycopg 3, READ
COMMITTED; the gate's ``INSERT ... ON CONFLICT DO UPDATE`` takes the row locks that serialize
one device's charges.

A job's write transactions (:func:`write_step`) wait for locks at most ``job_lock_seconds``
(SQLite: the busy timeout of that transaction; PostgreSQL: ``lock_timeout``, and
``idle_in_transaction_session_timeout`` so that a job process stopped inside a transaction
loses its session, and its locks, after as long), and each first runs the job's fence
(:func:`fenced`): the check that the job still holds its lease.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    Select,
    String,
    Table,
    delete,
    event,
    inspect,
    literal,
    make_url,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel, create_engine

__all__ = [
    "DEFAULT_JOB_LOCK_SECONDS",
    "JOB_LOCK_OPTION",
    "JOB_PAUSE_OPTION",
    "META_TABLE",
    "PAUSE_FACTOR",
    "ROWS_PER_INSERT",
    "WRITE_OPTION",
    "Fence",
    "bound_lock_wait",
    "create_db_engine",
    "delete_keys",
    "delete_pages",
    "fenced",
    "insert_rows",
    "is_busy",
    "job_lock_seconds",
    "job_writer",
    "key_fingerprint",
    "page_query",
    "placeholder",
    "raw_cursor",
    "record_fingerprints",
    "scratch_schema",
    "stored_fingerprints",
    "write_step",
    "writer",
]

WRITE_OPTION = "dpgov_write"

# Facts about the database itself: the fingerprints of the keys it was initialised with.
META_TABLE = Table(
    "dpgov_meta",
    SQLModel.metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(200), nullable=False),
)
# Not valid UTF-8, so no device id (text) or audit hash (hex text) is ever HMACed to the same tag.
_FINGERPRINT_LABEL = b"\xffdp-governor/key-fingerprint/v1"


def writer(engine: Engine) -> Engine:
    """The same engine (and pool) whose transactions take SQLite's write lock at BEGIN.

    A transaction that reads and then writes must start with ``BEGIN IMMEDIATE`` on SQLite, or
    it can fail when it upgrades its lock; read-only transactions use a plain ``BEGIN`` and
    never block the writer (WAL).
    """
    return engine.execution_options(**{WRITE_OPTION: True})


_BUSY_SQLSTATES = frozenset({"55P03", "40P01", "40001"})  # lock timeout, deadlock, serialization
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says the database was busy (a lock not granted in time), not broken.

    SQLite: ``SQLITE_BUSY`` or ``SQLITE_LOCKED`` ("database is locked") after the busy timeout.
    PostgreSQL: a lock timeout, a deadlock or a serialization failure. Such a transaction wrote
    nothing and may simply be run again.
    """
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return getattr(orig, "sqlstate", None) in _BUSY_SQLSTATES


def delete_keys(
    conn: Connection, table: Table, key: Sequence[ColumnElement[Any]], keys: Sequence[Any]
) -> int:
    """Delete ``table``'s rows whose ``key`` columns hold one of ``keys``; how many went.

    ``keys`` are values of the one column, or tuples of the columns' values.
    """
    if not keys:
        return 0
    match = key[0].in_(keys) if len(key) == 1 else tuple_(*key).in_(keys)
    return int(conn.execute(delete(table).where(match)).rowcount)


def page_query(
    order: Sequence[ColumnElement[Any]],
    where: ColumnElement[bool],
    after: Sequence[Any] | None,
    rows: int,
) -> Select[Any]:
    """The next page of :func:`delete_pages`: ``rows`` entries of ``order`` after ``after``."""
    query = select(*order).where(where)
    if after is not None:
        query = query.where(tuple_(*order) > tuple_(*(literal(v) for v in after)))
    return query.order_by(*order).limit(rows)


def delete_pages(
    engine: Engine,
    table: Table,
    order: Sequence[ColumnElement[Any]],
    where: ColumnElement[bool],
    rows: int,
    *,
    key: int = 1,
    before: Callable[[Connection], bool] | None = None,
    last: Callable[[Connection], None] | None = None,
) -> int:
    """Delete the rows ``where`` selects, a page of ``rows`` a transaction; how many went.

    ``order`` are an index's columns whose last ``key`` are the primary key: each page is the
    first ``rows`` entries of that index range, so reads and memory are proportional to the
    page, never to what is left. On SQLite a page is one statement in one job transaction
    (:func:`write_step`), ``DELETE ... WHERE key IN (SELECT key ... ORDER BY order LIMIT rows)``:
    the range's start is the page (deleted entries are gone at once), and no key travels
    through Python. On PostgreSQL the page's keys are read outside any write transaction,
    then deleted by primary key in one job transaction; a page starts after the previous
    page's last entry (keyset pagination: its index keeps deleted entries until vacuum, and a
    row comparison bounds an index range there). ``before`` runs first in each transaction
    (``False``: stop, nothing more deleted); ``last`` runs in the transaction of the last page.
    """
    if engine.dialect.name == "sqlite":
        return _delete_pages_inline(engine, table, order, where, rows, key, before, last)
    after: tuple[Any, ...] | None = None
    deleted = 0
    while True:
        with engine.connect() as conn:
            page = [tuple(r) for r in conn.execute(page_query(order, where, after, rows))]
        with write_step(engine) as conn:
            if before is not None and not before(conn):
                return deleted
            keys = [r[-1] if key == 1 else r[-key:] for r in page]
            deleted += delete_keys(conn, table, order[-key:], keys)
            if len(page) < rows and last is not None:
                last(conn)
        if len(page) < rows:
            return deleted
        after = page[-1]


def _delete_pages_inline(
    engine: Engine,
    table: Table,
    order: Sequence[ColumnElement[Any]],
    where: ColumnElement[bool],
    rows: int,
    key: int,
    before: Callable[[Connection], bool] | None,
    last: Callable[[Connection], None] | None,
) -> int:
    """:func:`delete_pages` on SQLite: each page one ``DELETE`` whose subquery picks its keys.

    Fetching a page's keys and sending them back as an ``IN`` list cost about as much CPU as
    deleting the rows (some 4 us a row, in the driver and SQLAlchemy's expansion of the list).
    """
    columns = order[-key:]
    picked = page_query(order, where, None, rows).with_only_columns(*columns)
    match = columns[0].in_(picked) if key == 1 else tuple_(*columns).in_(picked)
    statement = delete(table).where(match)
    deleted = 0
    while True:
        with write_step(engine) as conn:
            if before is not None and not before(conn):
                return deleted
            done = int(conn.execute(statement).rowcount)
            if done < rows and last is not None:
                last(conn)
        deleted += done
        if done < rows:
            return deleted


# By default a job pauses this many times as long as each of its write transactions held
# SQLite's lock (the engine's ``JOB_PAUSE_OPTION`` execution option overrides it).
PAUSE_FACTOR = 2.0
JOB_PAUSE_OPTION = "dpgov_job_pause"
# How long a job's transaction waits for a lock (the engine's ``JOB_LOCK_OPTION`` overrides it).
DEFAULT_JOB_LOCK_SECONDS = 10.0
JOB_LOCK_OPTION = "dpgov_job_lock"
_JOB_WRITE_OPTION = "dpgov_job_write"  # on a job's write connection: SQLite's begin bounds its wait

Fence = Callable[[Connection], None]
_FENCE: ContextVar[Fence | None] = ContextVar("dpgov_job_fence", default=None)


@contextmanager
def fenced(check: Fence) -> Iterator[None]:
    """Run ``check`` first in every :func:`write_step` of the block (this thread or task).

    The job runner's fencing (``dp_governor.api.jobs``): ``check`` raises, in the transaction, when
    the job's lease has been taken over since it started, so a process that stalled past its
    lease writes nothing more once another holds it. A context variable rather than a
    parameter threaded through every job's functions: what a job writes is the same with or
    without a lease (tests and benchmarks call the pipeline's functions directly), only who
    may write changes.
    """
    reset = _FENCE.set(check)
    try:
        yield
    finally:
        _FENCE.reset(reset)


def job_lock_seconds(engine: Engine) -> float:
    """How long the engine's job transactions wait for a lock (:data:`JOB_LOCK_OPTION`)."""
    return float(engine.get_execution_options().get(JOB_LOCK_OPTION, DEFAULT_JOB_LOCK_SECONDS))


def bound_lock_wait(conn: Connection, seconds: float) -> None:
    """Bound how long ``conn``'s transaction waits for locks, and may sit idle (PostgreSQL).

    ``SET LOCAL`` (this transaction only): ``lock_timeout`` fails a statement that waited that
    long for a lock (SQLSTATE 55P03, :func:`is_busy`), and
    ``idle_in_transaction_session_timeout`` ends the session of a process that stopped inside
    the transaction (a hung job), releasing the locks it held. SQLite's bound is its busy
    timeout, set when the transaction begins (:func:`write_step`).
    """
    if conn.dialect.name != "postgresql":
        return
    ms = max(1, round(seconds * 1000))
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
    conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {ms}")


def job_writer(engine: Engine) -> Engine:
    """:func:`writer` for a job's transactions: SQLite waits ``job_lock_seconds`` for its lock.

    On PostgreSQL the bound is set inside each transaction (:func:`bound_lock_wait`).
    """
    return writer(engine).execution_options(**{_JOB_WRITE_OPTION: True})


@contextmanager
def write_step(engine: Engine) -> Iterator[Connection]:
    """One short write transaction of a job's many, then (SQLite) a pause twice as long.

    The transaction waits for locks at most ``job_lock_seconds`` (:func:`bound_lock_wait`;
    then it fails as :func:`is_busy`), and runs the job's fence first if one is set
    (:func:`fenced`).

    SQLite gives its write lock to whichever connection asks once it is free, and a writer
    that found it taken polls (its busy handler sleeps 1, 2, 5, 10, ... up to 100 ms): a job
    that began its next transaction at once would take the lock back before a waiting request
    polls again, however short each transaction. Pausing twice as long as the transaction
    lasted (:data:`PAUSE_FACTOR`) leaves the lock free two thirds of the time, so a waiting
    writer gets it within about one of the job's transactions; the price is a job that takes
    about three times as long. ``create_db_engine(job_pause=...)`` sets another factor (0: no
    pause, for a database nothing else writes to while jobs run). PostgreSQL locks rows, not
    the database: no pause.
    """
    started = time.monotonic()
    with job_writer(engine).begin() as conn:
        bound_lock_wait(conn, job_lock_seconds(engine))
        check = _FENCE.get()
        if check is not None:
            check(conn)
        yield conn
    if engine.dialect.name == "sqlite":
        factor = engine.get_execution_options().get(JOB_PAUSE_OPTION, PAUSE_FACTOR)
        if factor:
            time.sleep(factor * (time.monotonic() - started))


_CURSORS = "dpgov_cursors"  # the connection record's driver cursors, closed at its release


def raw_cursor(conn: Connection) -> Any:
    """A cursor of the driver's connection under ``conn``, closed when ``conn`` is released.

    Plain SQL sent through the driver skips SQLAlchemy's statement building on hot paths. A
    driver cursor left open outlives the checkout (in the frame that made it, or a traceback)
    and, freed later, resets its prepared statement while another thread that the pool has
    given the connection to runs the same cached statement: SQLite answers "bad parameter or
    other API misuse" (``InterfaceError``). The engine's pool therefore closes every such
    cursor as the connection goes back to it, in the thread that held it (:func:`_close_cursors`).
    """
    held = conn.connection
    cursor = held.driver_connection.cursor()  # type: ignore[union-attr]
    held.info.setdefault(_CURSORS, []).append(cursor)
    return cursor


def _close_cursors(dbapi: Any, record: Any) -> None:
    """Close the cursors :func:`raw_cursor` made on a connection returning to the pool.

    An invalidated connection (``dbapi`` None) was closed with its cursors.
    """
    cursors = record.info.pop(_CURSORS, ())
    if dbapi is not None:
        for cursor in cursors:
            cursor.close()


def placeholder(engine: Engine) -> str:
    """The driver's parameter marker for raw SQL: ``?`` for sqlite3, ``%s`` for psycopg."""
    return "?" if engine.dialect.paramstyle == "qmark" else "%s"


def create_db_engine(
    url: str,
    *,
    pool_size: int = 10,
    echo: bool = False,
    busy_seconds: float = 30.0,
    job_pause: float = PAUSE_FACTOR,
    job_lock_seconds: float = DEFAULT_JOB_LOCK_SECONDS,
) -> Engine:
    """An engine for ``url`` (``sqlite:///path`` or ``postgresql+psycopg://...``).

    ``busy_seconds`` (SQLite) is how long a statement waits for a lock another connection
    holds before it fails with "database is locked"; ``job_pause`` (SQLite) how long a job
    pauses after each of its write transactions, as a multiple of its time (:func:`write_step`);
    ``job_lock_seconds`` how long a job's transaction waits for a lock, on either backend.
    """
    if job_pause < 0 or job_pause != job_pause:
        raise ValueError(f"`job_pause` must be a number >= 0, got {job_pause!r}")
    if not job_lock_seconds > 0:
        raise ValueError(f"`job_lock_seconds` must be a number > 0, got {job_lock_seconds!r}")
    options = {JOB_PAUSE_OPTION: float(job_pause), JOB_LOCK_OPTION: float(job_lock_seconds)}
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": busy_seconds},
            pool_size=pool_size,
            max_overflow=2 * pool_size,
            execution_options=options,
        )
        _configure_sqlite(engine, busy_seconds)
        event.listen(engine, "checkin", _close_cursors)
        return engine
    if url.startswith("postgresql"):
        engine = create_engine(
            url,
            echo=echo,
            pool_size=pool_size,
            max_overflow=2 * pool_size,
            pool_pre_ping=True,
            execution_options=options,
            # No server-side prepared statements: psycopg prepares a statement on its fifth
            # run and forgets them all at every ROLLBACK (``DEALLOCATE ALL``), and the pool
            # rolls back every connection it takes back, so each report paid a PREPARE round
            # trip per statement and a DEALLOCATE. Unnamed statements are one round trip each.
            connect_args={"prepare_threshold": None},
        )
        event.listen(engine, "checkin", _close_cursors)
        return engine
    raise ValueError(f"`database_url` must be a sqlite:// or postgresql:// URL, got {url!r}")


def _configure_sqlite(engine: Engine, busy_seconds: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={round(busy_seconds * 1000)}")
        cursor.execute("PRAGMA cache_size=-32768")  # 32 MiB of pages per connection
        cursor.execute("PRAGMA mmap_size=268435456")  # read through a 256 MiB memory map
        cursor.execute("PRAGMA foreign_keys=ON")
        # deleted rows' bytes are overwritten with zeros, not left in the page until reused: a
        # copy of the file holds no report, plan or clear inbox row the service deleted (set
        # here, not left to the build's default, which varies between platforms)
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()

    default_ms = round(busy_seconds * 1000)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        options = connection.get_execution_options()
        immediate = options.get(WRITE_OPTION, False)
        # A job's write waits job_lock_seconds for the lock (at most busy_seconds), everything
        # else busy_seconds; the pragma is sent only when this connection's timeout changes.
        ms = default_ms
        if immediate and options.get(_JOB_WRITE_OPTION, False):
            job = round(float(options.get(JOB_LOCK_OPTION, DEFAULT_JOB_LOCK_SECONDS)) * 1000)
            ms = min(ms, job)
        held = connection.connection.info
        if held.get("dpgov_busy_ms", default_ms) != ms:
            connection.connection.driver_connection.execute(f"PRAGMA busy_timeout={ms}")
            held["dpgov_busy_ms"] = ms
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def key_fingerprint(key: bytes) -> str:
    """``HMAC-SHA256(key, label)`` in hex: tells keys apart, reveals nothing usable about one.

    An HMAC under the key of a fixed label is a pseudorandom function's output: it identifies the
    key without letting anyone who reads the database derive it or any tag it makes.
    """
    return hmac.digest(key, _FINGERPRINT_LABEL, "sha256").hex()


def stored_fingerprints(engine: Engine) -> dict[str, str] | None:
    """The fingerprints recorded in the database, or ``None`` when it has no metadata table.

    Reads only: an uninitialised database (or one made before fingerprints) is left as it is.
    """
    if not inspect(engine).has_table(META_TABLE.name):
        return None
    with engine.connect() as conn:
        rows = conn.execute(select(META_TABLE.c.name, META_TABLE.c.value)).all()
    return {str(name): str(value) for name, value in rows}


def record_fingerprints(engine: Engine, fingerprints: Mapping[str, str]) -> dict[str, str]:
    """Record each fingerprint not recorded yet (never overwriting one); return all recorded.

    Two processes that start at once on a new database both insert; the first wins and the
    caller compares what it holds against what the database returns.
    """
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    with writer(engine).begin() as conn:
        for name, value in fingerprints.items():
            conn.execute(insert(META_TABLE).values(name=name, value=value).on_conflict_do_nothing())
        rows = conn.execute(select(META_TABLE.c.name, META_TABLE.c.value)).all()
    return {str(name): str(value) for name, value in rows}


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


ROWS_PER_INSERT = 200  # SQLite: 800 parameters a statement, well under its limit of 32,766


def insert_rows(cur: Any, ph: str, into: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` into ``into`` (``table (columns)``) with the fewest statements.

    PostgreSQL (``%s`` marker): one ``COPY ... FROM STDIN``, a fraction of the client and
    server CPU of row-by-row inserts. SQLite: multi-row ``INSERT ... VALUES``, a statement
    per :data:`ROWS_PER_INSERT` rows, half the CPU of ``executemany``.
    """
    if not rows:
        return
    if ph == "%s":
        with cur.copy(f"COPY {into} FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    marks = "(" + ", ".join([ph] * len(rows[0])) + ")"
    for start in range(0, len(rows), ROWS_PER_INSERT):
        part = rows[start : start + ROWS_PER_INSERT]
        cur.execute(
            f"INSERT INTO {into} VALUES {', '.join([marks] * len(part))}",
            [value for row in part for value in row],
        )
