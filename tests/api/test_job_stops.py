"""Jobs stopped at any statement: nothing published early, nothing counted twice, runs resume.

Each job writes in short transactions. A job stopped inside one (here: a statement that
raises, as a process killed there leaves the database: that transaction rolls back, the ones
before it stay committed) leaves a state every reader handles: the service still verifies,
a half-moved batch is neither folded nor exported, and the next run of the job finishes the
work, each report stored, published and folded exactly once. On SQLite and, when configured,
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Engine, event, text

from dp_governor.api._integrity import verify_service
from dp_governor.api.database import init_service_db
from dp_governor.budget import Decision, Ledger, utc_day
from dp_governor.pipeline.flush import flush_inbox
from dp_governor.pipeline.fold import aggregate, mechanisms_by_params
from dp_governor.pipeline.ingest import Ingestor, SubmitRequest
from dp_governor.pipeline.parquet import export_reports
from dp_governor.pipeline.purge import purge
from dp_governor.pipeline.seal import InboxSeal
from dp_governor.policies import PolicyCreate, mechanism_for

SECRET = b"stop-secret-stop-secret-stop-secret!"
SEAL = InboxSeal([b"stop-shuffler-stop-shuffler-stop-shuffler"])
NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _policy(name: str, retention_days: int) -> PolicyCreate:
    return PolicyCreate.model_validate(
        {
            "name": name,
            "mechanism": "cms",
            "k": 16,
            "m": 64,
            "epsilon_per_report": 1.0,
            "max_reports_per_day": 5,
            "retention_days": retention_days,
        }
    )


class Stopped(BaseException):
    """The job's process ends here (not an error any job handles)."""


@contextmanager
def stopped_at(engine: Engine, statement: str, nth: int = 1) -> Iterator[None]:
    """The ``nth`` statement starting with ``statement`` raises :class:`Stopped` (and once only)."""
    seen = 0

    def stop(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        nonlocal seen
        if sql.lstrip().upper().startswith(statement.upper()):
            seen += 1
            if seen == nth:
                raise Stopped(statement)

    event.listen(engine, "before_cursor_execute", stop)
    try:
        with pytest.raises(Stopped):
            yield
    finally:
        event.remove(engine, "before_cursor_execute", stop)


@pytest.fixture
def ledger(engine: Engine) -> Ledger:
    init_service_db(engine)
    led = Ledger(engine, SECRET)
    led.policies.create(_policy("tiny", 30))
    led.policies.create(_policy("kept", 90))  # a longer window: no partition is dropped whole
    return led


def _submit(ledger: Ledger, n: int, first: int = 0) -> None:
    bodies = mechanism_for(_policy("tiny", 30)).privatize(
        [f"v{i % 7}" for i in range(n)], rng=np.random.default_rng(first)
    )
    requests = [
        SubmitRequest("tiny", f"dev-{first + i}", b) for i, b in enumerate(bodies.to_dicts())
    ]
    results = Ingestor(ledger, SECRET, seal=SEAL).submit_group(requests, now=NOW)
    assert all(isinstance(r, Decision) and r.accepted for r in results)


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one() or 0)


def _verifies(ledger: Ledger, now: datetime = NOW) -> None:
    verdict = verify_service(ledger, now=now, kept=[])
    assert verdict.ok, verdict.problem


