"""Ledgers of the per-budget layouts (before 0.1) become one account row per device.

A data migration: a no-op on a new database and on one made by 0.1. Otherwise each device's
rows are folded into one state (:mod:`dp_governor.budget.storage.migrate`), ``accounts`` is
recreated in the per-device layout, and the tables layout's ``daily_spend``, ``lifetime_totals`` and
covering index are dropped (``charges`` indexed by day instead).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

from dp_governor.budget.storage.migrate import is_per_budget, per_device_states, write_accounts

revision = "0002"
down_revision: str | None = "0001"
branch_labels = None
depends_on = None

log = logging.getLogger("dpgov.migrations")


def upgrade() -> None:
    """Fold a per-budget ledger into per-device accounts (nothing to do on 0.1's layout)."""
    conn = op.get_bind()
    if not is_per_budget(conn):
        return
    tables_layout = sa.inspect(conn).has_table("daily_spend")
    states = per_device_states(conn)
    op.drop_table("accounts")
    op.create_table(
        "accounts",
        sa.Column("device_key", sa.String(64), primary_key=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("epsilon_micro", sa.BigInteger(), nullable=False),
        sa.Column("days", sa.Text(), nullable=False),
        sa.Column("lifetime", sa.Text(), nullable=False),
        sa.Column("oldest_day", sa.Integer(), nullable=True),
        sqlite_with_rowid=False,
    )
    write_accounts(conn, states)
    if tables_layout:
        op.drop_table("daily_spend")
        op.drop_table("lifetime_totals")
        op.execute("DROP INDEX IF EXISTS ix_charges_use_case_device")
        op.execute("CREATE INDEX IF NOT EXISTS ix_charges_day ON charges (day)")
    log.info("migrated %d devices to one account row each", len(states))


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
