"""The indexes the retention purge reads through, so it reads about what it deletes.

The purge walks each table's expired rows in key order, a bounded page at a time
(``dp_governor.budget.storage.db.delete_pages``); each page is a range of one of these indexes:

- ``charges (use_case, day, id)``: a use case's charges on or before its horizon (the day index
  alone made each use case's pass read every other use case's expired rows too);
- ``reports (batch, params, day, id)``: one published part's stored reports (the batch index alone
  made each page re-read the batch's other parts); it replaces ``ix_reports_batch``, its prefix;
- (none on the inbox: every report writes a row there and it holds minutes of reports, so its
  rare purge reads it whole rather than every report paying one more index insert);
- ``idempotency (day, device_key, key)``: the records past the retry window, in key order; it
  replaces ``ix_idempotency_day``, its prefix.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision: str | None = "0011"
branch_labels = None
depends_on = None


_STATEMENTS = (
    "CREATE INDEX IF NOT EXISTS ix_charges_use_case_day ON charges (use_case, day, id)",
    "DROP INDEX IF EXISTS ix_reports_batch",
    "CREATE INDEX IF NOT EXISTS ix_reports_part ON reports (batch, params, day, id)",
    "DROP INDEX IF EXISTS ix_idempotency_day",
    "CREATE INDEX IF NOT EXISTS ix_idempotency_day_key ON idempotency (day, device_key, key)",
)


def upgrade() -> None:
    """Create the purge's indexes and drop the two they extend (each only if needed)."""
    for statement in _STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
