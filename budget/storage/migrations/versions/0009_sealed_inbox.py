"""Sealed inbox rows, one part a batch, and the batches whose parts were not counted.

- ``inbox.sealed``: the report and device pseudonym sealed to the shuffler key (kept outside
  the database); ``inbox.payload`` becomes nullable, and the rows queued before this revision
  keep theirs until the next flush seals them (``dp_governor.pipeline.seal``).
- ``batch_parts.charge_days``: a part's reports per charge day (JSON); a part published
  before this revision held one charge day, all of its reports.
- ``shuffled_batches.split``: batches published before this revision were stored in parts by
  charge day and parameters, which could be as small as one report, while their record counts
  the whole batch's devices. Those that may have had several parts (their reports span days,
  or a version of their use case was made between their first charge day and their
  publication) are marked, and no central figure claims them amplified.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None

_DAY_SECONDS = 86_400


def _day(value: object) -> int:
    """The UTC day number of a stored ``created_at`` (a datetime, or SQLite's text)."""
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() // _DAY_SECONDS)


def upgrade() -> None:
    """Add ``inbox.sealed``, ``batch_parts.charge_days`` and ``shuffled_batches.split``."""
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    inbox = {c["name"]: c for c in inspector.get_columns("inbox")}
    if "sealed" not in inbox:
        with op.batch_alter_table("inbox") as table:
            table.add_column(sa.Column("sealed", sa.LargeBinary(), nullable=True))
            table.alter_column("payload", existing_type=sa.Text(), nullable=True)
    if "charge_days" not in {c["name"] for c in inspector.get_columns("batch_parts")}:
        op.add_column(
            "batch_parts",
            sa.Column("charge_days", sa.Text(), nullable=False, server_default="{}"),
        )
        bind.execute(
            sa.text(
                "UPDATE batch_parts SET charge_days ="
                " '{\"' || CAST(day AS TEXT) || '\":' || CAST(reports AS TEXT) || '}'"
            )
        )
        if bind.dialect.name == "postgresql":
            op.alter_column("batch_parts", "charge_days", server_default=None)
    if "split" in {c["name"] for c in inspector.get_columns("shuffled_batches")}:
        return
    op.add_column(
        "shuffled_batches",
        sa.Column("split", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    changed: dict[str, list[int]] = defaultdict(list)  # days a later version was made on
    for name, created in bind.execute(
        sa.text("SELECT name, created_at FROM policies WHERE version > 1")
    ):
        changed[str(name)].append(_day(created))
    split = [
        int(batch_id)
        for batch_id, use_case, day, first, last in bind.execute(
            sa.text("SELECT id, use_case, day, first_day, last_day FROM shuffled_batches")
        )
        if first != last or any(first <= d <= day for d in changed.get(str(use_case), []))
    ]
    for start in range(0, len(split), 500):
        bind.execute(
            sa.text("UPDATE shuffled_batches SET split = :yes WHERE id IN :ids").bindparams(
                sa.bindparam("ids", expanding=True)
            ),
            {"yes": True, "ids": split[start : start + 500]},
        )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
