"""The effective-epsilon report's stored histograms: ``report_summaries``.

One row per name (``report``): the per-device histograms of the report as of a day, the charge
watermark they count up to, the retention horizons and the policy book's digest then
(:mod:`dp_governor.budget.reporting.summary`). The next report starts from them and reads only
what changed. An upgraded ledger starts with none: the first report is a full pass and stores it.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision: str | None = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the table where missing."""
    conn = op.get_bind()
    if "report_summaries" in set(sa.inspect(conn).get_table_names()):
        return
    op.create_table(
        "report_summaries",
        sa.Column("name", sa.String(80), primary_key=True),
        sa.Column("book", sa.String(64), nullable=False),
        sa.Column("day", sa.Integer(), nullable=False),
        sa.Column("through", sa.BigInteger(), nullable=False),
        sa.Column("applied", sa.Text(), nullable=False),
        sa.Column("horizons", sa.Text(), nullable=False),
        sa.Column("passes", sa.Text(), nullable=False),
        sa.Column("computed_at", sa.String(40), nullable=False),
    )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
