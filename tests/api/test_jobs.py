"""Scheduled jobs: leases make N processes run a job once per interval, never concurrently."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, event, text

from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import (
    JOBS,
    RUNTIMES,
    JobBusy,
    Runtime,
    lease_of,
    release_job,
    run_job,
    run_scheduled,
)
from dp_governor.api.leases import acquire_lease, heartbeat, lease_holder, release_lease
from dp_governor.api.metrics import Metrics
from dp_governor.budget import Decision, FixedClock, Ledger, create_db_engine
from dp_governor.budget.storage.db import WRITE_OPTION, writer
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for

SECRET = b"jobs-secret-jobs-secret-jobs-secret!"
SEAL = InboxSeal([b"jobs-shuffler-jobs-shuffler-jobs-shuffler"])
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


@pytest.fixture
def two_processes(engine: Engine) -> Iterator[list[str]]:
    """Two runtimes over one database (SQLite file or PostgreSQL schema), as two processes."""
    init_service_db(engine)
    keys = []
    for name in ("p1", "p2"):
        ledger = Ledger(engine, SECRET)
        ledger.policies.ensure_defaults()
        RUNTIMES[name] = Runtime(
            ledger,
            Ingestor(ledger, SECRET, seal=SEAL),
            FixedClock(datetime(2026, 11, 22, tzinfo=UTC)),
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
    assert set(JOBS) == {"flush-inbox", "aggregate", "purge", "checkpoint", "dashboard", "verify"}


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
    token = acquire_lease(engine, "probe:run", "me", 0.3)
    assert token is not None
    first = _until(engine, "probe:run")
    with heartbeat(engine, "probe:run", "me", 0.3, token):
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


TINY = PolicyCreate.model_validate(
    {
        "name": "tiny",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 5,
    }
)


def test_a_busy_database_stops_a_job_in_one_line_and_the_next_run_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that cannot get SQLite's write lock stops in one line; the next run resumes.

    Another process holds the lock from the job's fourth write on (its second chunk of the
    batch): the job stops with one log line and no traceback, the scheduled entry point
    returns, and once the lock is free the next run finishes the batch and folds it once.
    """
    url = f"sqlite:///{tmp_path / 'busy.sqlite'}"
    engine = create_db_engine(url, busy_seconds=0.2)
    other = create_db_engine(url)  # another process's connection
    init_service_db(engine)
    ledger = Ledger(engine, SECRET)
    ledger.policies.create(TINY)
    ingestor = Ingestor(ledger, SECRET, seal=SEAL)
    bodies = mechanism_for(TINY).privatize(["a"] * 300, rng=np.random.default_rng(3)).to_dicts()
    requests = [SubmitRequest("tiny", f"dev-{i}", b) for i, b in enumerate(bodies)]
    assert all(isinstance(r, Decision) for r in ingestor.submit_group(requests, now=NOW))
    metrics = Metrics(wall=lambda: 1_700_000_000.0)
    RUNTIMES["busy"] = Runtime(
        ledger, ingestor, FixedClock(NOW), shuffle_batch=100, min_batch=1, metrics=metrics
    )
    writes = 0
    held = writer(other).connect()

    def lock_from_the_fourth_write(conn: Any) -> None:
        nonlocal writes
        writes += conn.get_execution_options().get(WRITE_OPTION, False)
        if writes == 4 and not held.in_transaction():
            held.begin()  # BEGIN IMMEDIATE: the write lock, until released below

    event.listen(engine, "engine_connect", lock_from_the_fourth_write)
    try:
        with caplog.at_level(logging.INFO, logger="dpgov"):
            with pytest.raises(JobBusy, match="database is locked"):
                run_job("aggregate", "busy")
            assert run_scheduled("aggregate", "busy") is None  # the scheduler's entry point
        lines = [r for r in caplog.records if r.name == "dpgov.jobs"]
        assert len(lines) == 2 and all(r.levelno == logging.WARNING for r in lines), lines
        assert all(r.exc_info is None and "busy" in r.getMessage() for r in lines)
        assert all(getattr(r, "fields", {}).get("outcome") == "busy" for r in lines)
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT COUNT(*) FROM reports")).scalar_one()
        assert stored == 100  # the first chunk is kept
        held.rollback()
        event.remove(engine, "engine_connect", lock_from_the_fourth_write)
        sample = metrics.registry.get_sample_value
        job = {"job": "aggregate"}
        assert sample("dpgov_job_runs_total", {**job, "outcome": "busy"}) == 2
        assert sample("dpgov_job_failures_total", job) == 2
        assert sample("dpgov_job_last_success_timestamp_seconds", job) is None
        result = run_job("aggregate", "busy")
        assert result is not None and (result["moved"], result["folded"]) == (200, 300)
        assert sample("dpgov_job_runs_total", {**job, "outcome": "done"}) == 1
        # timed: the runs that started (the second busy one stopped taking its lease)
        assert sample("dpgov_job_duration_seconds_count", job) == 2
        assert sample("dpgov_job_last_success_timestamp_seconds", job) == 1_700_000_000.0
        with engine.connect() as conn:
            assert conn.execute(text("SELECT SUM(n) FROM sketches")).scalar_one() == 300
    finally:
        held.close()
        RUNTIMES.pop("busy", None)
        other.dispose()
        engine.dispose()


def test_the_log_is_signed_while_a_batch_holds_the_audit_head(empty_url: str) -> None:
    """The checkpoint job signs the transparency log before it waits for the audit head's lock.

    A batch of reports holds the head row while it commits; the log's step must not wait for
    it (the job then stops busy on the head's own signature, which the next run makes).
    """
    if not empty_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer: a held head lock blocks every write, the log's too")
    engine = create_db_engine(empty_url, job_lock_seconds=1.0)
    try:
        init_service_db(engine)
        ledger = Ledger(engine, SECRET)
        ledger.policies.ensure_defaults()
        for device in ("a", "b", "c"):
            ledger.charge(device, "emoji", now=NOW)
        RUNTIMES["held"] = Runtime(ledger, Ingestor(ledger, SECRET, seal=SEAL), FixedClock(NOW))
        head, _ = ledger.audit.head()
        with writer(engine).begin() as conn:  # a batch committing: it holds the head row
            conn.execute(text("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE"))
            with pytest.raises(JobBusy):
                run_job("checkpoint", "held")
            point = ledger.tlog.latest()
            assert point is not None and point.size == head
        assert ledger.audit.checkpoint(now=NOW) is not None  # the head's, once it is free
    finally:
        RUNTIMES.pop("held", None)
        engine.dispose()
