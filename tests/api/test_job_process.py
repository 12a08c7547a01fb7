"""A service's population jobs run in a spawned child process at a lower CPU priority.

The child's niceness, process id and clock are read in the child by the job itself (a job
swapped in for the real one, passed to the child by reference); the real ``dashboard`` and
``verify`` run there too and store what the pages show. Nothing here is timed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from dp_governor.api import _job_process
from dp_governor.api._job_process import JobProcessError
from dp_governor.api._keys import ServiceKeys
from dp_governor.api._snapshots import FIGURES, VERIFICATION, read_snapshot
from dp_governor.api.app import create_app
from dp_governor.api.cli import app as cli
from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import (
    CHILD_JOBS,
    JOBS,
    RUNTIMES,
    JobProcess,
    Runtime,
    lease_of,
    run_job,
    run_scheduled,
)
from dp_governor.api.leases import LeaseLost, acquire_lease
from dp_governor.api.metrics import Metrics
from dp_governor.api.settings import Settings
from dp_governor.budget import FixedClock, Ledger
from dp_governor.budget.storage.db import write_step
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.seal import InboxSeal
from tests.live import app_settings

SECRET = b"child-secret-child-secret-child-secret!"
AUDIT = b"child-audit-key-child-audit-key-child!!"
SHUFFLER = b"child-shuffler-child-shuffler-child-shuf"
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
NICE = 7
KEY = "child"


def _where(rt: Runtime) -> dict[str, Any]:
    """A job that says which process ran it, at what niceness, and what its clock read."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    return {"pid": os.getpid(), "nice": nice, "now": rt.clock.now().isoformat()}


def _fails(rt: Runtime) -> dict[str, Any]:
    raise ValueError("`limit` must be positive, got -1")


def _loses_its_lease(rt: Runtime) -> dict[str, Any]:
    """Another holder takes the lease over; the job's next write is refused by its fence."""
    acquire_lease(rt.ledger.engine, lease_of("purge"), "another process", 60, force=True)
    with write_step(rt.ledger.engine) as conn:
        conn.execute(text("SELECT 1"))
    return {"written": True}


@pytest.fixture
def service(engine: Engine) -> Iterator[Metrics]:
    """A service's runtime over a database (SQLite file or PostgreSQL), with a job process."""
    init_service_db(engine)
    ledger = Ledger(engine, SECRET, audit_key=AUDIT)
    ledger.policies.ensure_defaults()
    url = engine.url.render_as_string(hide_password=False)
    settings = Settings(database_url=url, job_nice=NICE)
    keys = ServiceKeys(SECRET, AUDIT, ("test", "test"), (SHUFFLER,))
    metrics = Metrics(wall=lambda: 1_700_000_000.0)
    RUNTIMES[KEY] = Runtime(
        ledger,
        Ingestor(ledger, SECRET, seal=InboxSeal([SHUFFLER])),
        FixedClock(NOW),
        metrics=metrics,
        process=JobProcess(settings, keys),
    )
    yield metrics
    RUNTIMES.pop(KEY, None)


def _runs(metrics: Metrics, job: str, outcome: str) -> float | None:
    return metrics.registry.get_sample_value(
        "dpgov_job_runs_total", {"job": job, "outcome": outcome}
    )


@pytest.mark.parametrize("name", sorted(CHILD_JOBS))
def test_a_scheduled_population_job_runs_in_a_child_at_the_set_niceness(
    service: Metrics, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(JOBS, name, (_where, JOBS[name][1]))
    result = run_scheduled(name, KEY, 60.0, 0.0)
    assert result is not None
    assert result["pid"] != os.getpid()
    assert result["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    assert result["now"] == NOW.isoformat()  # the parent's clock when it started the run
    assert _runs(service, name, "done") == 1  # counted by the parent, as in-process runs are


def test_the_other_jobs_run_in_the_servers_process(
    service: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in set(JOBS) - CHILD_JOBS:
        monkeypatch.setitem(JOBS, name, (_where, JOBS[name][1]))
        result = run_job(name, KEY)
        assert result is not None and result["pid"] == os.getpid(), name


def test_the_dashboard_and_verify_store_what_the_pages_show_from_the_child(
    service: Metrics,
) -> None:
    engine = RUNTIMES[KEY].ledger.engine
    done = run_job("dashboard", KEY)
    assert done is not None and done["computed_at"] == NOW.isoformat()
    figures = read_snapshot(engine, FIGURES)
    assert figures is not None and figures.computed_at == NOW.isoformat()  # type: ignore[union-attr]
    verdict = run_job("verify", KEY)
    assert verdict is not None and verdict["ok"] is True, verdict
    assert read_snapshot(engine, VERIFICATION) is not None
    assert _runs(service, "dashboard", "done") == _runs(service, "verify", "done") == 1


def test_a_failure_in_the_child_is_the_jobs_failure_in_one_line(
    service: Metrics, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(JOBS, "purge", (_fails, JOBS["purge"][1]))
    with caplog.at_level(logging.INFO, logger="dpgov.jobs"):
        with pytest.raises(JobProcessError, match="ValueError: `limit` must be positive"):
            run_job("purge", KEY)
    (line,) = [r for r in caplog.records if r.name == "dpgov.jobs"]
    assert getattr(line, "fields", {})["outcome"] == "failed"
    assert getattr(line, "fields", {})["error"] == "ValueError"  # the child's exception
    assert _runs(service, "purge", "failed") == 1
    monkeypatch.setitem(JOBS, "purge", (_where, JOBS["purge"][1]))
    assert run_job("purge", KEY) is not None  # its lease was released


def test_a_lease_lost_in_the_child_stops_the_job(
    service: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(JOBS, "purge", (_loses_its_lease, JOBS["purge"][1]))
    with pytest.raises(LeaseLost, match="lost its lease 'purge:run'"):
        run_job("purge", KEY)
    assert _runs(service, "purge", "lease_lost") == 1


def test_dpgov_jobs_run_lowers_its_priority_for_the_population_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(app_settings(tmp_path, "child-admin-token-child-admin-token"))):
        pass  # the database and its key files
    env = {
        "DPGOV_DATABASE_URL": f"sqlite:///{tmp_path / 'service.sqlite'}",
        "DPGOV_SECRET_FILE": str(tmp_path / "secret"),
        "DPGOV_AUDIT_KEY_FILE": str(tmp_path / "audit.key"),
        "DPGOV_SHUFFLER_KEY_FILE": str(tmp_path / "shuffler.key"),
        "DPGOV_JOB_NICE": str(NICE),
    }
    lowered: list[int] = []
    monkeypatch.setattr(_job_process, "lower_priority", lowered.append)  # not this test's own
    for name in ("checkpoint", "dashboard"):
        run = CliRunner().invoke(cli, ["jobs", "run", name], env=env)
        assert run.exit_code == 0, run.output
    assert lowered == [NICE]  # for the dashboard, not for the checkpoint
