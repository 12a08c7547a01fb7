"""PostgreSQL: the charges table partitioned by UTC day, so retention drops whole days.

A new PostgreSQL database gets ``charges`` as ``PARTITION BY RANGE (day)`` with one partition
per day (``charges_d<day>``), created ahead by :func:`ensure_partitions` (at start-up and by the
daily purge job), and a default partition that catches a day nobody created yet. Creating a
day's partition moves that day's rows out of the default first, so it always succeeds. The purge
drops partitions whose whole day is past every use case's window (one catalog operation, instead
of deleting millions of rows one by one) and deletes rows only where windows differ.

The gate never reads ``charges``: its checks read one ``accounts`` row (primary key
``device_key, budget``, :mod:`dp_governor.budget.rule.state`); an accepted charge is one insert,
routed to its day's partition. SQLite and databases created before partitioning keep one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from dp_governor.budget.storage.db import write_step

__all__ = [
    "DroppedDays",
    "create_partitioned_charges",
    "drop_days_through",
    "ensure_partitions",
    "is_partitioned",
    "partition_days",
]

_DDL = """
CREATE TABLE charges (
    id BIGSERIAL NOT NULL,
    device_key VARCHAR(64) NOT NULL,
    use_case VARCHAR(63) NOT NULL,
    budget VARCHAR(63) NOT NULL,
    policy_version INTEGER NOT NULL,
    epsilon_micro BIGINT NOT NULL,
    day INTEGER NOT NULL,
    idempotency_key VARCHAR(255),
    PRIMARY KEY (id, day)
) PARTITION BY RANGE (day)
"""
_INDEXES = (
    "CREATE INDEX ix_charges_day ON charges (day)",
    "CREATE INDEX ix_charges_use_case_day ON charges (use_case, day, id)",
)
DAYS_AHEAD = 14


def is_partitioned(conn: Connection) -> bool:
    """Whether this database's ``charges`` (in the current schema) is partitioned."""
    if conn.dialect.name != "postgresql":
        return False
    found = conn.execute(
        text(
            "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
            " WHERE c.relname = 'charges' AND c.relnamespace = current_schema()::regnamespace"
        )
    ).first()
    return found is not None


def create_partitioned_charges(conn: Connection) -> bool:
    """Create the partitioned ``charges`` with its default partition, unless it exists."""
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('dpgov:charges-partitions'))"))
    exists = conn.execute(text("SELECT to_regclass('charges') IS NOT NULL")).scalar_one()
    if exists:
        return False
    conn.execute(text(_DDL))
    for index in _INDEXES:
        conn.execute(text(index))
    conn.execute(text("CREATE TABLE charges_default PARTITION OF charges DEFAULT"))
    return True


def partition_days(conn: Connection) -> list[int]:
    """The days that have their own partition, ascending."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent"
            " WHERE p.relname = 'charges' AND p.relnamespace = current_schema()::regnamespace"
        )
    ).scalars()
    days = (name.removeprefix("charges_d") for name in rows)
    return sorted(int(d) for d in days if d.isdigit())


def _create_day(conn: Connection, day: int) -> None:
    """Create one day's partition, moving that day's rows out of the default partition."""
    name = f"charges_d{int(day)}"
    conn.execute(text(f"CREATE TABLE {name} (LIKE charges INCLUDING DEFAULTS)"))
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM charges_default WHERE day = :day RETURNING *)"
            f" INSERT INTO {name} SELECT * FROM moved"
        ),
        {"day": day},
    )
    conn.execute(
        text(f"ALTER TABLE charges ATTACH PARTITION {name} FOR VALUES FROM ({day}) TO ({day + 1})")
    )


def ensure_partitions(
    engine: Engine, first_day: int, last_day: int, *, job: bool = False
) -> list[int]:
    """Create the missing day partitions of ``first_day..last_day``; returns the days created.

    Each day is its own short transaction; ``job``: a job's (the purge's), whose lock waits are
    bounded and which its lease fences (:func:`dp_governor.budget.storage.db.write_step`), where a
    start waits as long as it takes. A no-op on SQLite and on unpartitioned tables.
    """
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        if not is_partitioned(conn):
            return []
        have = set(partition_days(conn))
    created = []
    for day in range(first_day, last_day + 1):
        if day in have:
            continue
        with write_step(engine) if job else engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('dpgov:charges-partitions'))"))
            if day in partition_days(conn):  # another process made it meanwhile
                continue
            _create_day(conn, day)
        created.append(day)
    return created


@dataclass(frozen=True, slots=True)
class DroppedDays:
    """Partitions dropped by :func:`drop_days_through` and the charges they held."""

    days: list[int]
    charges: int


def drop_days_through(conn: Connection, last_day: int) -> DroppedDays:
    """Drop every day partition up to ``last_day`` (in the caller's transaction)."""
    days = [d for d in partition_days(conn) if d <= last_day]
    total = sum(
        int(conn.execute(text(f"SELECT count(*) FROM charges_d{day}")).scalar_one()) for day in days
    )
    for day in days:  # after every count: a drop locks the parent table until the commit
        conn.execute(text(f"DROP TABLE charges_d{day}"))
    return DroppedDays(days, total)
