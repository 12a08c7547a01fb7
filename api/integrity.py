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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, func, select

from api.ingestion.ingest import Mechanism
from api.ingestion.pipeline import (
    decode_payloads,
    mechanisms_by_params,
    part_payloads,
    sketch_digest,
    sketch_from_bytes,
)
from api.ingestion.tables import BatchPart, InboxMove, InboxRow, SketchRow, StoredReport
from budget import Ledger, utc_day
from budget.audit_log import Checkpoint, CheckpointFileError, Verification, read_checkpoints
from budget.book import NO_HORIZON, PolicyBook
from budget.integrity import StateCheck
from budget.row_tags import RowTags

__all__ = ["KeptCheckpoints", "kept_checkpoints", "pipeline_problem", "verify_service"]

_INBOX = InboxRow.__table__  # type: ignore[attr-defined]
_REPORTS = StoredReport.__table__  # type: ignore[attr-defined]
_PARTS = BatchPart.__table__  # type: ignore[attr-defined]
_SKETCHES = SketchRow.__table__  # type: ignore[attr-defined]
_MOVES = InboxMove.__table__  # type: ignore[attr-defined]
_PAGE = 10_000


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
    problem = pipeline_problem(ledger, state, now=now)
    return verdict if problem is None else replace(verdict, ok=False, problem=problem)


def pipeline_problem(ledger: Ledger, state: StateCheck, *, now: datetime) -> str | None:
    """The first problem of the pipeline's tables (``None``: none), naming the table.

    In order: every inbox row's and stored report's tag (:class:`budget.row_tags.RowTags`);
    the reports held per use case and day against the charges the chain records; every
    published batch part against the reports stored in it; every sketch against the fold of
    its folded parts' reports, recomputed. Days on or before a use case's data cutoff
    (``data_through``, what the purge deletes) are left out of the last two, as they may be
    half deleted.
    """
    day = utc_day(now)
    book = ledger.book()
    cutoff = {name: kept.data_through for name, kept in book.purge_through(day).items()}
    with ledger.engine.connect() as conn:
        problem = _tags(conn, ledger.row_tags, state.legacy_through)
        if problem is None:
            problem = _counts(conn, book, day, state.accepted)
        if problem is None:
            problem = _parts(conn, cutoff)
        if problem is None:
            problem = _sketches(ledger, conn, cutoff)
    return problem


def _rows(conn: Connection, query: Any) -> Iterator[Any]:
    """A query's rows, streamed."""
    with conn.execution_options(yield_per=_PAGE).execute(query) as result:
        yield from result


def _tags(conn: Connection, tags: RowTags, legacy: int | None) -> str | None:
    """Every inbox row and stored report carries its own tag (untagged: an earlier release's)."""
    old = legacy if legacy is not None else NO_HORIZON
    i = _INBOX.c
    query = select(i.id, i.use_case, i.params, i.day, i.payload, i.device_tag, i.tag)
    for row_id, uc, params, d, payload, device_tag, tag in _rows(conn, query):
        if tag is None and int(d) <= old:
            continue
        if not tags.check_inbox(row_id, uc, params, d, payload, device_tag, tag):
            return _untrue("inbox", row_id, uc, int(d), tag)
    r = _REPORTS.c
    query = select(r.id, r.use_case, r.params, r.day, r.payload, r.batch, r.tag)
    for row_id, uc, params, d, payload, batch, tag in _rows(conn, query):
        if tag is None and int(d) <= old:
            continue
        if not tags.check_report(row_id, uc, params, d, payload, batch, tag):
            return _untrue("reports", row_id, uc, int(d), tag)
    return None


def _untrue(table: str, row_id: object, use_case: str, day: int, tag: str | None) -> str:
    what = "has no tag" if tag is None else "does not match its tag"
    return (
        f"{table}: the row {row_id} of {use_case!r} on day {day} {what} (written or edited"
        " outside the service)"
    )


def _counts(
    conn: Connection, book: PolicyBook, day: int, accepted: dict[tuple[str, int], int]
) -> str | None:
    """The reports held per use case and day in its window against the charges recorded."""
    held: dict[tuple[str, int], int] = defaultdict(int)
    for table in (_INBOX, _REPORTS):
        query = select(table.c.use_case, table.c.day, func.count()).group_by(
            table.c.use_case, table.c.day
        )
        for use_case, d, n in conn.execute(query):
            held[(str(use_case), int(d))] += int(n)

    def in_window(key: tuple[str, int]) -> bool:
        policy = book.latest.get(key[0])
        low = day - policy.retention_days if policy is not None else day
        return max(low, book.horizon(key[0])) < key[1] <= day

    for key in sorted(k for k in set(held) | set(accepted) if in_window(k)):
        if held.get(key, 0) != accepted.get(key, 0):
            return (
                f"inbox and reports: the inbox and report store hold {held.get(key, 0)} reports"
                f" of {key[0]!r} on day {key[1]}, the chain records {accepted.get(key, 0)}"
                " charges"
            )
    return None


