"""A stalled job holder: bounded lock waits for the next one, and no write after a takeover.

Two holders of one job over one database (SQLite file or PostgreSQL schema), as two
processes. The first is "hung": its thread is held between two of its transactions (or, on
PostgreSQL, inside one) by an event hook, deterministically. Its lease expires, the second
takes it over and finishes the work; when the first resumes, its next transaction finds the
lease under a newer token and the job stops with ``LeaseLost``, having written nothing after
the takeover. Each job transaction waits for locks at most ``job_lock_seconds``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, event, text

from dp_governor.api.database import init_service_db
from dp_governor.api.jobs import RUNTIMES, JobBusy, Runtime, lease_of, run_job
from dp_governor.api.leases import LeaseLost, acquire_lease
from dp_governor.budget import Decision, FixedClock, Ledger, create_db_engine
from dp_governor.budget.storage.db import WRITE_OPTION, write_step, writer
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for
from tests.conftest import PG_URL

SECRET = b"fence-secret-fence-secret-fence-secret"
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
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
REPORTS = 500
STEP = 100
WAIT = 120.0  # seconds a hook waits for the test to go on: generous, never reached when it works


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one() or 0)


@pytest.fixture
def holders(engine: Engine) -> Iterator[Ledger]:
    """Holders ``a`` and ``b`` of the jobs over one database holding 500 queued reports."""
    init_service_db(engine)
    ledger = Ledger(engine, SECRET)
    ledger.policies.create(TINY)
    ingestor = Ingestor(
        ledger, SECRET, seal=InboxSeal([b"shuffler-key-for-tests-shuffler-key-for-tests"])
    )
    bodies = mechanism_for(TINY).privatize(["a"] * REPORTS, rng=np.random.default_rng(5))
    requests = [SubmitRequest("tiny", f"dev-{i}", b) for i, b in enumerate(bodies.to_dicts())]
    assert all(isinstance(r, Decision) for r in ingestor.submit_group(requests, now=NOW))
    for name in ("a", "b"):  # leases long enough that no heartbeat beats during the test
        RUNTIMES[name] = Runtime(
            ledger, ingestor, FixedClock(NOW), STEP, min_batch=1, lease_seconds=3600
        )
    yield ledger
    for name in ("a", "b"):
        RUNTIMES.pop(name, None)


class Stall:
    """Holds one thread at its ``nth`` write connection (between transactions) until released.

    Counts the statements that thread sends after the release that write anything but its
    lease (giving it back is not the job's work).
    """

    def __init__(self, engine: Engine, nth: int) -> None:
        self.engine = engine
        self.nth = nth
        self.thread: threading.Thread | None = None
        self.writes = 0
        self.stalled = threading.Event()
        self.resume = threading.Event()
        self.writes_after = 0
        event.listen(engine, "engine_connect", self._connect)
        event.listen(engine, "before_cursor_execute", self._statement)

    def _mine(self) -> bool:
        return threading.current_thread() is self.thread

    def _connect(self, conn: Any) -> None:
        if self._mine() and conn.get_execution_options().get(WRITE_OPTION, False):
            self.writes += 1
            if self.writes == self.nth:
                self.stalled.set()
                assert self.resume.wait(WAIT)

    def _statement(self, _conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        words = sql.lstrip().upper()
        wrote = words.startswith(("INSERT", "UPDATE", "DELETE")) and "JOB_LEASES" not in words
        if self._mine() and self.resume.is_set() and wrote:
            self.writes_after += 1

    def remove(self) -> None:
        event.remove(self.engine, "engine_connect", self._connect)
        event.remove(self.engine, "before_cursor_execute", self._statement)


def _in_thread(job: str, key: str, outcome: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            outcome.append(run_job(job, key))
        except Exception as exc:  # what the test inspects
            outcome.append(exc)

    return threading.Thread(target=run, name=f"holder-{key}")


def test_a_holder_resuming_after_a_takeover_writes_nothing_more(
    holders: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    engine = holders.engine
    # a's write connections: its lease, its claim, the first 100 reports, then it stalls
    stall = Stall(engine, nth=4)
    outcome: list[Any] = []
    first = _in_thread("flush-inbox", "a", outcome)
    stall.thread = first
    try:
        with caplog.at_level(logging.INFO, logger="dpgov"):
            first.start()
            assert stall.stalled.wait(WAIT), "the first holder never reached its stall"
            assert _count(engine, "SELECT COUNT(*) FROM reports") == STEP
            with engine.begin() as conn:  # its lease expires while it is stalled
                conn.execute(text("UPDATE job_leases SET until = 0 WHERE job = 'inbox:run'"))
            taken = run_job("flush-inbox", "b")  # takes the lease over, finishes the batch
            assert taken == {"moved": REPORTS - STEP, "waiting": 0}
            stall.resume.set()
            first.join(WAIT)
        assert not first.is_alive()
    finally:
        stall.resume.set()
        stall.remove()
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost), outcome
    assert outcome[0].job == "flush-inbox" and "lost its lease" in str(outcome[0])
    assert stall.writes_after == 0  # not one write of the stalled holder after it
    assert _count(engine, "SELECT COUNT(*) FROM reports") == REPORTS
    assert _count(engine, "SELECT COUNT(*) FROM shuffled_batches") == 1
    assert _count(engine, "SELECT COUNT(*) FROM inbox") == 0
    lost = [r for r in caplog.records if getattr(r, "fields", {}).get("outcome") == "lease_lost"]
    assert len(lost) == 1 and lost[0].exc_info is None
    assert run_job("aggregate", "a")["folded"] == REPORTS  # type: ignore[index]


def test_a_forced_takeover_fences_the_holder_it_took_the_lease_from(holders: Ledger) -> None:
    """``dpgov jobs run NAME --force`` raises the token too: the old holder stops."""
    engine = holders.engine
    stall = Stall(engine, nth=4)
    outcome: list[Any] = []
    first = _in_thread("flush-inbox", "a", outcome)
    stall.thread = first
    try:
        first.start()
        assert stall.stalled.wait(WAIT)
        assert run_job("flush-inbox", "b", force=True) == {"moved": REPORTS - STEP, "waiting": 0}
        stall.resume.set()
        first.join(WAIT)
    finally:
        stall.resume.set()
        stall.remove()
    assert isinstance(outcome[0], LeaseLost) and stall.writes_after == 0


def test_the_token_rises_at_each_takeover_and_stays_at_each_renewal(engine: Engine) -> None:
    init_service_db(engine)
    assert acquire_lease(engine, "x:run", "p1", 60) == 1
    assert acquire_lease(engine, "x:run", "p1", 60) == 1  # renewed by its holder
    assert acquire_lease(engine, "x:run", "p2", 60) is None  # held
    assert acquire_lease(engine, "x:run", "p2", 60, force=True) == 2
    with engine.begin() as conn:
        conn.execute(text("UPDATE job_leases SET until = 0"))
    assert acquire_lease(engine, "x:run", "p1", 60) == 3  # expired: taken over


def test_a_jobs_transactions_wait_for_locks_at_most_its_bound(tmp_path: Path) -> None:
    """SQLite: the busy timeout of a job's transaction is the job's bound, others keep theirs."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'bound.sqlite'}", job_lock_seconds=0.5)
    try:
        init_service_db(engine)
        for _ in range(2):  # and back again on the same pooled connection
            with write_step(engine) as conn:
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 500
            with writer(engine).begin() as conn:
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        engine.dispose()


