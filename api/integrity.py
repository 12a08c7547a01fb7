"""The service's verification: the ledger's (chain and deciding state) plus the pipeline's.

Every accepted report is written to the inbox in its charge's transaction and later moved to
the report store, where it stays until its batch's first charge day leaves the use case's
window (a batch's reports are stored under that one day). So on every day of each use case's
current window (after its retention horizon), the charges the chain records must equal the
reports the inbox and the store hold of that charge day: the inbox rows of the day, plus each
claimed or published batch's count of that day (``charge_days``), with every batch's stored
rows counted against its record. Emptying the inbox, deleting stored reports or adding forged
ones is caught. On the days after the window's start that a batch reaching back before it
also covered, the purge may already have deleted that batch whole: there the store may hold
fewer, never more. Checkpoints kept outside the database (``checkpoint_file``) catch a log
truncated back to an earlier checkpoint.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
import orjson
from sqlalchemy import Connection, func, select

from api.ingestion.tables import BatchPart, InboxMove, InboxOrder, InboxRow, StoredReport
from budget import Ledger, utc_day
from budget.audit_log import Checkpoint, Verification, read_checkpoints
from budget.book import PolicyBook
from budget.storage.tables import ShuffledBatch

__all__ = ["kept_checkpoints", "verify_service"]

_INBOX = InboxRow.__table__  # type: ignore[attr-defined]
_REPORTS = StoredReport.__table__  # type: ignore[attr-defined]
_PARTS = BatchPart.__table__  # type: ignore[attr-defined]
_MOVES = InboxMove.__table__  # type: ignore[attr-defined]
_ORDERS = InboxOrder.__table__  # type: ignore[attr-defined]
_BATCHES = ShuffledBatch.__table__  # type: ignore[attr-defined]


def kept_checkpoints(path: Path | None) -> list[Checkpoint]:
    """The checkpoints kept in ``path`` (none if unset or not written yet)."""
    if path is None or not path.exists():
        return []
    return read_checkpoints(path)


def _window_starts(book: PolicyBook, use_cases: set[str], day: int) -> dict[str, int]:
    """Each use case's last day before its current window (its horizon, if later)."""
    out = {}
    for name in use_cases:
        policy = book.latest.get(name)
        low = day - policy.retention_days if policy is not None else day
        out[name] = max(low, book.horizon(name))
    return out


def _pipeline_problem(
    conn: Connection, book: PolicyBook, day: int, accepted: dict[tuple[str, int], int]
) -> str | None:
    """What in the inbox and the store disagrees with the charges (``None``: nothing)."""
    held: dict[tuple[str, int], int] = defaultdict(int)
    claimed: set[int] = set()
    moving: dict[int, tuple[str, int]] = {}  # batch -> (use case, reports moved so far)
    for use_case, batch, moved, manifest, record in conn.execute(
        select(
            _MOVES.c.use_case, _MOVES.c.batch, _MOVES.c.moved, _ORDERS.c.manifest, _ORDERS.c.record
        ).join(_ORDERS, _ORDERS.c.batch == _MOVES.c.batch)
    ):
        claimed.update(np.frombuffer(manifest, np.int64).tolist())
        moving[int(batch)] = (str(use_case), int(moved))
        plan = orjson.loads(record)
        parts = plan.get("parts") or [[None, d, n] for d, n in plan["charge_days"].items()]
        for _, d, n in parts:
            held[(str(use_case), int(d))] += int(n)
    for use_case, row_id, d in conn.execute(select(_INBOX.c.use_case, _INBOX.c.id, _INBOX.c.day)):
        if int(row_id) not in claimed:
            held[(str(use_case), int(d))] += 1
    use_cases = {u for u, _ in held} | {u for u, _ in accepted}
    parts_of: dict[tuple[int, str, int], tuple[str, int]] = {}
    for use_case, batch, params, d, reports, charge_days in conn.execute(
        select(
            _PARTS.c.use_case,
            _PARTS.c.batch,
            _PARTS.c.params,
            _PARTS.c.day,
            _PARTS.c.reports,
            _PARTS.c.charge_days,
        )
    ):
        use_cases.add(str(use_case))
        parts_of[(int(batch), str(params), int(d))] = (str(use_case), int(reports))
        for charged, n in orjson.loads(charge_days).items():
            held[(str(use_case), int(charged))] += int(n)
    low = _window_starts(book, use_cases, day)
    stored_moving: dict[int, int] = defaultdict(int)
    for use_case, batch, params, d, n in conn.execute(
        select(
            _REPORTS.c.use_case, _REPORTS.c.batch, _REPORTS.c.params, _REPORTS.c.day, func.count()
        ).group_by(_REPORTS.c.use_case, _REPORTS.c.batch, _REPORTS.c.params, _REPORTS.c.day)
    ):
        key = (int(batch), str(params), int(d))
        if int(batch) in moving:
            stored_moving[int(batch)] += int(n)
            continue
        part = parts_of.pop(key, None)
        if int(d) <= low.get(str(use_case), day):
            continue  # its batch left the window: the purge may be deleting it
        if part is None or part[1] != int(n):
            return (
                f"the report store holds {int(n)} reports of {str(use_case)!r} in a batch whose"
                f" record says {0 if part is None else part[1]}"
            )
    for (_, _, d), (use_case, reports) in parts_of.items():
        if d > low.get(use_case, day):
            return (
                f"the report store holds 0 reports of {use_case!r} in a batch whose record says"
                f" {reports}"
            )
    for batch, (use_case, moved) in moving.items():
        if stored_moving.get(batch, 0) != moved:
            return (
                f"the report store holds {stored_moving.get(batch, 0)} reports of {use_case!r}"
                f" in the batch being moved, which has moved {moved}"
            )
    # days a batch that reaches back before the window covered: the purge deletes such a
    # batch whole when its first day leaves the window, before its last day does
    early: dict[str, int] = {}
    for use_case, first, last in conn.execute(
        select(_BATCHES.c.use_case, _BATCHES.c.first_day, _BATCHES.c.last_day).where(
            _BATCHES.c.last_day > _BATCHES.c.first_day
        )
    ):
        start = low.get(str(use_case))
        if start is not None and int(first) <= start < int(last):
            early[str(use_case)] = max(early.get(str(use_case), start), int(last))
    for use_case, d in sorted(set(held) | set(accepted)):
        if not low[use_case] < d <= day:
            continue
        found, charged = held.get((use_case, d), 0), accepted.get((use_case, d), 0)
        if found != charged and not (found < charged and d <= early.get(use_case, d - 1)):
            return (
                f"the inbox and report store hold {found} reports of {use_case!r} on day {d},"
                f" the chain records {charged} charges"
            )
    return None


def verify_service(ledger: Ledger, *, now: datetime, kept: list[Checkpoint]) -> Verification:
    """The chain, the deciding state, and the inbox and store against the recorded charges."""
    verdict, state = ledger.verify(kept=kept)
    if not verdict.ok or not state.checked:
        return verdict
    with ledger.engine.connect() as conn:
        problem = _pipeline_problem(conn, ledger.book(), utc_day(now), dict(state.accepted))
    return verdict if problem is None else replace(verdict, ok=False, problem=problem)
