"""The precomputed public figures: ``dashboard_snapshots``.

One row per name (the dashboard's figures, the last scheduled verification), replaced by the
job that computes it, so the public pages read figures instead of scanning the ledger
(``dp_governor.api._snapshots``). An upgraded ledger starts with none: the first page computes
them once, then the jobs keep them current.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision: str | None = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the table where missing."""
    conn = op.get_bind()
    if "dashboard_snapshots" in set(sa.inspect(conn).get_table_names()):
        return
    op.create_table(
        "dashboard_snapshots",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("computed_at", sa.String(40), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
