"""Central epsilon after shuffling: the published batches, a policy's minimum batch, inbox tags.

``shuffled_batches`` records each published shuffled batch's sizes
(:mod:`dp_governor.budget.reporting.central`); ``dp_governor.policies.min_batch_devices`` (existing
versions: 1, as before) is how many distinct devices a batch needs to be published;
``inbox.device_tag`` is the keyed per-use-case device pseudonym the flush counts and drops (rows
queued before this revision have none). Each is added where missing.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``shuffled_batches``; add ``policies.min_batch_devices`` and ``inbox.device_tag``."""
    inspector = sa.inspect(op.get_bind())
    if not inspector.has_table("shuffled_batches"):
        op.create_table(
            "shuffled_batches",
            sa.Column(
                "id",
                sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                primary_key=True,
                autoincrement=True,
            ),
            sa.Column("use_case", sa.String(63), nullable=False),
            sa.Column("day", sa.Integer(), nullable=False),
            sa.Column("first_day", sa.Integer(), nullable=False),
            sa.Column("last_day", sa.Integer(), nullable=False),
            sa.Column("devices", sa.BigInteger(), nullable=False),
            sa.Column("reports", sa.BigInteger(), nullable=False),
            sa.Column("max_per_device", sa.Integer(), nullable=False),
            sa.Column("layers", sa.Text(), nullable=False),
            sa.Column("untagged", sa.Integer(), nullable=False),
            sa.Column("epsilon_micro", sa.BigInteger(), nullable=False),
            sa.Column("min_batch_devices", sa.Integer(), nullable=False),
        )
        op.create_index("ix_shuffled_batches_use_case_day", "shuffled_batches", ["use_case", "day"])
    if "min_batch_devices" not in {c["name"] for c in inspector.get_columns("policies")}:
        op.add_column(
            "policies",
            sa.Column("min_batch_devices", sa.Integer(), nullable=False, server_default="1"),
        )
    if "device_tag" not in {c["name"] for c in inspector.get_columns("inbox")}:
        op.add_column("inbox", sa.Column("device_tag", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
