"""Privacy filters: per-budget window and lifetime targets, and a device-wide window target.

``policies`` gains ``window_filter_epsilon``, ``window_filter_delta``,
``lifetime_filter_epsilon`` and ``lifetime_filter_delta`` (existing versions: none, as before);
``device_budgets`` gains ``window_filter_epsilon`` and ``window_filter_delta``, and its lifetime
target's ``filter_epsilon`` and ``filter_delta`` are named ``lifetime_filter_epsilon`` and
``lifetime_filter_delta`` like the policies' (values kept). Each change is made where missing.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None

_TARGETS = ("window_filter_epsilon", "window_filter_delta")
_LIFETIME = ("lifetime_filter_epsilon", "lifetime_filter_delta")


def upgrade() -> None:
    """Add the filter targets' columns; rename the device-wide lifetime target's."""
    inspector = sa.inspect(op.get_bind())
    held = {c["name"] for c in inspector.get_columns("policies")}
    for name in (*_TARGETS, *_LIFETIME):
        if name not in held:
            op.add_column("policies", sa.Column(name, sa.Float(), nullable=True))
    held = {c["name"] for c in inspector.get_columns("device_budgets")}
    for name in _TARGETS:
        if name not in held:
            op.add_column("device_budgets", sa.Column(name, sa.Float(), nullable=True))
    for old, new in zip(("filter_epsilon", "filter_delta"), _LIFETIME, strict=True):
        if old in held and new not in held:
            op.execute(f"ALTER TABLE device_budgets RENAME COLUMN {old} TO {new}")
        elif new not in held:
            op.add_column("device_budgets", sa.Column(new, sa.Float(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
