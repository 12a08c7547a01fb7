"""Short job transactions: batches moved in steps, folded by part.

A batch is moved in steps (``inbox_moves``, its plan in ``inbox_orders``). Every stored report
gets the batch it was moved in (``reports.batch``), and every batch its
parts, one per parameter set and day, which the fold adds to the sketches at once and marks
folded (``batch_parts.folded``) instead of marking each report. Reports stored before this
revision become two batches per use case, the folded ones and the others, with their parts;
``reports.folded`` and its index go.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``inbox_moves``, ``inbox_orders`` and ``batch_parts``; give reports their batch."""
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if not inspector.has_table("inbox_moves"):
        op.create_table(
            "inbox_moves",
            sa.Column("use_case", sa.String(63), primary_key=True),
            sa.Column("generation", sa.BigInteger(), nullable=False),
            sa.Column("batch", sa.BigInteger(), nullable=True),
            sa.Column("moved", sa.BigInteger(), nullable=False),
        )
    if not inspector.has_table("inbox_orders"):
        op.create_table(
            "inbox_orders",
            sa.Column("batch", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("manifest", sa.LargeBinary(), nullable=False),
            sa.Column("record", sa.Text(), nullable=False),
        )
    if not inspector.has_table("batch_parts"):
        op.create_table(
            "batch_parts",
            sa.Column("batch", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("params", sa.String(64), primary_key=True),
            sa.Column("day", sa.Integer(), primary_key=True, autoincrement=False),
            sa.Column("use_case", sa.String(63), nullable=False),
            sa.Column("reports", sa.BigInteger(), nullable=False),
            sa.Column("folded", sa.Boolean(), nullable=False),
        )
        op.create_index("ix_batch_parts_folded", "batch_parts", ["folded"])
        op.create_index("ix_batch_parts_use_case_day", "batch_parts", ["use_case", "day"])
    if "batch" in {c["name"] for c in inspector.get_columns("reports")}:
        return
    # NOT NULL needs a default for the rows already there; every row gets its batch below
    op.add_column(
        "reports", sa.Column("batch", sa.BigInteger(), nullable=False, server_default="0")
    )
    if bind.dialect.name == "postgresql":
        op.alter_column("reports", "batch", server_default=None)
    groups = bind.execute(
        sa.text(
            "SELECT use_case, params, day, folded, COUNT(*) FROM reports"
            " GROUP BY use_case, params, day, folded"
        )
    ).all()
    batches = {(str(g[0]), bool(g[3])): secrets.randbits(63) for g in groups}
    for (use_case, folded), batch in batches.items():
        bind.execute(
            sa.text("UPDATE reports SET batch = :b WHERE use_case = :u AND folded = :f"),
            {"b": batch, "u": use_case, "f": folded},
        )
    parts = sa.table(
        "batch_parts",
        sa.column("batch", sa.BigInteger()),
        sa.column("params", sa.String()),
        sa.column("day", sa.Integer()),
        sa.column("use_case", sa.String()),
        sa.column("reports", sa.BigInteger()),
        sa.column("folded", sa.Boolean()),
    )
    if groups:
        op.bulk_insert(
            parts,
            [
                {
                    "batch": batches[(str(use_case), bool(folded))],
                    "params": params,
                    "day": day,
                    "use_case": use_case,
                    "reports": n,
                    "folded": bool(folded),
                }
                for use_case, params, day, folded, n in groups
            ],
        )
    op.drop_index("ix_reports_fold", table_name="reports")
    op.drop_column("reports", "folded")
    op.create_index("ix_reports_batch", "reports", ["batch"])


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
