"""What ``dpgov db current`` and ``dpgov db history`` say: read from the database, never written.

Both only read (no table created, no partition, no fingerprint recorded), so they answer on a
read-only connection, on a replica, and on a database that holds no ledger at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, inspect, text

from dp_governor.budget.storage.db import META_TABLE
from dp_governor.budget.storage.schema import alembic_config, head_revision

__all__ = ["Migration", "SchemaStatus", "migrations", "schema_status"]

_KEYS = ("device_key_secret", "audit_key", "shuffler_key")


@dataclass(frozen=True, slots=True)
class Migration:
    """One revision of the schema: its id, the one before it and the first line of its doc."""

    revision: str
    down_revision: str | None
    summary: str


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database's schema stands against this release's, and which keys it records."""

    ledger: bool  # the service's tables are there (a ledger, of any release)
    revision: str | None  # ``alembic_version``; ``None``: no ledger, or one before migrations
    head: str
    fingerprints: tuple[str, ...]  # the keys whose fingerprints it records

    @property
    def current(self) -> bool:
        """Whether the schema is this release's."""
        return self.ledger and self.revision == self.head

    def state(self) -> str:
        """The schema's revision and, if behind, what this release needs (a ledger's)."""
        at = f"revision {self.revision}" if self.revision else "a release before migrations"
        if self.current:
            return f"at {at}, this release's"
        return f"at {at}; this release needs revision {self.head}: run `dpgov db upgrade`"

    def describe(self) -> str:
        """One line: the revision, what this release needs, and the keys recorded."""
        if not self.ledger:
            return "holds no dp-governor ledger: `dpgov db init` creates one"
        keys = ", ".join(self.fingerprints) or "none (`dpgov db upgrade` records them)"
        return f"{self.state()}; key fingerprints recorded: {keys}"


def schema_status(engine: Engine) -> SchemaStatus:
    """The status of ``engine``'s database, by reads alone."""
    tables = set(inspect(engine).get_table_names())
    revision: str | None = None
    recorded: set[str] = set()
    with engine.connect() as conn:
        if "alembic_version" in tables:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        if META_TABLE.name in tables:
            names = conn.execute(text(f"SELECT name FROM {META_TABLE.name}")).scalars()
            recorded = {str(name) for name in names}
    ledger = "audit_log" in tables or "accounts" in tables
    return SchemaStatus(
        ledger=ledger,
        revision=revision,
        head=head_revision(),
        fingerprints=tuple(k for k in _KEYS if f"fingerprint.{k}" in recorded),
    )


def migrations() -> list[Migration]:
    """This release's revisions, oldest first (from the packaged migrations, no database)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    found = [
        Migration(
            str(rev.revision),
            None if rev.down_revision is None else str(rev.down_revision),
            (rev.doc or "").strip().splitlines()[0] if rev.doc else "",
        )
        for rev in script.walk_revisions()
    ]
    return found[::-1]
