"""The FastAPI service: ``create_app(settings)``; engine, ledger, scheduler live in the lifespan."""

from __future__ import annotations

import gc
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from functools import partial

from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from dp_governor import __version__
from dp_governor.api import errors
from dp_governor.api._caches import Caches
from dp_governor.api._committer import GroupCommitter
from dp_governor.api._handles import policy_store
from dp_governor.api._job_process import JobWorker
from dp_governor.api._keys import service_keys
from dp_governor.api._lane import ReportLane
from dp_governor.api._middleware import BodyLimit, HeadAsGet, Timing
from dp_governor.api._ratelimit import RateLimiter
from dp_governor.api._service import open_service_parts, service_engine
from dp_governor.api._unknown_settings import SettingRefused, retired_variables
from dp_governor.api.database import database_problem, init_service_db
from dp_governor.api.jobs import RUNTIMES, Runtime, start_scheduler
from dp_governor.api.metrics import Metrics
from dp_governor.api.openapi import install_docs, install_openapi
from dp_governor.api.routes import (
    audit,
    budgets,
    dashboard,
    estimates,
    operations,
    reports,
    signin,
    transparency,
    use_cases,
)
from dp_governor.api.server import report_start_failure
from dp_governor.api.settings import KeyRefused, Settings, setting_problem
from dp_governor.budget import Clock, SystemClock

__all__ = ["create_app"]

log = logging.getLogger("dpgov.api")


def create_app(settings: Settings | None = None, *, clock: Clock | None = None) -> FastAPI:
    """Build the service. Nothing connects until the lifespan starts."""
    try:
        settings = settings or Settings()
    except ValidationError as exc:  # a worker of `dpgov serve`: its supervisor says why
        err = exc.errors()[0]
        report_start_failure(setting_problem(err, {}))
        raise
    except SettingRefused as exc:
        report_start_failure(str(exc))
        raise
    app = FastAPI(
        responses=errors.ERROR_RESPONSES,
        title="dp-governor",
        version=__version__,  # the installed distribution's, from pyproject.toml
        description="Privacy accounting and budget governance for local-DP telemetry.",
        lifespan=lifespan,
        docs_url=None,  # served by api.openapi from packaged files, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.clock = clock or SystemClock()
    app.state.metrics = Metrics()
    app.state.caches = Caches(settings, app.state.clock)
    app.state.device_limit = RateLimiter(
        settings.device_rate_per_minute, max_keys=settings.rate_limit_keys
    )
    app.state.admin_failures = RateLimiter(
        settings.admin_failures_per_minute, max_keys=settings.rate_limit_keys
    )
    app.add_middleware(HeadAsGet)  # innermost: the request log still says HEAD
    app.add_middleware(ReportLane)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Timing, histogram=app.state.metrics.latency)
    errors.install(app)
    app.include_router(reports.router)
    app.include_router(reports.batch_router(settings.max_batch_items))
    app.include_router(budgets.router)
    app.include_router(use_cases.router)
    app.include_router(estimates.router)
    app.include_router(operations.router)
    app.include_router(audit.router)
    app.include_router(transparency.router)
    app.include_router(dashboard.router)
    app.include_router(signin.router)
    install_openapi(app)
    install_docs(app)
    return app


def _recorded_verification(caches: Caches, engine: Engine) -> tuple[bool, float] | None:
    """The ``verify`` job's last verdict and when (Unix time) for the metrics; None: none yet.

    A database that cannot answer leaves the metrics to this process's own figures: a scrape
    never fails on it.
    """
    try:
        found = caches.snapshots.verified(engine)
    except SQLAlchemyError:
        return None
    if found is None:
        return None
    return found.verification.ok, datetime.fromisoformat(found.at).timestamp()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the database and keys, load default policies, start the committer and scheduler."""
    settings: Settings = app.state.settings
    clock: Clock = app.state.clock
    for warning in retired_variables(os.environ):
        log.warning("%s", warning)
    if settings.admin_token is None:
        log.warning(
            "no admin token is set: every admin route refuses. Set DPGOV_ADMIN_TOKEN to at"
            " least 32 characters (python3 -c 'import secrets;"
            " print(secrets.token_urlsafe(32))') and restart."
        )
    engine = service_engine(settings)
    try:  # the keys must be the database's (KeyRefused names the setting to provide)
        init_service_db(engine)
        keys = service_keys(settings, engine, generate=True, record=True)
    except Exception as exc:
        engine.dispose()
        report_start_failure(database_problem(settings.database_url, exc) or str(exc))
        raise
    service = open_service_parts(settings, keys, engine)
    ledger, ingestor = service.ledger, service.ingestor
    origin = ledger.tlog.origin_problem()
    if origin is not None:  # a log keeps its origin: refuse rather than sign as another log
        engine.dispose()
        report_start_failure(origin)
        raise KeyRefused(origin)
    loaded = policy_store(ledger).ensure_defaults()
    if loaded:
        log.info("loaded %d default policies into an empty database", len(loaded))
    worker = JobWorker(settings, keys)  # the population jobs and the figures out of this process
    app.state.caches.refresh_in(worker)
    key = uuid.uuid4().hex
    RUNTIMES[key] = Runtime.configured(
        ledger, ingestor, clock, settings, metrics=app.state.metrics, worker=worker
    )
    app.state.ledger = ledger
    app.state.ingestor = ingestor
    app.state.metrics.registry.register(ingestor.health)
    app.state.metrics.follow(partial(_recorded_verification, app.state.caches, engine))
    app.state.runtime_key = key
    committer = GroupCommitter(ingestor, clock)
    committer.start()
    app.state.committer = committer
    scheduler = None
    if settings.scheduler:
        scheduler = start_scheduler(
            key,
            {
                "flush-inbox": settings.flush_seconds,
                "aggregate": settings.aggregate_seconds,
                "checkpoint": settings.checkpoint_seconds,
                "dashboard": settings.dashboard_seconds,
                "verify": settings.verify_seconds,
            },
            settings.scheduled_jobs,
        )
    elif "scheduled_jobs" in settings.model_fields_set:
        log.warning("DPGOV_SCHEDULED_JOBS has no effect: DPGOV_SCHEDULER is false here")
    app.state.scheduler = scheduler
    # Everything loaded so far (framework, ORM, numpy) lives as long as the process: keep it
    # out of the cyclic collector's full passes, which otherwise rescan it every few
    # batches and cost a quarter of the relay path.
    gc.freeze()
    try:
        yield
    finally:
        await committer.stop()
        if scheduler is not None:
            scheduler.shutdown(wait=True)
        worker.close()
        RUNTIMES.pop(key, None)
        engine.dispose()
