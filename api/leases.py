"""Job leases: one process runs a job at a time; a stalled holder writes nothing after a takeover.

A lease is a row of ``job_leases`` with its holder, its expiry and a fencing token that rises
whenever the lease changes hands. :func:`acquire_lease` takes it, :func:`heartbeat` renews it
while the job runs, :func:`fence` is the check each job transaction runs first
(:func:`dp_governor.budget.storage.db.fenced`), and :class:`LeaseLost` stops a job that lost it.
The runner that uses them is :mod:`dp_governor.api.jobs`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from dp_governor.budget.storage.db import bound_lock_wait, is_busy, job_lock_seconds, job_writer
from dp_governor.pipeline.tables import JobLease

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "LeaseLost",
    "acquire_lease",
    "fence",
    "heartbeat",
    "lease_holder",
    "lease_token",
    "release_lease",
    "renew_lease",
]

log = logging.getLogger("dpgov.jobs")
_LEASES = JobLease.__table__  # type: ignore[attr-defined]
DEFAULT_LEASE_SECONDS = 60.0


def acquire_lease(
    engine: Engine, job: str, holder: str, ttl: float, *, force: bool = False
) -> int | None:
    """Take (or renew) the lease if it is free, expired or ours; ``force`` takes it regardless.

    Returns the lease's fencing token (at least 1), or ``None`` when another process holds it.
    The token rises when the lease changes hands or is forced, and stays when its holder renews
    it. Atomic on both backends: a conditional update, or an insert that loses to a concurrent
    one. Its row locked past ``job_lock_seconds`` (a holder stalled inside a transaction) is a
    busy database (:func:`dp_governor.budget.storage.db.is_busy`), as for the job's own
    transactions.
    """
    now = time.time()
    with job_writer(engine).begin() as conn:
        bound_lock_wait(conn, job_lock_seconds(engine))
        table = _LEASES
        existing = conn.execute(table.select().where(table.c.job == job)).first()
        if existing is None:
            try:
                with conn.begin_nested():
                    conn.execute(
                        table.insert().values(job=job, holder=holder, until=now + ttl, token=1)
                    )
                return 1
            except IntegrityError:  # a concurrent first insert won
                return None
        token = int(existing.token) + (force or existing.holder != holder)
        query = table.update().where(table.c.job == job)
        if not force:
            query = query.where((table.c.until < now) | (table.c.holder == holder))
        query = query.where(table.c.token == existing.token)  # unchanged since read
        updated = conn.execute(query.values(holder=holder, until=now + ttl, token=token))
        return token if updated.rowcount else None


def renew_lease(engine: Engine, job: str, holder: str, token: int, ttl: float) -> bool:
    """Extend the lease ``holder`` holds under ``token``; ``False``: it was taken over."""
    with job_writer(engine).begin() as conn:
        bound_lock_wait(conn, job_lock_seconds(engine))
        query = _LEASES.update().where(
            (_LEASES.c.job == job) & (_LEASES.c.holder == holder) & (_LEASES.c.token == token)
        )
        return bool(conn.execute(query.values(until=time.time() + ttl)).rowcount)


def release_lease(engine: Engine, job: str, holder: str | None, token: int | None = None) -> bool:
    """Give the lease back (``holder=None``: whoever holds it); whether a live one was cleared.

    With ``token``, only the lease held under that token (a holder that lost its lease never
    clears its successor's).
    """
    with job_writer(engine).begin() as conn:
        bound_lock_wait(conn, job_lock_seconds(engine))
        query = _LEASES.update().where((_LEASES.c.job == job) & (_LEASES.c.until > time.time()))
        if holder is not None:
            query = query.where(_LEASES.c.holder == holder)
        if token is not None:
            query = query.where(_LEASES.c.token == token)
        return bool(conn.execute(query.values(until=0.0)).rowcount)


def lease_token(engine: Engine, job: str) -> int | None:
    """The lease's current fencing token (``None``: never taken)."""
    with engine.connect() as conn:
        found = conn.execute(select(_LEASES.c.token).where(_LEASES.c.job == job)).scalar()
    return None if found is None else int(found)


class LeaseLost(RuntimeError):
    """A job stopped because another process took its lease over while it ran.

    What it committed before stays committed (every job transaction is complete on its own),
    and the new holder carries the work on; nothing was written after the takeover.
    """

    def __init__(self, lease: str, token: int, current: int | None, job: str | None = None) -> None:
        self.lease = lease
        self.token = token
        self.current = current
        self.job = job
        now = "gone" if current is None else f"now {current}"
        who = f"job {job!r}" if job is not None else f"the job under {lease!r}"
        super().__init__(
            f"{who} stopped: it lost its lease {lease!r} to another process (token {token},"
            f" {now}); its work so far is kept and the new holder carries it on"
        )


def fence(lease: str, token: int) -> Callable[[Connection], None]:
    """The check each of the job's write transactions runs first (:func:`fenced`)."""
    query = select(_LEASES.c.token).where(_LEASES.c.job == lease).with_for_update(read=True)

    def check(conn: Connection) -> None:
        current = conn.execute(query).scalar()
        if current is None or int(current) != token:
            raise LeaseLost(lease, token, None if current is None else int(current))

    return check


def lease_holder(engine: Engine, job: str) -> tuple[str, float] | None:
    """Who holds the lease and for how many more seconds; ``None`` if it is free."""
    with engine.connect() as conn:
        row = conn.execute(
            _LEASES.select().where((_LEASES.c.job == job) & (_LEASES.c.until > time.time()))
        ).first()
    return None if row is None else (str(row.holder), float(row.until) - time.time())


@contextmanager
def heartbeat(engine: Engine, lease: str, holder: str, ttl: float, token: int) -> Iterator[None]:
    """Renew the lease every ``ttl / 3`` seconds until the block ends (a daemon thread).

    Only under the job's own token: a lease taken over is never taken back by a late beat
    (the job's next write stops it, :class:`LeaseLost`).
    """
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(ttl / 3):
            try:
                if not renew_lease(engine, lease, holder, token, ttl):
                    log.warning("lease %s was taken over while its job ran", lease)
                    return
            except DBAPIError as exc:  # a busy or lost database: the next beat tries again
                if not is_busy(exc):
                    log.exception("lease %s: renewal failed", lease)
                else:
                    log.warning("lease %s: not renewed, the database is busy; retrying", lease)

    thread = threading.Thread(target=beat, name=f"lease-{lease}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
