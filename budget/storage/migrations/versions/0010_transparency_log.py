"""The public transparency log: ``tlog_leaves``, ``tlog_nodes``, ``tlog_checkpoints``.

Append-only like the audit log (triggers refuse UPDATE and DELETE, and TRUNCATE on
PostgreSQL). An upgraded ledger starts with an empty tree: the next checkpoint job projects
every audit entry already written into it (:mod:`dp_governor.budget.audit.tlog`).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None


def _tables() -> list[sa.Table]:
    meta = sa.MetaData()
    return [
        sa.Table(
            "tlog_leaves",
            meta,
            sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("seq", sa.BigInteger(), nullable=False, unique=True),
            sa.Column("label", sa.String(32), nullable=True),
            sa.Column("data", sa.Text(), nullable=False),
            sa.Index("ix_tlog_leaves_label", "label"),
        ),
        sa.Table(
            "tlog_nodes",
            meta,
            sa.Column("level", sa.Integer(), primary_key=True, autoincrement=False),
            sa.Column("idx", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("hash", sa.String(64), nullable=False),
        ),
        sa.Table(
            "tlog_checkpoints",
            meta,
            sa.Column("size", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("root", sa.String(64), nullable=False),
            sa.Column("note", sa.Text(), nullable=False),
        ),
    ]


def _append_only(conn: sa.Connection, name: str) -> None:
    """The triggers that refuse UPDATE and DELETE (and TRUNCATE) on a log table."""
    if conn.dialect.name == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {name}_no_{verb.lower()} BEFORE {verb} ON {name}"
                f" BEGIN SELECT RAISE(ABORT, '{name} is append-only: {verb} refused'); END"
            )
        return
    op.execute(
        "CREATE OR REPLACE FUNCTION dpgov_append_only() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP; END $$"
    )
    op.execute(
        f"CREATE TRIGGER {name}_append_only BEFORE UPDATE OR DELETE ON {name}"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_append_only()"
    )
    op.execute(
        f"CREATE TRIGGER {name}_no_truncate BEFORE TRUNCATE ON {name}"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()"
    )


def upgrade() -> None:
    """Create the three tables and their triggers where missing."""
    conn = op.get_bind()
    existing = set(sa.inspect(conn).get_table_names())
    for table in _tables():
        if table.name not in existing:
            table.create(conn)
            _append_only(conn, table.name)


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
