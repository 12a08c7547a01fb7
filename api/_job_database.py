"""The job worker's database sessions: named, and without parallel query workers beside the gate.

PostgreSQL runs a large scan with parallel worker processes, started for the query at the
database's own priority whatever the job worker's niceness: a ``verify`` or ``dashboard``
pass then takes every core of a small machine from the gate's statements. The worker's
sessions run their queries in their own backend alone (``max_parallel_workers_per_gather =
0``); ``dpgov audit report`` and the other commands, run on purpose, keep the database's
setting. Its sessions are named ``dpgov-job`` (``application_name``), so an operator tells
them from the gate's in ``pg_stat_activity``.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Engine, event

__all__ = ["JOB_SESSION_NAME", "as_job_sessions"]

JOB_SESSION_NAME: Final = "dpgov-job"  # the sessions' application_name


def as_job_sessions(engine: Engine) -> bool:
    """Turn off parallel query in, and name, every session ``engine`` opens; whether it applies."""
    if engine.url.get_backend_name() != "postgresql":
        return False

    @event.listens_for(engine, "connect")
    def _as_job(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET max_parallel_workers_per_gather = 0")
            cursor.execute(f"SET application_name = '{JOB_SESSION_NAME}'")
        dbapi_connection.commit()

    return True
