"""The witnesses' cosignatures of the transparency log's checkpoints: ``tlog_cosignatures``.

One row per checkpoint size and witness: the C2SP ``tlog-cosignature`` line the witness returned
to the checkpoint job's ``add-checkpoint`` submission. Append-only like the other tlog tables
(triggers refuse UPDATE and DELETE, and TRUNCATE on PostgreSQL).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision: str | None = "0012"
branch_labels = None
depends_on = None

_NAME = "tlog_cosignatures"


def upgrade() -> None:
    """Create the table and its append-only triggers where missing."""
    conn = op.get_bind()
    if _NAME in set(sa.inspect(conn).get_table_names()):
        return
    sa.Table(
        _NAME,
        sa.MetaData(),
        sa.Column("size", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("witness", sa.String(255), primary_key=True),
        sa.Column("line", sa.Text(), nullable=False),
    ).create(conn)
    if conn.dialect.name == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {_NAME}_no_{verb.lower()} BEFORE {verb} ON {_NAME}"
                f" BEGIN SELECT RAISE(ABORT, '{_NAME} is append-only: {verb} refused'); END"
            )
        return
    op.execute(
        "CREATE OR REPLACE FUNCTION dpgov_append_only() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP; END $$"
    )
    op.execute(
        f"CREATE TRIGGER {_NAME}_append_only BEFORE UPDATE OR DELETE ON {_NAME}"
        " FOR EACH ROW EXECUTE FUNCTION dpgov_append_only()"
    )
    op.execute(
        f"CREATE TRIGGER {_NAME}_no_truncate BEFORE TRUNCATE ON {_NAME}"
        " FOR EACH STATEMENT EXECUTE FUNCTION dpgov_append_only()"
    )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
