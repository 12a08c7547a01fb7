"""Where the next verification starts: ``audit_verifications``.

Every verdict of ``verify``, tagged with the audit key; an accepted one names the signed
checkpoint it reached and the replayed state there, so the next run replays only the entries
after it (:mod:`dp_governor.budget.audit.verdicts`). An upgraded ledger starts with none: its
first verification replays the whole chain.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision: str | None = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the table where missing."""
    conn = op.get_bind()
    if "audit_verifications" in set(sa.inspect(conn).get_table_names()):
        return
    op.create_table(
        "audit_verifications",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("at", sa.String(40), nullable=False),
        sa.Column("full", sa.Boolean(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("from_seq", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("hash", sa.String(64), nullable=True),
        sa.Column("signed_at", sa.String(40), nullable=True),
        sa.Column("signature", sa.String(64), nullable=True),
        sa.Column("problem", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=True),
        sa.Column("state_sha256", sa.String(64), nullable=True),
        sa.Column("tag", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
