"""Scheduled jobs, declared once: ids, textual references, and the runner that takes their leases.

APScheduler 3 runs ``dp_governor.api.jobs:run_scheduled`` by textual reference with primitive
arguments (the job name and the runtime's registry key); each run first takes a database lease
(:mod:`dp_governor.api.leases`), so
however many processes schedule a job, one runs it at a time. ``flush-inbox`` and ``aggregate`` both
move the inbox, so they share one lease. Leases are short (``lease_seconds``, a minute by default)
and a heartbeat thread renews the lease while its job runs, so a process that dies mid-job
blocks the job for at most that long. The same names are what ``dpgov jobs run NAME [--force]``,
``dpgov jobs release NAME`` and ``POST /v1/admin/jobs/{name}:run`` / ``:release`` take.

The jobs are safe to run concurrently (see :mod:`dp_governor.pipeline`): the leases
save work, they are not what keeps a report from being stored or folded twice.

Fencing: a lease carries a token that rises whenever another holder takes it (its lease
expired, or an operator forced it). Every write transaction of a running job first checks, in
that transaction, that the token is still the one the job started with (PostgreSQL: ``FOR
SHARE`` on the lease row, so a takeover waits for the transactions already checked), and the
job stops with :class:`LeaseLost` otherwise: a process that stalled past its lease (a pause, a
swap storm, a stopped container) writes nothing once another holds it. Each job transaction
waits for locks at most ``job_lock_seconds`` (:func:`dp_governor.budget.storage.db.write_step`), so
a holder stalled inside a transaction delays the next holder that long at most.

The population jobs (:data:`CHILD_JOBS`: ``dashboard``, ``verify``, ``purge``) of a service
run in its job worker, a long-lived child process at a lower CPU priority
(``DPGOV_JOB_CPU``, :mod:`dp_governor.api._job_process`), so that reading the whole ledger
takes neither the server's interpreter lock nor most of its CPU; the lease, heartbeat, log
line and metrics stay the server's. The jobs' write steps, the stored summaries among them,
are fenced with the lease's token the server holds; a verification's verdict is not (it is
consistent with the snapshot it was computed from, and the next run replaces it).
``dpgov jobs run`` lowers its own priority as much for them.

This module sits beside the app and the CLI rather than in :mod:`dp_governor.pipeline`: it runs
the pipeline's jobs and the audit log's checkpoints alike, for the service's scheduler, its admin
routes and ``dpgov jobs``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from dp_governor.api._handles import ledger_engine
from dp_governor.api._integrity import kept_checkpoints
from dp_governor.api._job_process import JobProcessError, JobWorker, busy_cause
from dp_governor.api._service import Service
from dp_governor.api._snapshots import store_figures, store_verification
from dp_governor.api._witnessing import WitnessEndpoint, push_checkpoint
from dp_governor.api.leases import (
    DEFAULT_LEASE_SECONDS,
    LeaseLost,
    acquire_lease,
    fence,
    heartbeat,
    lease_holder,
    lease_token,
    release_lease,
)
from dp_governor.api.logs import log_fields
from dp_governor.api.metrics import Metrics
from dp_governor.budget import Clock, FixedClock, Ledger
from dp_governor.budget.audit.log import CheckpointFileError, last_kept_seq, write_checkpoints
from dp_governor.budget.clock import utc_day
from dp_governor.budget.reporting.claims import publish_claims
from dp_governor.budget.storage.db import (
    fenced,
    is_busy,
)
from dp_governor.pipeline.flush import DEFAULT_MIN_BATCH, flush_inbox, waiting_reports
from dp_governor.pipeline.fold import aggregate
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.purge import purge

if TYPE_CHECKING:
    from dp_governor.api.settings import Settings

__all__ = [
    "CHILD_JOBS",
    "JOBS",
    "LEASES",
    "JobBusy",
    "Runtime",
    "lease_of",
    "release_job",
    "run_job",
    "run_scheduled",
    "start_scheduler",
]

log = logging.getLogger("dpgov.jobs")


@dataclass
class Runtime:
    """What jobs need: the ledger, the ingestor, the clock, batch sizes and the lease's TTL.

    ``progress``, given a step's name (``flush-inbox``, ``aggregate``), returns the callback
    that step reports its counts to (``dpgov jobs run`` passes its progress bar's ``step``).
    ``metrics``: where each run's outcome, duration and success time are counted (the app's).
    ``worker``: set, the :data:`CHILD_JOBS` run in that job worker (the service's); ``None``,
    in this process.
    """

    ledger: Ledger
    ingestor: Ingestor
    clock: Clock
    shuffle_batch: int = 10_000
    min_batch: int = DEFAULT_MIN_BATCH
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    checkpoint_file: Path | None = None
    witnesses: tuple[WitnessEndpoint, ...] = ()
    progress: Callable[[str], Callable[[int, int], None]] | None = None
    metrics: Metrics | None = None
    worker: JobWorker | None = None
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )

    @classmethod
    def configured(
        cls,
        ledger: Ledger,
        ingestor: Ingestor,
        clock: Clock,
        settings: Settings,
        progress: Callable[[str], Callable[[int, int], None]] | None = None,
        *,
        metrics: Metrics | None = None,
        worker: JobWorker | None = None,
    ) -> Runtime:
        """The runtime the service's settings describe (``dpgov serve`` and ``dpgov jobs``)."""
        return cls(
            ledger,
            ingestor,
            clock,
            settings.shuffle_batch,
            min_batch=settings.flush_min_batch,
            lease_seconds=settings.job_lease_seconds,
            checkpoint_file=settings.checkpoint_file,
            witnesses=tuple(WitnessEndpoint.parse(entry) for entry in settings.witnesses),
            progress=progress,
            metrics=metrics,
            worker=worker,
        )

    def step(self, name: str) -> Callable[[int, int], None] | None:
        """The progress callback of one step of a job, if anyone asked for progress."""
        return None if self.progress is None else self.progress(name)


def _flush(rt: Runtime) -> dict[str, Any]:
    """Flush the inbox; ``waiting``: the reports left in it, below a batch's minimums."""
    moved = _flush_inbox(rt)
    return {"moved": moved, "waiting": waiting_reports(ledger_engine(rt.ledger))}


def _flush_inbox(rt: Runtime) -> int:
    return flush_inbox(
        ledger_engine(rt.ledger),
        seal=rt.ingestor.seal,
        batch=rt.shuffle_batch,
        min_batch=rt.min_batch,
        now=rt.clock.now(),
        progress=rt.step("flush-inbox, reports checked"),
        ledger=rt.ledger,
    )


def _aggregate(rt: Runtime) -> dict[str, Any]:
    moved = _flush_inbox(rt)
    result = aggregate(rt.ledger, progress=rt.step("aggregate"))
    return {
        "moved": moved,
        "folded": result.reports,
        "sketches": result.sketches,
        "failed": result.failed,
    }


def _purge(rt: Runtime) -> dict[str, Any]:
    return purge(rt.ledger, now=rt.clock.now())


def _checkpoint(rt: Runtime) -> dict[str, Any]:
    """Claim the days that ended, sign the log and the head, append the checkpoints the file lacks.

    A kept file that cannot be read is left as it is (appending to a torn line would hide
    the next checkpoint too); the result's ``kept`` names the problem, and so does every
    ``verify`` until an operator repairs the file.
    """
    now = rt.clock.now()
    marks = [time.monotonic()]
    # the claims of the days that ended, before the head is signed, so this checkpoint has them
    claims = publish_claims(rt.ledger, today=utc_day(now), now=now)
    marks.append(time.monotonic())
    # the transparency log first: its steps never wait for the audit head's row lock, which
    # every batch of reports holds while it commits
    public = rt.ledger.tlog.sync()  # the transparency log's tree and its signed checkpoint
    marks.append(time.monotonic())
    signed_tlog = None if public is None else {"size": public.size, "root": public.root.hex()}
    point = rt.ledger.audit.checkpoint(now=now)
    marks.append(time.monotonic())
    signed = None if point is None else {"seq": point.seq, "hash": point.hash, "at": point.at}
    # the newest checkpoint to the witnesses (also the one a witness that was down missed)
    witnessed = push_checkpoint(rt.ledger.tlog, rt.witnesses, metrics=rt.metrics)
    marks.append(time.monotonic())
    log.debug(
        "job checkpoint: claims %.0f ms, tlog %.0f ms, audit head %.0f ms, witnesses %.0f ms",
        *((b - a) * 1000 for a, b in pairwise(marks)),
    )
    done = {"signed": signed, "tlog": signed_tlog, "claims": claims, "witnesses": witnessed}
    path = rt.checkpoint_file
    if path is None:
        return done
    try:  # every checkpoint after the file's last line (also ones a failed append missed)
        held = last_kept_seq(path) if path.exists() or path.is_symlink() else 0
        added = write_checkpoints(rt.ledger.audit.iter_checkpoints(after=held), path)
    except CheckpointFileError as exc:
        log.error("job checkpoint: %s; nothing was appended to it", exc)
        return done | {"kept": {"added": 0, "problem": str(exc)}}
    return done | {"kept": {"added": added, "problem": None}}


def _dashboard(rt: Runtime) -> dict[str, Any]:
    """Compute the public pages' figures and store them (:mod:`dp_governor.api._snapshots`)."""
    return store_figures(rt.ledger, now=rt.clock.now())


def _verify(rt: Runtime) -> dict[str, Any]:
    """Verify everything and store the verdict the pages show (a failure is a result)."""
    on_verified = None if rt.metrics is None else rt.metrics.verified
    kept = kept_checkpoints(rt.checkpoint_file)
    return store_verification(
        rt.ledger, now=rt.clock.now(), kept=kept, seal=rt.ingestor.seal, on_verified=on_verified
    )


JOBS: dict[str, tuple[Callable[[Runtime], dict[str, Any]], dict[str, Any]]] = {
    "flush-inbox": (_flush, {"trigger": "interval", "seconds": 60}),
    "aggregate": (_aggregate, {"trigger": "interval", "seconds": 300}),
    "purge": (_purge, {"trigger": "cron", "hour": 0, "minute": 15}),
    "checkpoint": (_checkpoint, {"trigger": "interval", "seconds": 5}),
    "dashboard": (_dashboard, {"trigger": "interval", "seconds": 60}),
    "verify": (_verify, {"trigger": "interval", "seconds": 300}),
}

# The population passes: a service runs them in its job worker at the lowest CPU priority
CHILD_JOBS = frozenset({"dashboard", "verify", "purge"})

# Which lease each job runs under: everything that moves the inbox shares one.
LEASES: dict[str, str] = {
    "flush-inbox": "inbox",
    "aggregate": "inbox",
    "purge": "purge",
    "checkpoint": "checkpoint",
    "dashboard": "dashboard",
    "verify": "verify",
}

# Jobs run as soon as the scheduler starts too: what the public pages read is there at once
AT_START = frozenset({"dashboard", "verify"})

# Runtimes by key, so that jobs scheduled by textual reference get primitive arguments only.
RUNTIMES: dict[str, Runtime] = {}


def lease_of(name: str) -> str:
    """The lease a job runs under (``inbox:run`` for both jobs that move the inbox)."""
    return f"{LEASES[name]}:run"


def release_job(engine: Engine, name: str) -> bool:
    """The operator's override: clear the job's lease whoever holds it (a crashed process)."""
    if name not in JOBS:
        raise KeyError(name)
    released = release_lease(engine, lease_of(name), None)
    if released:
        log.warning("job %s: lease %s released by the operator", name, lease_of(name))
    return released


class JobBusy(RuntimeError):
    """A job stopped because the database stayed locked past its busy timeout.

    Everything it committed before stays committed, and its next run resumes the work;
    ``cause`` is the database's own message.
    """

    def __init__(self, job: str, cause: str) -> None:
        self.job = job
        self.cause = cause
        super().__init__(
            f"job {job!r} stopped: the database stayed busy ({cause}); its work so far is kept"
            " and its next run resumes it"
        )


def run_job(
    name: str,
    runtime_key: str,
    slot_seconds: float = 0.0,
    wait_seconds: float = 0.0,
    *,
    force: bool = False,
) -> dict[str, Any] | None:
    """Run one job under its lease; ``None`` when it is not this process's turn.

    The run lease (``inbox:run``, ``purge:run``, ...) is held while the job runs, renewed by a
    heartbeat, and released after, so two runs never overlap; a scheduled run waits up to
    ``wait_seconds`` for it (a flush and an aggregate due in the same second run one after the
    other). A scheduled run that completes takes ``NAME:slot`` for most of its interval, and a
    scheduled run skips while another process holds it (checked under the run lease), so when N
    processes schedule the same job, one of them runs it per interval; a run that crashed took
    no slot, so the next process's run goes ahead. ``force`` takes the run lease from whoever
    holds it (an operator's override after a crash).

    A database still locked after its busy timeout (SQLite: another process's long write)
    stops the job with one log line (``outcome`` ``busy``) and :class:`JobBusy`; each of the
    job's transactions is short and complete, so the next run resumes where it stopped.
    """
    if name not in JOBS:
        raise KeyError(name)
    runtime = RUNTIMES[runtime_key]
    started = time.monotonic()
    began: list[float] = []  # when the job itself started, once it has its lease
    outcome = "failed"
    try:
        result = _run(name, runtime, slot_seconds, wait_seconds, force=force, began=began)
        outcome = "done" if result is not None else "skipped"
        return result
    except LeaseLost as exc:
        outcome = "lease_lost"
        ms = round((time.monotonic() - started) * 1000, 1)
        named = LeaseLost(exc.lease, exc.token, exc.current, name)
        lost = log_fields(job=name, outcome="lease_lost", duration_ms=ms, token=exc.token)
        log.warning("%s", named, extra=lost)
        raise named from None
    except (DBAPIError, JobProcessError) as exc:
        cause = busy_cause(exc)
        if cause is None:
            raise
        outcome = "busy"
        ms = round((time.monotonic() - started) * 1000, 1)
        fields = log_fields(job=name, outcome="busy", duration_ms=ms, error=cause)
        log.warning(
            "job %s stopped after %.0f ms: the database stayed busy (%s); the next run resumes",
            name,
            ms,
            cause,
            extra=fields,
        )
        raise JobBusy(name, cause) from None
    finally:
        if runtime.metrics is not None:
            seconds = time.monotonic() - began[0] if began else None
            runtime.metrics.job_finished(name, outcome, seconds)


def run_scheduled(
    name: str, runtime_key: str, slot_seconds: float = 0.0, wait_seconds: float = 0.0
) -> dict[str, Any] | None:
    """The scheduler's entry point: :func:`run_job`, a busy database or a lost lease logged."""
    try:
        return run_job(name, runtime_key, slot_seconds, wait_seconds)
    except (JobBusy, LeaseLost):
        return None  # logged once by run_job; the next scheduled run resumes


def _run(
    name: str,
    rt: Runtime,
    slot_seconds: float,
    wait_seconds: float,
    *,
    force: bool,
    began: list[float],
) -> dict[str, Any] | None:
    """:func:`run_job` once the job is known: lease, slot, heartbeat, run, log.

    ``began`` receives the moment the job itself starts (its lease and slot taken).
    """
    engine = ledger_engine(rt.ledger)
    lease = lease_of(name)
    deadline = time.monotonic() + wait_seconds
    while (token := acquire_lease(engine, lease, rt.holder, rt.lease_seconds, force=force)) is None:
        if time.monotonic() >= deadline:
            skip = log_fields(job=name, outcome="skipped", holder="another process")
            log.info("job %s skipped: another process holds %s", name, lease, extra=skip)
            return None
        time.sleep(min(1.0, rt.lease_seconds / 3))
    slot = f"{name}:slot"
    try:
        ran = None if slot_seconds <= 0 else lease_holder(engine, slot)
        if ran is not None and ran[0] != rt.holder:
            skip = log_fields(job=name, outcome="skipped", holder="another process")
            log.info("job %s skipped: another process ran it in this interval", name, extra=skip)
            return None
        started = time.monotonic()
        began.append(started)
        try:
            with heartbeat(engine, lease, rt.holder, rt.lease_seconds, token):
                result = _work(name, rt, lease, token)
        except LeaseLost:
            raise  # one line, by run_job
        except Exception as exc:
            lost, current = _taken_over(engine, lease, token)
            if lost:  # e.g. its session ended while it stalled inside a transaction
                raise LeaseLost(lease, token, current) from None
            if busy_cause(exc) is not None:
                raise  # one line, by run_job
            ms = round((time.monotonic() - started) * 1000, 1)
            error = exc.error if isinstance(exc, JobProcessError) else type(exc).__name__
            fields = log_fields(job=name, outcome="failed", duration_ms=ms, error=error)
            log.warning("job %s failed after %.0f ms: %s", name, ms, exc, extra=fields)
            raise
        if slot_seconds > 0:  # taken once the run is done: a crashed run leaves it free
            acquire_lease(engine, slot, rt.holder, slot_seconds, force=True)
        ms = round((time.monotonic() - started) * 1000, 1)
        counts = {k: v for k, v in result.items() if isinstance(v, int | float | str | None)}
        fields = log_fields(**{**counts, "job": name, "outcome": "done", "duration_ms": ms})
        log.info("job %s done in %.0f ms: %s", name, ms, result, extra=fields)
        return result
    finally:
        try:
            release_lease(engine, lease, rt.holder, token)
        except DBAPIError as exc:  # it expires by itself; the job's outcome is what matters
            if not is_busy(exc):  # a busy database is the job's outcome line already
                log.warning("lease %s: not released (%s); it expires by itself", lease, exc)


def _work(name: str, rt: Runtime, lease: str, token: int) -> dict[str, Any]:
    """The job's own work under its lease's fence: a service's :data:`CHILD_JOBS` in its worker."""
    if rt.worker is None or name not in CHILD_JOBS:
        with fenced(fence(lease, token)):
            return JOBS[name][0](rt)
    return rt.worker.call(_in_worker, JOBS[name][0], rt.clock.now(), lease, token)


def _in_worker(
    service: Service,
    job: Callable[[Runtime], dict[str, Any]],
    now: datetime,
    lease: str,
    token: int,
) -> dict[str, Any]:
    """In the job worker: run ``job`` on its service, every write fenced by the parent's token.

    Its clock reads ``now``, the moment the parent started the run. Its log lines go where the
    server's do, in its format; its verdicts reach the metrics through the database (the
    ``verify`` job stores them, and the app's metrics follow what is stored).
    """
    settings = service.settings
    rt = Runtime.configured(service.ledger, service.ingestor, FixedClock(now), settings)
    with fenced(fence(lease, token)):
        return job(rt)


def _taken_over(engine: Engine, lease: str, token: int) -> tuple[bool, int | None]:
    """Whether the lease is known to be under another token now, and that token."""
    try:
        current = lease_token(engine, lease)
    except DBAPIError:  # the database cannot say: the job's own error stands
        return False, None
    return current != token, current


def start_scheduler(
    runtime_key: str,
    intervals: dict[str, int] | None = None,
    names: Collection[str] | None = None,
) -> BackgroundScheduler:
    """Start a background scheduler with the jobs ``names`` (default every job; memory store)."""
    scheduler = BackgroundScheduler(timezone="UTC")
    for name, (_, trigger) in JOBS.items():
        if names is not None and name not in names:
            continue
        options = dict(trigger)
        if intervals and name in intervals and options["trigger"] == "interval":
            options["seconds"] = intervals[name]
        period = float(options.get("seconds", 86_400))
        if name in AT_START:  # the pages' figures and verdict from the start, not an interval on
            options["next_run_time"] = datetime.now(UTC)
        scheduler.add_job(
            "dp_governor.api.jobs:run_scheduled",
            id=name,
            name=name,
            args=[name, runtime_key, 0.9 * period, min(0.5 * period, 600.0)],
            replace_existing=True,
            coalesce=True,
            max_instances=1,
            misfire_grace_time=None,  # a run the busy process woke late for runs late, not never
            **options,
        )
    scheduler.start()
    log.info("scheduled here: %s", ", ".join(job.id for job in scheduler.get_jobs()))
    return scheduler
