"""The schema in one place: every table the service keeps, brought to this release by migrations.

The tables are created and changed only by the Alembic revisions in
:mod:`dp_governor.budget.storage.migrations` (configured here, no ``alembic.ini``).
:func:`upgrade_db` runs the missing ones in one transaction under a lock (PostgreSQL: an advisory
lock; SQLite: the write lock), so concurrent starts run them once. :func:`init_db` upgrades (or,
with ``upgrade=False``, only creates a new database and refuses an out-of-date one), then creates
the days' partitions ahead. Importing this module registers every ledger table on SQLModel's
metadata (ledger, audit log, shuffled batches, policies, device budgets, key fingerprints).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, inspect, text

import dp_governor.budget.storage.tables
import dp_governor.policies.device
import dp_governor.policies.model  # noqa: F401 - registers the policy table
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.partitions import DAYS_AHEAD, ensure_partitions

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["SchemaOutdated", "head_revision", "init_db", "schema_revision", "upgrade_db"]

MIGRATIONS = Path(__file__).with_name("migrations")
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('dpgov:schema-migrations'))"


class SchemaOutdated(RuntimeError):
    """The database's schema is behind this release's: ``dpgov db upgrade`` brings it up."""

    def __init__(self, current: str | None, head: str) -> None:
        self.current = current
        self.head = head
        at = f"revision {current}" if current else "the layout of a release before migrations"
        super().__init__(
            f"the database schema is at {at}, this release needs revision {head}: stop the"
            " service, back the database up and run `dpgov db upgrade` (docs/operations.md)"
        )


def alembic_config(connection: Connection | None = None, **attributes: Any) -> Config:
    """Alembic's configuration for the packaged migrations, on ``connection`` if given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = connection
    config.attributes.update(attributes)
    return config


def head_revision() -> str:
    """The revision this release's schema is at (the newest migration)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def schema_revision(conn: Connection) -> str | None:
    """The database's revision; ``None`` for a new database or one made before migrations."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _is_empty(conn: Connection) -> bool:
    """Whether the database holds none of the service's tables (nothing to lose)."""
    return not inspect(conn).has_table("audit_log") and not inspect(conn).has_table("accounts")


def upgrade_db(engine: Engine, *, existing: bool = True) -> str | None:
    """Run the missing migrations in one transaction; returns the revision found before.

    ``existing=False`` upgrades only a new (empty) database and raises :class:`SchemaOutdated`
    for one that holds a ledger behind this release. The lock makes a concurrent start wait and
    then find the schema current.
    """
    from alembic import command

    head = head_revision()
    with engine.connect() as conn:
        if schema_revision(conn) == head:
            return head
    with writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(_LOCK))
        found = schema_revision(conn)
        if found == head:
            return found
        if not existing and not _is_empty(conn):
            raise SchemaOutdated(found, head)
        command.upgrade(alembic_config(conn), "head")
    return found


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at this release's revision."""
    head = head_revision()
    with engine.connect() as conn:
        found = schema_revision(conn)
    if found != head:
        raise SchemaOutdated(found, head)


def init_db(engine: Engine, *, upgrade: bool = True) -> None:
    """Bring the schema to this release's revision, then create the days' partitions ahead.

    ``upgrade=False`` (``dpgov serve`` on PostgreSQL) creates a new database but refuses one
    that holds a ledger behind this release (:class:`SchemaOutdated`): upgrading is the
    operator's step, ``dpgov db upgrade``.
    """
    upgrade_db(engine, existing=upgrade)
    today = int(time.time() // 86_400)
    ensure_partitions(engine, today - 1, today + DAYS_AHEAD)
    with engine.connect() as conn:
        key = conn.execute(text("SELECT device_key FROM accounts LIMIT 1")).scalar()
    if key is not None and len(key) != 32:
        raise RuntimeError(
            "this database holds device keys in the pre-release 256-bit format; device keys"
            " are now 128-bit, so its budgets would not carry over: start from a new database"
        )
