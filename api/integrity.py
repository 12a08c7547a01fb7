"""The service's verification: the ledger's (chain and deciding state) plus the pipeline's.

Every accepted report is written to the inbox in its charge's transaction and later moved to
the report store, where it stays at least as long as its use case's window. So on every day of
each use case's current window (after its retention horizon), the charges the chain records
must equal the inbox rows plus the stored reports: emptying the inbox, deleting stored reports
or adding forged ones is caught. Checkpoints kept outside the database (``checkpoint_file``)
catch a log truncated back to an earlier checkpoint; a kept file that cannot be read, or that
is missing while the database holds signed checkpoints, fails the verification too (a copy
nobody can read, or that is gone, protects nothing).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select

from api.ingestion.tables import InboxRow, StoredReport
from budget import Ledger, utc_day
from budget.audit_log import Checkpoint, CheckpointFileError, Verification, read_checkpoints

__all__ = ["KeptCheckpoints", "kept_checkpoints", "verify_service"]


@dataclass(frozen=True, slots=True)
class KeptCheckpoints:
    """The checkpoints kept outside the database, as read from their file.

    ``problem`` says why the file could not be read (its points are then unknown);
    ``missing``: a file is set but does not exist (not written yet, or gone).
    """

    path: Path | None = None
    points: tuple[Checkpoint, ...] = ()
    problem: str | None = None
    missing: bool = False


def kept_checkpoints(path: Path | None) -> KeptCheckpoints:
    """The checkpoints kept in ``path`` (none if it is unset); never raises for the file."""
    if path is None:
        return KeptCheckpoints()
    if not path.exists() and not path.is_symlink():
        return KeptCheckpoints(path, missing=True)
    try:
        return KeptCheckpoints(path, tuple(read_checkpoints(path)))
    except CheckpointFileError as exc:
        return KeptCheckpoints(path, problem=str(exc))


def verify_service(
    ledger: Ledger, *, now: datetime, kept: KeptCheckpoints | Sequence[Checkpoint]
) -> Verification:
    """The chain, the deciding state, and the inbox and store against the recorded charges.

    ``kept`` is the checkpoint file as read (:func:`kept_checkpoints`), or checkpoints given
    directly. A file that could not be read fails the verification, and so does a missing one
    once the database holds a signed checkpoint: the checkpoint job writes every checkpoint to
    it, so from then on it must be there. Either is named after any problem of the ledger
    itself.
    """
    copy = kept if isinstance(kept, KeptCheckpoints) else KeptCheckpoints(points=tuple(kept))
    verdict, state = ledger.verify(kept=copy.points)
    if not verdict.ok:
        return verdict
    file_problem = copy.problem
    if file_problem is None and copy.missing and verdict.checkpoints:
        file_problem = (
            f"checkpoint file {copy.path} is missing, but the database holds"
            f" {verdict.checkpoints} signed checkpoints: restore it from its backup (or, for"
            " a file newly set, run the checkpoint job, which writes them all)"
        )
    if file_problem is not None:
        return replace(verdict, ok=False, problem=file_problem)
    if not state.checked:
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