def _kept(cutoff: dict[str, int], use_case: str, day: int) -> bool:
    """Whether a use case's rows of ``day`` are past the purge's reach (unknown: all are)."""
    return day > cutoff.get(use_case, NO_HORIZON)


def _parts(conn: Connection, cutoff: dict[str, int]) -> str | None:
    """Every published part holds the reports it records; every stored report is in a part.

    The reports of a batch still being moved belong to no part yet (``inbox_moves``).
    """
    moving = {int(b) for b in conn.execute(select(_MOVES.c.batch)).scalars() if b is not None}
    r = _REPORTS.c
    stored = {
        (int(b), str(params), int(d)): (str(uc), int(n))
        for b, params, d, uc, n in conn.execute(
            select(r.batch, r.params, r.day, r.use_case, func.count()).group_by(
                r.batch, r.params, r.day, r.use_case
            )
        )
    }
    p = _PARTS.c
    parts = conn.execute(select(p.batch, p.params, p.day, p.use_case, p.reports)).all()
    for batch, params, d, uc, n in parts:
        key = (int(batch), str(params), int(d))
        if not _kept(cutoff, str(uc), int(d)):
            continue
        found = stored.get(key)
        if found is None or found != (str(uc), int(n)):
            held = 0 if found is None else found[1]
            return (
                f"batch_parts: the part of {uc!r} on day {int(d)} (batch {int(batch)}) records"
                f" {int(n)} reports, the store holds {held} of it"
            )
    recorded = {(int(b), str(params), int(d)) for b, params, d, _, _ in parts}
    for key, (uc, n) in sorted(stored.items()):
        if key[0] not in moving and key not in recorded and _kept(cutoff, uc, key[2]):
            return (
                f"batch_parts: no part records the {n} stored reports of {uc!r} on day"
                f" {key[2]} (batch {key[0]})"
            )
    return None


def _sketches(ledger: Ledger, conn: Connection, cutoff: dict[str, int]) -> str | None:
    """Every sketch is the fold of its folded parts' stored reports, recomputed.

    A sketch edited, a part marked folded that was not (or unmarked, so that the fold would add
    it again), a sketch deleted or added: each makes one differ.
    """
    p = _PARTS.c
    folded: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for batch, params, d, uc in conn.execute(
        select(p.batch, p.params, p.day, p.use_case).where(p.folded.is_(True))
    ):
        if _kept(cutoff, str(uc), int(d)):
            folded[(str(uc), str(params), int(d))].append(int(batch))
    s = _SKETCHES.c
    sketches = {
        (str(uc), str(params), int(d)): int(n)
        for uc, params, d, n in conn.execute(select(s.use_case, s.params, s.day, s.n))
        if _kept(cutoff, str(uc), int(d))
    }
    known: dict[str, dict[str, Mechanism]] = {}
    for key in sorted(set(folded) | set(sketches)):
        uc, params, d = key
        where = f"the sketch of {uc!r} on day {d}"
        if key not in sketches:
            return f"sketches: {where} is missing, but batch parts are marked folded into it"
        if uc not in known:
            known[uc] = mechanisms_by_params(ledger, uc)
        mechanism = known[uc].get(params)
        if mechanism is None:
            return f"sketches: {where} has parameters no version of {uc!r} ever had"
        rebuilt: Any = mechanism.sketch()
        for batch in folded.get(key, []):
            for payloads in part_payloads(ledger.engine, batch, params, d):
                rebuilt.add(decode_payloads(mechanism, payloads))
        state = conn.execute(
            select(s.state).where((s.use_case == uc) & (s.params == params) & (s.day == d))
        ).scalar_one()
        try:
            stored = sketch_from_bytes(mechanism, state)
            same = sketch_digest(stored) == sketch_digest(rebuilt)
        except Exception:  # a blob that is no sketch of these parameters
            same = False
        if not same or sketches[key] != int(rebuilt.n):
            return (
                f"sketches: {where} is not the fold of the reports of its folded batch parts"
                " (the sketch edited, or batch_parts' folded marks)"
            )
    return None
