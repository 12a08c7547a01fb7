"""The device-wide budget: every version kept, the highest in force (:mod:`policies.device`).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``device_budgets`` where missing (no version: no device-wide budget, as before)."""
    if sa.inspect(op.get_bind()).has_table("device_budgets"):
        return
    op.create_table(
        "device_budgets",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("epsilon_per_day", sa.Float(), nullable=True),
        sa.Column("window_days", sa.Integer(), nullable=True),
        sa.Column("window_epsilon", sa.Float(), nullable=True),
        sa.Column("lifetime_epsilon", sa.Float(), nullable=True),
        sa.Column("filter_epsilon", sa.Float(), nullable=True),
        sa.Column("filter_delta", sa.Float(), nullable=True),
        sa.Column("quotas", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
    )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
