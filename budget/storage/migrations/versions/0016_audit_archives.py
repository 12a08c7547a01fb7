"""Old audit entries archived beside their signed checkpoints: ``audit_archives``.

One row per archive (:mod:`dp_governor.budget.audit.archive`): the boundary (a signed checkpoint's
entry, kept in ``audit_log``), its chain head, the archived range and the chain head before it,
the file's name and SHA-256, and the verified replay state at the boundary, tagged with the audit
key. The table is append-only (UPDATE and DELETE refused). ``audit_log``'s DELETE trigger is
replaced: a row strictly below the newest archive's boundary may be deleted, any other still not.
A partial index over the transparency log's claim leaves (``ix_tlog_leaves_claims``) lets the
daily report of a day whose claim was archived be read from its leaf.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision: str | None = "0015"
branch_labels = None
depends_on = None

# a claim's leaf (keys sorted: its actor first); the colon escaped from SQLAlchemy's binds
_CLAIM_LEAF = """data LIKE '{"actor":"job\\:claims",%'"""
_REFUSED = "audit_log is append-only: DELETE refused (only archived entries may be deleted)"


def _table(meta: sa.MetaData) -> sa.Table:
    """``audit_archives`` as this revision creates it."""
    return sa.Table(
        "audit_archives",
        meta,
        sa.Column("boundary", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("file", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("signed_at", sa.String(40), nullable=False),
        sa.Column("signature", sa.String(64), nullable=False),
        sa.Column("claimed_through", sa.Integer(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("at", sa.String(40), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
    )


def _sqlite_triggers() -> None:
    """SQLite: the archives append-only; the log's DELETE allowed below the newest boundary."""
    for verb in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER audit_archives_no_{verb.lower()} BEFORE {verb} ON audit_archives"
            f" BEGIN SELECT RAISE(ABORT, 'audit_archives is append-only: {verb} refused'); END"
        )
    op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
    op.execute(
        "CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log"
        " WHEN OLD.seq >= (SELECT coalesce(max(boundary), 0) FROM audit_archives)"
        f" BEGIN SELECT RAISE(ABORT, '{_REFUSED}'); END"
    )


def _postgresql_triggers() -> None:
    """PostgreSQL: the archives append-only; the log's row trigger checks the boundary."""
    op.execute(
        "CREATE TRIGGER audit_archives_append_only BEFORE UPDATE OR DELETE ON audit_archives"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_append_only()"
    )
    op.execute(
        "CREATE TRIGGER audit_archives_no_truncate BEFORE TRUNCATE ON audit_archives"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()"
    )
    op.execute(
        "CREATE OR REPLACE FUNCTION dpgov_audit_log_archived() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN"
        " IF TG_OP = 'DELETE' AND OLD.seq < (SELECT coalesce(max(boundary), 0)"
        " FROM audit_archives) THEN RETURN OLD; END IF;"
        " RAISE EXCEPTION '% is append-only: % refused (only archived entries may be deleted)',"
        " TG_TABLE_NAME, TG_OP; END $$"
    )
    op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
    op.execute(
        "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_audit_log_archived()"
    )


def upgrade() -> None:
    """Create the table and its triggers, and replace the log's DELETE trigger, where missing."""
    conn = op.get_bind()
    if "audit_archives" in set(sa.inspect(conn).get_table_names()):
        return
    _table(sa.MetaData()).create(conn)
    op.create_index(
        "ix_tlog_leaves_claims",
        "tlog_leaves",
        ["idx"],
        sqlite_where=sa.text(_CLAIM_LEAF),
        postgresql_where=sa.text(_CLAIM_LEAF),
    )
    if conn.dialect.name == "sqlite":
        _sqlite_triggers()
    else:
        _postgresql_triggers()


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
