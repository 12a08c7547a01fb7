"""The schema in one place: every table the service keeps, created and upgraded by :func:`init_db`.

Importing this module registers every table on SQLModel's metadata (ledger, audit log, policies,
key fingerprints), so it sits above the rest of :mod:`budget.storage` and nothing below imports it.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine, text
from sqlmodel import SQLModel

import budget.audit_log
import budget.storage.tables
import policies.model  # noqa: F401 - registers the policy table
from budget.storage.migrate import migrate_ledger
from budget.storage.partitions import DAYS_AHEAD, create_partitioned_charges, ensure_partitions

__all__ = ["init_db"]


def init_db(engine: Engine) -> None:
    """Create the tables that do not exist yet (ledger, audit, policy and metadata tables).

    On PostgreSQL a new ``charges`` is partitioned by day (:mod:`budget.storage.partitions`); a
    ledger made by an earlier release is upgraded (:mod:`budget.storage.migrate`).
    """
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            create_partitioned_charges(conn)  # before create_all, which then skips the table
    SQLModel.metadata.create_all(engine)
    migrate_ledger(engine)  # a ledger made by an earlier release
    budget.central.add_missing_columns(engine)
    today = int(time.time() // 86_400)
    ensure_partitions(engine, today - 1, today + DAYS_AHEAD)
    with engine.connect() as conn:
        key = conn.execute(text("SELECT device_key FROM accounts LIMIT 1")).scalar()
    if key is not None and len(key) != 32:
        raise RuntimeError(
            "this database holds device keys in the pre-release 256-bit format; device keys"
            " are now 128-bit, so its budgets would not carry over: start from a new database"
        )
