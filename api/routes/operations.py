"""Operations: liveness, Prometheus metrics, and running or releasing a scheduled job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select

from dp_governor.api.deps import AdminDep, EngineDep, LedgerDep, MetricsDep
from dp_governor.api.errors import CONFLICT, NOT_FOUND, SERVICE_UNAVAILABLE, HttpError
from dp_governor.api.jobs import JOBS, JobBusy, lease_of, release_job, run_job
from dp_governor.api.leases import LeaseLost
from dp_governor.api.schemas import Finite, Health, JobRelease, JobRun
from dp_governor.pipeline.tables import InboxRow

__all__ = ["router"]

router = APIRouter(tags=["operations"])

MAX_JOB_WAIT_SECONDS = 600.0  # a client's HTTP timeout is rarely longer
JobName = Annotated[
    str,
    Path(
        description="The scheduled job: `flush-inbox`, `aggregate`, `purge`, `checkpoint`,"
        " `dashboard` or `verify`."
    ),
]


@router.get("/healthz", response_model=Health)
def healthz(ledger: LedgerDep) -> Health:
    """Liveness and database reachability."""
    with ledger.connect() as conn:
        conn.execute(select(1))
    return Health(status="ok")


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(ledger: LedgerDep, service_metrics: MetricsDep) -> PlainTextResponse:
    """Prometheus metrics."""
    with ledger.connect() as conn:
        service_metrics.inbox_depth.set(
            conn.execute(select(func.count()).select_from(InboxRow.__table__)).scalar_one()  # type: ignore[attr-defined]
        )
    return PlainTextResponse(
        generate_latest(service_metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


@router.post("/v1/admin/jobs/{job}:run", response_model=JobRun)
def run_job_now(
    job: JobName,
    request: Request,
    _admin: None = AdminDep,
    force: Annotated[
        bool, Query(description="Take the job's lease from whoever holds it (after a crash).")
    ] = False,
    wait: Annotated[
        Finite,
        Query(
            ge=0,
            le=MAX_JOB_WAIT_SECONDS,
            description="Seconds to wait for the job's lease while another process runs the"
            " job (its scheduler, `dpgov jobs run`); 0 answers 409 at once.",
        ),
    ] = 0.0,
) -> JobRun:
    """Run a scheduled job now (``flush-inbox``, ``aggregate``, ``purge``, ``checkpoint``).

    409 while another process holds the job's lease, once ``wait`` seconds have passed.
    """
    if job not in JOBS:
        raise HttpError(NOT_FOUND, f"unknown job {job!r}; jobs: {', '.join(JOBS)}")
    try:
        result = run_job(job, request.app.state.runtime_key, wait_seconds=wait, force=force)
    except JobBusy as exc:
        raise HttpError(SERVICE_UNAVAILABLE, str(exc)) from None
    except LeaseLost as exc:
        raise HttpError(CONFLICT, str(exc)) from None
    if result is None:
        raise HttpError(
            CONFLICT,
            f"job {job!r} is running in another process; wait=SECONDS waits for it,"
            " force=true takes its lease",
        )
    return JobRun(job=job, result=result)


@router.post("/v1/admin/jobs/{job}:release", response_model=JobRelease)
def release_job_now(job: JobName, engine: EngineDep, _admin: None = AdminDep) -> JobRelease:
    """Clear a job's lease whoever holds it (a crashed process); ``released``: it was held."""
    if job not in JOBS:
        raise HttpError(NOT_FOUND, f"unknown job {job!r}; jobs: {', '.join(JOBS)}")
    released = release_job(engine, job)
    return JobRelease(job=job, lease=lease_of(job), released=released)
