"""Scheduled jobs: leases make N processes run a job once per interval, never concurrently."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text

from api.database import init_service_db
from api.ingestion.ingest import Ingestor
from api.jobs import (
    JOBS,
    RUNTIMES,
    Runtime,
    _heartbeat,
    acquire_lease,
    lease_holder,
    lease_of,
    release_job,
    release_lease,
    run_job,
)
from budget import FixedClock, Ledger

SECRET = b"jobs-secret-jobs-secret-jobs-secret!"


@pytest.fixture
def two_processes(engine: Engine) -> Iterator[list[str]]:
    """Two runtimes over one database (SQLite file or PostgreSQL schema), as two processes."""
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


def test_a_scheduled_job_runs_once_per_interval_across_processes(two_processes: list[str]) -> None:
    first = run_job("purge", two_processes[0], slot_seconds=3600)
    second = run_job("purge", two_processes[1], slot_seconds=3600)
    assert first is not None and second is None
    assert run_job("purge", two_processes[1]) is not None  # a manual run is not blocked


def test_a_running_job_is_not_started_twice(two_processes: list[str]) -> None:
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert acquire_lease(engine, lease_of("aggregate"), "someone-else", 60)
    assert run_job("aggregate", two_processes[0]) is None
    assert set(JOBS) == {"flush-inbox", "aggregate", "purge", "checkpoint"}


def test_everything_that_moves_the_inbox_shares_one_lease(two_processes: list[str]) -> None:
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert lease_of("flush-inbox") == lease_of("aggregate")
    assert acquire_lease(engine, lease_of("aggregate"), "someone-else", 3600)
    assert run_job("flush-inbox", two_processes[0]) is None
    assert run_job("aggregate", two_processes[1]) is None
    assert run_job("checkpoint", two_processes[0]) is not None  # other leases are free


def test_a_scheduled_run_waits_for_the_shared_lease(two_processes: list[str]) -> None:
    """A flush and an aggregate due in the same second run one after the other."""
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert acquire_lease(engine, lease_of("flush-inbox"), "a-flush", 3600)
    results: list[dict[str, Any] | None] = []
    waiter = threading.Thread(
        target=lambda: results.append(run_job("aggregate", two_processes[0], 270.0, 600.0))
    )
    waiter.start()
    assert release_lease(engine, lease_of("flush-inbox"), "a-flush")
    waiter.join(timeout=600)
    assert results and results[0] is not None


def test_a_crashed_scheduled_run_does_not_hold_back_the_next_one(two_processes: list[str]) -> None:
    """A process killed mid-run took no interval slot: another's run goes ahead on expiry."""
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert acquire_lease(engine, lease_of("aggregate"), "crashed-host:9:dead", 1.0)
    assert run_job("aggregate", two_processes[1], 270.0, 600.0) is not None  # after 1 s
    assert run_job("aggregate", two_processes[0], 270.0) is None  # its slot: once an interval


def test_the_operator_can_force_or_release_a_dead_holders_lease(
    two_processes: list[str],
) -> None:
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert acquire_lease(engine, lease_of("purge"), "crashed-host:123:abcd", 3600)
    assert run_job("purge", two_processes[0]) is None
    held = lease_holder(engine, lease_of("purge"))
    assert held is not None and held[0] == "crashed-host:123:abcd"
    assert run_job("purge", two_processes[0], force=True) is not None
    assert lease_holder(engine, lease_of("purge")) is None  # the forced run released it after

    assert acquire_lease(engine, lease_of("aggregate"), "crashed-host:123:abcd", 3600)
    assert release_job(engine, "flush-inbox")  # one lease for both jobs that move the inbox
    assert not release_job(engine, "flush-inbox")  # nothing left to release
    assert run_job("aggregate", two_processes[1]) is not None
    with pytest.raises(KeyError):
        release_job(engine, "nope")


def test_a_heartbeat_renews_the_lease_while_its_job_runs(two_processes: list[str]) -> None:
    engine = RUNTIMES[two_processes[0]].ledger.engine
    assert acquire_lease(engine, "probe:run", "me", 0.3)
    first = _until(engine, "probe:run")
    with _heartbeat(engine, "probe:run", "me", 0.3):
        deadline = time.monotonic() + 120
        while _until(engine, "probe:run") <= first:  # waits for a renewal, not for a duration
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)


def _until(engine: Engine, job: str) -> float:
    with engine.connect() as conn:
        query = text("SELECT until FROM job_leases WHERE job = :j")
        return float(conn.execute(query, {"j": job}).scalar_one())


def test_unknown_job() -> None:
    with pytest.raises(KeyError):
        run_job("nope", "none")