@pytest.mark.parametrize(
    ("statement", "nth"),
    [
        ("INSERT INTO inbox_moves", 1),  # the claim
        ("UPDATE inbox_moves", 1),  # the first chunk, once it stored its reports
        ("DELETE FROM inbox", 3),  # the third chunk
        ("INSERT INTO shuffled_batches", 1),  # the last chunk, which publishes
    ],
)
def test_a_stopped_flush_publishes_nothing_and_the_next_one_completes_the_batch(
    ledger: Ledger, tmp_path: Path, statement: str, nth: int
) -> None:
    engine = ledger.engine
    _submit(ledger, 500)
    with stopped_at(engine, statement, nth):
        flush_inbox(engine, seal=SEAL, batch=100, min_batch=1, now=NOW, ledger=ledger)
    assert _count(engine, "SELECT COUNT(*) FROM inbox") + _count(
        engine, "SELECT COUNT(*) FROM reports"
    ) == _count(engine, "SELECT COUNT(*) FROM charges")
    for table in ("batch_parts", "shuffled_batches", "sketches"):
        assert _count(engine, f"SELECT COUNT(*) FROM {table}") == 0, table
    assert aggregate(ledger).reports == 0
    mechanisms = mechanisms_by_params(ledger, "tiny")
    day = utc_day(NOW)
    assert export_reports(engine, tmp_path, "tiny", day, day, mechanisms).rows == 0
    _verifies(ledger)

    claimed = _count(engine, "SELECT COUNT(*) FROM inbox_moves WHERE batch IS NOT NULL")
    _submit(ledger, 50, first=500)  # arriving meanwhile: after a claim, the next batch's
    flush_inbox(engine, seal=SEAL, batch=100, min_batch=1, now=NOW, ledger=ledger)
    assert flush_inbox(engine, seal=SEAL, batch=100, min_batch=1, now=NOW, ledger=ledger) == (
        50 if claimed else 0
    )
    with engine.connect() as conn:
        batches = conn.execute(text("SELECT reports, devices FROM shuffled_batches ORDER BY id"))
        # every report carries its device's pseudonym: each batch counts its devices
        assert [tuple(b) for b in batches] == ([(500, 500), (50, 50)] if claimed else [(550, 550)])
    assert _count(engine, "SELECT COUNT(*) FROM inbox_moves WHERE batch IS NOT NULL") == 0
    assert aggregate(ledger).reports == 550
    assert _count(engine, "SELECT SUM(n) FROM sketches") == 550
    assert _count(engine, "SELECT COUNT(*) FROM reports") == 550
    _verifies(ledger)


@pytest.mark.parametrize("statement", ["UPDATE batch_parts", "INSERT INTO sketches"])
def test_a_stopped_fold_writes_nothing_and_the_next_one_folds_once(
    ledger: Ledger, statement: str
) -> None:
    engine = ledger.engine
    _submit(ledger, 300)
    flush_inbox(engine, seal=SEAL, batch=100, min_batch=1, now=NOW, ledger=ledger)
    with stopped_at(engine, statement):
        aggregate(ledger)
    assert _count(engine, "SELECT COUNT(*) FROM sketches") == 0
    assert _count(engine, "SELECT COUNT(*) FROM batch_parts WHERE folded") == 0
    assert aggregate(ledger).reports == 300
    assert aggregate(ledger).reports == 0
    assert _count(engine, "SELECT SUM(n) FROM sketches") == 300


def test_a_stopped_purge_counts_each_deletion_once_and_the_next_one_finishes(
    ledger: Ledger,
) -> None:
    """Stopped after some of its deletes, the purge leaves nothing any reader counts."""
    engine = ledger.engine
    _submit(ledger, 300)
    flush_inbox(engine, seal=SEAL, batch=100, min_batch=1, now=NOW, ledger=ledger)
    aggregate(ledger)
    _submit(ledger, 40, first=300)  # still in the inbox
    later = NOW + timedelta(days=31)
    # SQLite deletes each page in one statement, so "kept" (nothing expired) sends one too
    second_page = 3 if engine.dialect.name == "sqlite" else 2
    with stopped_at(engine, "DELETE FROM charges", second_page):
        ledger.purge(now=later, rows=100)
    assert 0 < _count(engine, "SELECT COUNT(*) FROM charges") < 340
    _verifies(ledger, later)
    with stopped_at(engine, "DELETE FROM reports", 2):
        purge(ledger, now=later, rows=100)
    _verifies(ledger, later)
    result = purge(ledger, now=later, rows=100)
    assert (result["charges"], result["inbox"]) == (0, 0) and result["reports"] > 0
    for table in ("charges", "reports", "batch_parts", "sketches", "inbox"):
        assert _count(engine, f"SELECT COUNT(*) FROM {table}") == 0, table
    with engine.connect() as conn:
        entries = [
            orjson.loads(body)["data"]
            for (body,) in conn.execute(
                text("SELECT body FROM audit_log WHERE action = 'purge.ledger' ORDER BY seq")
            )
        ]
    assert sum(e["charges"] for e in entries) == 340  # each charge counted by the raise
    _verifies(ledger, later)
