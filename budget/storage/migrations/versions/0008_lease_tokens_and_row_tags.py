"""Fenced job leases and keyed row tags: ``job_leases.token``, ``inbox.tag``, ``reports.tag``.

A lease carries a fencing token that rises at every takeover, and every job transaction checks
it (``dp_governor.api.jobs``); existing leases start at 0. Each inbox row and stored report carries
a keyed tag over its stored bytes (:mod:`dp_governor.budget.audit.row_tags`), which ``verify``
checks; rows stored before this revision have none (null), and ``verify`` accepts that only for the
days an earlier release charged (docs/audit.md).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the lease token (0 for existing leases) and the rows' tags (null), where missing."""
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if "token" not in {c["name"] for c in inspector.get_columns("job_leases")}:
        op.add_column(
            "job_leases",
            sa.Column("token", sa.BigInteger(), nullable=False, server_default="0"),
        )
        if bind.dialect.name == "postgresql":
            op.alter_column("job_leases", "token", server_default=None)
    for table in ("inbox", "reports"):
        if "tag" not in {c["name"] for c in inspector.get_columns(table)}:
            op.add_column(table, sa.Column("tag", sa.String(64), nullable=True))


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
