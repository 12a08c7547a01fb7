"""Charges record their budget in the account's slot.

An account's slots gain the budget each charge was made under (``[use case, epsilon, group
size, reports, budget]``), so that a budget keeps counting what was charged under it after its
use case leaves. Slots written before this revision keep four elements and count under every
budget their use case ever drew from (:data:`dp_governor.budget.rule.state.ANY_BUDGET`).
``slot_budgets`` records the audit log's last entry at the upgrade: the state check replays charges
up to it into those slots, and later ones into slots of their own budget.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``slot_budgets`` with the audit log's last sequence number (0: a new ledger)."""
    bind = op.get_bind()
    if sa.inspect(bind).has_table("slot_budgets"):
        return
    op.create_table(
        "slot_budgets",
        sa.Column("since_seq", sa.BigInteger(), primary_key=True, autoincrement=False),
    )
    last = bind.execute(sa.text("SELECT coalesce(max(seq), 0) FROM audit_log")).scalar_one()
    bind.execute(sa.text("INSERT INTO slot_budgets (since_seq) VALUES (:seq)"), {"seq": last})
