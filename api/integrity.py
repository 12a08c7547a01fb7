"""The service's verification: the ledger's (chain and deciding state) plus the pipeline's.

Every accepted report is written to the inbox in its charge's transaction and later moved to
the report store, where it stays at least as long as its use case's window. So on every day of
each use case's current window (after its retention horizon), the charges the chain records
must equal the inbox rows plus the stored reports: emptying the inbox, deleting stored reports
or adding forged ones is caught. Checkpoints kept outside the database (``checkpoint_file``)
catch a log truncated back to an earlier checkpoint.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select

from api.ingestion.tables import InboxRow, StoredReport
from budget import Ledger, utc_day
from budget.audit_log import Checkpoint, Verification, read_checkpoints

__all__ = ["kept_checkpoints", "verify_service"]


def kept_checkpoints(path: Path | None) -> list[Checkpoint]:
    """The checkpoints kept in ``path`` (none if unset or not written yet)."""
    if path is None or not path.exists():
        return []
    return read_checkpoints(path)


def verify_service(ledger: Ledger, *, now: datetime, kept: list[Checkpoint]) -> Verification:
    """The chain, the deciding state, and the inbox and store against the recorded charges."""
    verdict, state = ledger.verify(kept=kept)
    if not verdict.ok or not state.checked:
        return verdict
    day = utc_day(now)
    book = ledger.book()
    held: dict[tuple[str, int], int] = defaultdict(int)
    with ledger.engine.connect() as conn:
        for table in (InboxRow.__table__, StoredReport.__table__):  # type: ignore[attr-defined]
            query = select(table.c.use_case, table.c.day, func.count()).group_by(
                table.c.use_case, table.c.day
            )
            for use_case, d, n in conn.execute(query):
                held[(str(use_case), int(d))] += int(n)

    def in_window(key: tuple[str, int]) -> bool:
        policy = book.latest.get(key[0])
        low = day - policy.retention_days if policy is not None else day
        return max(low, book.horizon(key[0])) < key[1] <= day

    for key in sorted(k for k in set(held) | set(state.accepted) if in_window(k)):
        if held.get(key, 0) != state.accepted.get(key, 0):
            problem = (
                f"the inbox and report store hold {held.get(key, 0)} reports of {key[0]!r} on"
                f" day {key[1]}, the chain records {state.accepted.get(key, 0)} charges"
            )
            return replace(verdict, ok=False, problem=problem)
    return verdict
