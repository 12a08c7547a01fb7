"""Scheduled jobs: leases make N processes run a job once per interval, never concurrently."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from api.app import init_service_db
from api.ingest import Ingestor
from api.jobs import JOBS, RUNTIMES, Runtime, acquire_lease, run_job
from budget import FixedClock, Ledger, create_db_engine

SECRET = b"jobs-secret-jobs-secret-jobs-secret!"


@pytest.fixture
def two_processes(tmp_path: Path) -> Iterator[list[str]]:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'jobs.sqlite'}")
    init_service_db(engine)
    keys = []
    for name in ("p1", "p2"):
        ledger = Ledger(engine, SECRET)
        ledger.policies.ensure_defaults()
        RUNTIMES[name] = Runtime(
            ledger, Ingestor(ledger, SECRET), FixedClock(datetime(2026, 11, 22, tzinfo=UTC))
        )
        keys.append(name)
    yield keys
    for k in keys:
        RUNTIMES.pop(k, None)
    engine.dispose()


def test_a_scheduled_job_runs_once_per_interval_across_processes(two_processes: list[str]) -> None:
    first = run_job("purge", two_processes[0], slot_seconds=3600)
    second = run_job("purge", two_processes[1], slot_seconds=3600)
    assert first is not None and second is None
    assert run_job("purge", two_processes[1]) is not None  # a manual run is not blocked


def test_a_running_job_is_not_started_twice(two_processes: list[str]) -> None:
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert acquire_lease(engine, "aggregate:run", "someone-else", 60)
    assert run_job("aggregate", two_processes[0]) is None
    assert set(JOBS) == {"flush-inbox", "aggregate", "purge", "checkpoint"}


def test_unknown_job() -> None:
    with pytest.raises(KeyError):
        run_job("nope", "none")
