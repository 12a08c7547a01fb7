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
fewer, never more. Every inbox row and stored report carries a keyed tag over its stored bytes,
and every sketch is recomputed from the reports of its folded parts: a full verification
recomputes them all, an incremental one those whose blob, count or folded parts changed since
the last accepted verdict, which records each checked sketch's digest under the audit key's
tag (the others' reports are checked by their tags and counts, like every report).
Checkpoints kept outside the database (``checkpoint_file``) catch a log truncated back to an
earlier checkpoint; a kept file that cannot be read, or that is missing while the database
holds signed checkpoints, fails the verification too (a copy nobody can read, or that is
gone, protects nothing).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Connection, func, select

from dp_governor.api._handles import ledger_engine
from dp_governor.api._verdict_text import SEALED_COUNTED, SEALED_OPENED, with_clause
from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.audit.log import (
    Checkpoint,
    CheckpointFile,
    CheckpointFileError,
    Verification,
    last_kept_seq,
)
from dp_governor.budget.audit.row_tags import RowTags
from dp_governor.budget.audit.verdicts import Resume, VerdictForged
from dp_governor.budget.audit.verify import StateCheck
from dp_governor.budget.rule.book import NO_HORIZON, PolicyBook
from dp_governor.mechanisms import Mechanism
from dp_governor.pipeline.codec import sketch_from_bytes, sketches_equal
from dp_governor.pipeline.fold import mechanisms_by_params, part_payloads
from dp_governor.pipeline.seal import InboxSeal, SealError
from dp_governor.pipeline.tables import BATCHES as _BATCHES
from dp_governor.pipeline.tables import INBOX as _INBOX
from dp_governor.pipeline.tables import MOVES as _MOVES
from dp_governor.pipeline.tables import ORDERS as _ORDERS
from dp_governor.pipeline.tables import PARTS as _PARTS
from dp_governor.pipeline.tables import REPORTS as _REPORTS
from dp_governor.pipeline.tables import SKETCHES as _SKETCHES

__all__ = ["KeptCheckpoints", "kept_checkpoints", "pipeline_problem", "verify_service"]

_PAGE = 10_000


@dataclass(frozen=True, slots=True)
class KeptCheckpoints:
    """The checkpoints kept outside the database: their file, read a line at a time.

    ``points`` streams the file again each time it is iterated (memory stays a line however
    long it grows); ``problem`` says why the file could not be read (its points are then
    unknown); ``missing``: a file is set but does not exist (not written yet, or gone).
    """

    path: Path | None = None
    points: Iterable[Checkpoint] = ()
    problem: str | None = None
    missing: bool = False


def kept_checkpoints(path: Path | None) -> KeptCheckpoints:
    """The checkpoints kept in ``path`` (none if it is unset); never raises for the file.

    Only its last line is read here (a file that cannot be opened, or torn by a crash
    mid-append, is known before the verification starts); a bad line earlier is met when the
    verification streams the file, and fails it the same way.
    """
    if path is None:
        return KeptCheckpoints()
    if not path.exists() and not path.is_symlink():
        return KeptCheckpoints(path, missing=True)
    try:
        last_kept_seq(path)
    except CheckpointFileError as exc:
        return KeptCheckpoints(path, problem=str(exc))
    return KeptCheckpoints(path, CheckpointFile(path))


def verify_service(
    ledger: Ledger,
    *,
    now: datetime,
    kept: KeptCheckpoints | Sequence[Checkpoint],
    seal: InboxSeal | None = None,
    stage: Callable[[str], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    full: bool = True,
    archive_files: Sequence[Path] = (),
) -> Verification:
    """The chain, the deciding state, and the inbox and store against the recorded charges.

    ``kept`` is the checkpoint file as read (:func:`kept_checkpoints`), or checkpoints given
    directly. A file that could not be read fails the verification, and so does a missing one
    once the database holds a signed checkpoint: the checkpoint job writes every checkpoint to
    it, so from then on it must be there. Either is named after any problem of the ledger
    itself. ``seal`` (the service's) opens every sealed inbox row, which authenticates it;
    without it (a command that reads no shuffler key) sealed rows are counted, not opened; the
    verdict's note says which once the pipeline was checked (:mod:`.._verdict_text`).
    ``stage`` is told each part as it starts, ``progress`` the entries verified (a command's
    progress). ``full=False`` starts at the last accepted verdict's signed checkpoint
    (:mod:`dp_governor.budget.audit.incremental`). The verdict is recorded
    (``audit_verifications``): an accepted one is where the next incremental run starts.
    ``archive_files`` replays archived entries from their files (docs/audit.md, archiving);
    files that are not every archive's raise
    :class:`~dp_governor.budget.audit.archive.NotTheArchives`, and nothing is recorded.
    """
    verdict, resume = _verify(
        ledger,
        now=now,
        kept=kept,
        seal=seal,
        stage=stage,
        progress=progress,
        full=full,
        archive_files=archive_files,
    )
    ledger.verdicts.record(
        now=now, full=full, from_seq=verdict.from_seq, problem=verdict.problem, resume=resume
    )
    return verdict


def _verify(
    ledger: Ledger,
    *,
    now: datetime,
    kept: KeptCheckpoints | Sequence[Checkpoint],
    seal: InboxSeal | None,
    stage: Callable[[str], None] | None,
    progress: Callable[[int, int], None] | None,
    full: bool,
    archive_files: Sequence[Path] = (),
) -> tuple[Verification, Resume | None]:
    """:func:`verify_service`'s checks, and where the next run may start if all accepted."""
    copy = kept if isinstance(kept, KeptCheckpoints) else KeptCheckpoints(points=tuple(kept))
    if stage is not None:
        stage("the chain, its tags, its checkpoints and the deciding state")
    try:
        verdict, state = ledger.verify(
            kept=copy.points, progress=progress, full=full, archive_files=archive_files
        )
    except CheckpointFileError as exc:  # the file changed since it was read through
        seq, head = ledger.audit.head()
        return Verification(False, 0, seq, head, 0, None, None, None, str(exc)), None
    if not verdict.ok:
        return verdict, None
    file_problem = copy.problem
    if file_problem is None and copy.missing and verdict.checkpoints:
        file_problem = (
            f"checkpoint file {copy.path} is missing, but the database holds"
            f" {verdict.checkpoints} signed checkpoints: restore it from its backup (or, for"
            " a file newly set, run the checkpoint job, which writes them all)"
        )
    if file_problem is not None:
        return replace(verdict, ok=False, problem=file_problem), None
    if not state.checked:
        return verdict, state.resume
    if stage is not None:
        stage("the inbox, the report store and the sketches against the charges")
    verified = {} if full else _verified_sketches(ledger)
    problem, digests = _check_pipeline(ledger, state, now=now, seal=seal, verified=verified)
    if problem is not None:
        return replace(verdict, ok=False, problem=problem), None
    sealed = SEALED_COUNTED if seal is None else SEALED_OPENED
    resume = None if state.resume is None else replace(state.resume, sketches=digests)
    return replace(verdict, note=with_clause(verdict.note, sealed)), resume


def _verified_sketches(ledger: Ledger) -> Mapping[str, str]:
    """The sketch digests the last accepted verdict recorded (none: every sketch is recomputed)."""
    try:
        found = ledger.verdicts.last()
    except VerdictForged:  # the chain's check has already failed on it
        return {}
    return {} if found is None else found[0].sketches


def pipeline_problem(
    ledger: Ledger, state: StateCheck, *, now: datetime, seal: InboxSeal | None = None
) -> str | None:
    """The first problem of the pipeline's tables (``None``: none), every sketch recomputed."""
    return _check_pipeline(ledger, state, now=now, seal=seal, verified={})[0]


def _check_pipeline(
    ledger: Ledger,
    state: StateCheck,
    *,
    now: datetime,
    seal: InboxSeal | None,
    verified: Mapping[str, str],
) -> tuple[str | None, dict[str, str]]:
    """The first problem of the pipeline's tables (``None``: none), naming the table; digests.

    In order: every inbox row's and stored report's tag
    (:class:`dp_governor.budget.audit.row_tags.RowTags`); the reports held per use case and charge
    day against the charges the chain records, and every batch's stored reports against its record
    (:func:`_pipeline_problem`); every sketch against the fold of its folded parts' reports
    (:func:`_sketches`: recomputed unless ``verified`` holds its digest). Days on or before a
    use case's data cutoff (``data_through``, what the purge deletes) are left out of the
    sketches, as they may be half deleted. The digests are those of every sketch checked.
    """
    day = utc_day(now)
    book = ledger.book()
    cutoff = {name: kept.data_through for name, kept in book.purge_through(day).items()}
    digests: dict[str, str] = {}
    held: dict[tuple[int, str, int], int] = {}  # reports the store holds per batch part
    with ledger.connect() as conn:
        problem = _tags(conn, ledger.row_tags, state.legacy_through, seal)
        if problem is None:
            problem = _pipeline_problem(conn, book, day, dict(state.accepted), held)
        if problem is None:
            untagged = NO_HORIZON if state.legacy_through is None else state.legacy_through
            problem = _sketches(ledger, conn, cutoff, verified, digests, held, untagged)
    return problem, digests


@contextmanager
def _rows(conn: Connection, query: Any) -> Iterator[Iterator[Any]]:
    """A query's rows, streamed; the cursor closed however the reading stops."""
    # the option on the statement: on the connection it would stream (and leave open, on an
    # early return) every later query of this connection too
    with conn.execute(query.execution_options(yield_per=_PAGE)) as result:
        yield iter(result)


def _tags(
    conn: Connection, tags: RowTags, legacy: int | None, seal: InboxSeal | None
) -> str | None:
    """Every inbox row and stored report is authentic (untagged: an earlier release's).

    A sealed inbox row opens under the shuffler key (with ``seal``), which authenticates it; a
    clear one (queued before sealing) and every stored report carry their own tag.
    """
    old = legacy if legacy is not None else NO_HORIZON
    i = _INBOX.c
    query = select(i.id, i.use_case, i.params, i.day, i.payload, i.sealed, i.device_tag, i.tag)
    with _rows(conn, query) as rows:
        for row_id, uc, params, d, payload, sealed, device_tag, tag in rows:
            if sealed is not None:
                if seal is None:
                    continue
                try:
                    seal.open(int(row_id), str(uc), str(params), int(d), sealed)
                except SealError as exc:
                    return f"inbox: {exc} (written or edited outside the service)"
                continue
            if tag is None and int(d) <= old:
                continue
            if not tags.check_inbox(row_id, uc, params, d, payload, device_tag, tag):
                return _untrue("inbox", row_id, uc, int(d), tag)
    r = _REPORTS.c
    query = select(r.id, r.use_case, r.params, r.day, r.payload, r.batch, r.tag)
    with _rows(conn, query) as rows:
        for row_id, uc, params, d, payload, batch, tag in rows:
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


def _kept(cutoff: dict[str, int], use_case: str, day: int) -> bool:
    """Whether a use case's rows of ``day`` are past the purge's reach (unknown: all are)."""
    return day > cutoff.get(use_case, NO_HORIZON)


def _sketch_digest(
    key: tuple[str, str, int], n: int, parts: list[tuple[int, int]], state: bytes
) -> str:
    """SHA-256 over what a sketch's recomputation depends on: its blob, count and folded parts.

    ``parts``: each folded part's batch and the reports the store holds of it. The reports'
    bytes are not in it: every stored report's tag is checked on every run (:func:`_tags`), so a
    report can be deleted, not edited or added, and a deletion changes its part's count: an
    unchanged digest is an unchanged fold, whatever days the count check covers.
    """
    h = hashlib.sha256(orjson.dumps([*key, n, sorted(parts)]))
    h.update(hashlib.sha256(state).digest())
    return h.hexdigest()


def _sketches(
    ledger: Ledger,
    conn: Connection,
    cutoff: dict[str, int],
    verified: Mapping[str, str],
    digests: dict[str, str],
    held: Mapping[tuple[int, str, int], int],
    untagged: int = NO_HORIZON,
) -> str | None:
    """Every sketch is the fold of its folded parts' stored reports, recomputed.

    A sketch edited, a part marked folded that was not (or unmarked, so that the fold would add
    it again), a sketch deleted or added: each makes one differ. A sketch whose digest
    (:func:`_sketch_digest`) is the one ``verified`` holds (an earlier accepted verification's,
    under the audit key's tag) is the fold that verification recomputed, and is not decoded
    again, except on days up to ``untagged`` (the last day an earlier release charged), whose
    reports may carry no tag: their bytes are checked only by the recomputation. ``digests``
    receives every checked sketch's digest.
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
        state = conn.execute(
            select(s.state).where((s.use_case == uc) & (s.params == params) & (s.day == d))
        ).scalar_one()
        parts = [(b, held.get((b, params, d), 0)) for b in folded.get(key, [])]
        digest = _sketch_digest(key, sketches[key], parts, bytes(state))
        label = "\t".join(map(str, key))
        if d > untagged and verified.get(label) == digest:
            digests[label] = digest
            continue
        rebuilt = mechanism.sketch()
        for batch in folded.get(key, []):
            for payloads in part_payloads(ledger_engine(ledger), batch, params, d):
                rebuilt.add(mechanism.decode(payloads))
        try:
            stored = sketch_from_bytes(mechanism, state)
            same = sketches_equal(stored, rebuilt)
        except Exception:  # a blob that is no sketch of these parameters
            same = False
        if not same or sketches[key] != int(rebuilt.n):
            return (
                f"sketches: {where} is not the fold of the reports of its folded batch parts"
                " (the sketch edited, or batch_parts' folded marks)"
            )
        digests[label] = digest
    return None


def _window_starts(book: PolicyBook, use_cases: set[str], day: int) -> dict[str, int]:
    """Each use case's last day before its current window (its horizon, if later)."""
    out = {}
    for name in use_cases:
        policy = book.latest.get(name)
        low = day - policy.retention_days if policy is not None else day
        out[name] = max(low, book.horizon(name))
    return out


def _pipeline_problem(
    conn: Connection,
    book: PolicyBook,
    day: int,
    accepted: dict[tuple[str, int], int],
    stored: dict[tuple[int, str, int], int] | None = None,
) -> str | None:
    """What in the inbox and the store disagrees with the charges (``None``: nothing).

    ``stored`` receives the reports the store holds per batch part ``(batch, params, day)``.
    """
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
        if stored is not None:
            stored[key] = int(n)
        if int(batch) in moving:
            stored_moving[int(batch)] += int(n)
            continue
        part = parts_of.pop(key, None)
        if int(d) <= low.get(str(use_case), day):
            continue  # its batch left the window: the purge may be deleting it
        if part is None or part[1] != int(n):
            return (
                f"batch_parts: the report store holds {int(n)} reports of {str(use_case)!r} on day"
                f" {int(d)} in a batch (batch {int(batch)}) whose part records"
                f" {0 if part is None else part[1]}"
            )
    for (_, _, d), (use_case, reports) in parts_of.items():
        if d > low.get(use_case, day):
            return (
                f"batch_parts: the part of {use_case!r} on day {d} records {reports} reports,"
                " the store holds 0 of it"
            )
    for batch, (use_case, moved) in moving.items():
        if stored_moving.get(batch, 0) != moved:
            return (
                f"reports: the report store holds {stored_moving.get(batch, 0)} reports of"
                f" {use_case!r} in the batch being moved, which has moved {moved}"
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
                f"inbox and reports: the inbox and report store hold {found} reports of"
                f" {use_case!r} on day {d}, the chain records {charged} charges"
            )
    return None