pg_only = pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")


@pg_only
def test_on_postgresql_a_jobs_transaction_sets_its_lock_and_idle_bounds(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    bounded = create_db_engine(_url(engine), job_lock_seconds=0.5)
    try:
        with write_step(bounded) as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "500ms"
            idle = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
            assert idle == "500ms"
        with bounded.begin() as conn:  # SET LOCAL: the request path keeps the server's
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "0"
    finally:
        bounded.dispose()


@pg_only
def test_a_holder_stalled_inside_a_transaction_delays_the_next_one_at_most_the_bound(
    holders: Ledger,
) -> None:
    """PostgreSQL: row locks held by a stalled transaction stop the next holder as busy.

    The stalled holder is a session that locked the inbox's rows and never commits (a
    process stopped inside its transaction). The next holder's move waits ``lock_timeout``
    and stops as busy (it waited 150 s for the stalled process before); once the session is
    gone, it finishes.
    """
    engine = holders.engine
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    bounded = create_db_engine(_url(engine), job_lock_seconds=0.5)
    rt = RUNTIMES["b"]
    ledger = Ledger(bounded, SECRET)
    RUNTIMES["bounded"] = Runtime(ledger, rt.ingestor, rt.clock, STEP, min_batch=1)
    stalled = engine.connect()
    stalled.begin()
    stalled.execute(text("SELECT id FROM inbox FOR UPDATE"))
    safety = threading.Timer(60, stalled.invalidate)  # a hang without the bound ends anyway
    safety.start()
    try:
        with pytest.raises(JobBusy, match="lock timeout"):
            run_job("flush-inbox", "bounded")
    finally:
        safety.cancel()
        stalled.rollback()
        stalled.close()
    try:
        assert run_job("flush-inbox", "bounded") == {"moved": REPORTS, "waiting": 0}
    finally:
        RUNTIMES.pop("bounded", None)
        bounded.dispose()


@pg_only
def test_a_holder_stalled_inside_its_transaction_loses_its_session_and_its_lease(
    holders: Ledger,
) -> None:
    """PostgreSQL: the idle bound ends the stalled session, so the takeover goes through."""
    engine = holders.engine
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL only")
    bounded = create_db_engine(_url(engine), job_lock_seconds=0.5)
    rt = RUNTIMES["b"]
    RUNTIMES["stalls"] = Runtime(
        Ledger(bounded, SECRET), rt.ingestor, rt.clock, STEP, min_batch=1, lease_seconds=3600
    )
    stalled = threading.Event()
    resume = threading.Event()
    outcome: list[Any] = []
    first = _in_thread("flush-inbox", "stalls", outcome)

    def inside(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if threading.current_thread() is first and sql.startswith("DELETE FROM inbox"):
            stalled.set()
            assert resume.wait(WAIT)

    event.listen(bounded, "after_cursor_execute", inside)
    try:
        first.start()
        assert stalled.wait(WAIT)
        with engine.begin() as conn:  # waits until the server ends the stalled session
            conn.execute(text("UPDATE job_leases SET until = 0 WHERE job = 'inbox:run'"))
        assert run_job("flush-inbox", "b") == {
            "moved": REPORTS,
            "waiting": 0,
        }  # its chunk was rolled back
        resume.set()
        first.join(WAIT)
    finally:
        resume.set()
        event.remove(bounded, "after_cursor_execute", inside)
        RUNTIMES.pop("stalls", None)
        bounded.dispose()
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLost), outcome
    assert _count(engine, "SELECT COUNT(*) FROM reports") == REPORTS
    assert _count(engine, "SELECT COUNT(*) FROM shuffled_batches") == 1
    assert lease_of("flush-inbox") == "inbox:run"
