"""An index of the privacy claims in the audit log, so a day's claim is found without a scan.

``GET /v1/tlog/reports/{name}/{day}`` and the ``claims`` job look for ``claim.day`` entries
(:mod:`dp_governor.budget.reporting.claims`); without an index each read walked every audit
entry written since the day (a day of charges at least). The index is partial, over the claims
alone: a report's audit entry is no claim, so its insert only evaluates the predicate and the
report path writes no index entry (``benchmarks.instructions``).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision: str | None = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the partial index (only if needed)."""
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_audit_log_claims ON audit_log (at, seq)"
        " WHERE action = 'claim.day'"
    )


def downgrade() -> None:
    """Not supported: a ledger is never rolled back (restore the backup taken before upgrading)."""
    raise NotImplementedError("a ledger is not downgraded: restore the backup of the database")
