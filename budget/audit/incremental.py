"""One verification of the chain, the deciding state and the transparency log, full or resumed.

A full verification replays every entry from the first. An incremental one starts at the last
accepted verdict (:mod:`dp_governor.budget.audit.verdicts`): it checks that verdict's signed
checkpoint and the entry it signs, restores the state replayed up to there, and replays only
the later entries; the transparency log's check resumes where the last one stopped. Either
way, the state is snapshotted at the newest signed checkpoint the replay passes, which is where
the next incremental verification starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine

from dp_governor.budget.audit.archive import ArchiveError, Archives
from dp_governor.budget.audit.log import AuditLog, Checkpoint, Verification
from dp_governor.budget.audit.tlog import TlogVerification, TransparencyLog
from dp_governor.budget.audit.verdicts import Resume, VerdictForged, Verdicts
from dp_governor.budget.audit.verify import StateCheck, StateReplay, budgets_since

__all__ = ["PROGRESS_EVERY", "verify_ledger"]

PROGRESS_EVERY = 1000  # audit entries between two progress reports of a verification


def verify_ledger(
    audit: AuditLog,
    tlog: TransparencyLog,
    verdicts: Verdicts,
    audit_key: bytes,
    *,
    kept: Iterable[Checkpoint] = (),
    progress: Callable[[int, int], None] | None = None,
    full: bool = True,
    archives: Archives | None = None,
    archive_files: Sequence[Path] = (),
) -> tuple[Verification, StateCheck]:
    """The chain, the tables against it and the transparency log; where the next run starts.

    ``full=False`` resumes at the last accepted verdict (a full replay when there is none).
    Once entries are archived (``archives``), a replay that would start at the first entry
    starts at the newest archive's boundary from the state recorded there, comparing every
    day, and its note says so; with ``archive_files`` (every archive's file) it replays the
    files first instead, a full replay from the first entry. ``progress`` is told
    ``(replayed, to replay)``: the entries after the starting point. The state check's
    ``resume`` is ``None`` unless everything checked here was accepted. ``archive_files`` that
    are not every archive's file raise :class:`~dp_governor.budget.audit.archive.NotTheArchives`
    before anything is checked (a wrong argument is no verdict).
    """
    engine: Engine = audit.engine
    try:
        found = None if full else verdicts.last()
        records = [] if archives is None else archives.records()
        before = archives.replay(archive_files, records) if archive_files and archives else None
    except (VerdictForged, ArchiveError) as exc:
        seq, head = audit.head()
        failed = Verification(False, 0, seq, head, 0, None, None, None, str(exc))
        return failed, StateCheck(False, note="no verdict to start from")
    start = None if found is None else found[0]
    archived_note = None
    if start is None and records and before is None:
        start = records[-1].resume()  # the oldest entry the log holds, and the state there
        archived_note = (
            f"entries before {start.checkpoint.seq} are archived and were not replayed"
            " (`--archive FILE` replays them)"
        )
    if start is None:
        replay = StateReplay(audit_key, budgets_since=budgets_since(engine))
    else:
        replay = StateReplay.restore(audit_key, start.state, new_days_only=archived_note is None)
    newest = audit.latest_checkpoint()  # one row: verify streams the rest
    if newest is not None and start is not None and newest.seq <= start.checkpoint.seq:
        newest = None
    snapshots: list[str] = []
    # progress counts the entries this run replays, as the verdict's `entries` does
    base = 0 if start is None else start.checkpoint.seq
    total = max(audit.head()[0] - base, 0)
    if progress is not None:
        progress(0, total)

    def observe(seq: int, actor: str, action: str, body: str) -> None:
        replay(seq, actor, action, body)
        if newest is not None and seq == newest.seq:
            snapshots.append(replay.snapshot())
        done = seq - base
        if progress is not None and (done % PROGRESS_EVERY == 0 or done == total):
            progress(done, total)

    try:
        chain = audit.verify(
            external=kept,
            observe=observe,
            start=None if start is None else start.checkpoint,
            before=() if before is None else before,
        )
    except ArchiveError as exc:
        seq, head = audit.head()
        failed = Verification(False, 0, seq, head, 0, None, None, None, str(exc))
        return failed, StateCheck(False, note="an archive failed: the state was not checked")
    if not chain.ok:
        return chain, StateCheck(False, note="the chain failed: the state was not checked")
    state = replay.compare(engine)
    if archived_note is not None:
        state = replace(
            state, note=archived_note if state.note is None else f"{state.note}; {archived_note}"
        )
    resume = None
    if state.problem is None:
        try:
            public = tlog.verify(
                start=None if start is None else _tlog_start(start),
                before=()
                if before is None or archives is None
                else archives.replay(archive_files, records),
            )
        except ArchiveError as exc:
            return _verdict(chain, state, str(exc)), state
        if not public.ok:
            problem = f"transparency log: {public.problem}"
            return _verdict(chain, state, problem), state
        at = (public.leaves, tuple(e.hex() for e in public.edge), public.nodes)
        if newest is not None and snapshots:
            resume = Resume(newest, snapshots[0], at)
        elif start is not None:
            resume = Resume(start.checkpoint, start.state, at)
    return _verdict(chain, state, state.problem), replace(state, resume=resume)


def _tlog_start(start: Resume) -> TlogVerification:
    """The transparency log's accepted check that ``start`` records (where it resumes)."""
    leaves, edge, nodes = start.tlog
    return TlogVerification(True, leaves, 0, None, tuple(bytes.fromhex(e) for e in edge), nodes)


def _verdict(chain: Verification, state: StateCheck, problem: str | None) -> Verification:
    """The chain's verification with the state's outcome."""
    return replace(
        chain,
        ok=problem is None,
        problem=problem,
        state_checked=state.checked,
        note=state.note,
    )
