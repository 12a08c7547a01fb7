"""The day-partitioned charges table: routing, late partitions, and purges that drop days."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.storage.partitions import (
    DAYS_AHEAD,
    ensure_partitions,
    is_partitioned,
    partition_days,
)
from dp_governor.policies import PolicyBase, PolicyCreate
from tests.conftest import PG_URL, SECRET, make_engine

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)
D = utc_day(NOW)
pg_only = pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Engine]:
    yield from make_engine("postgresql", tmp_path)


def _rows(engine: Engine, sql: str) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


@pg_only
def test_a_new_postgresql_ledger_is_partitioned_by_day_ahead_of_time(pg: Engine) -> None:
    today = int(datetime.now(UTC).timestamp() // 86_400)
    with pg.connect() as conn:
        assert is_partitioned(conn)
        assert partition_days(conn) == list(range(today - 1, today + DAYS_AHEAD + 1))
    # the gate's charge lands in its day's partition; a day without one in the default
    ledger = Ledger(pg, SECRET)
    ledger.policies.ensure_defaults()
    now = datetime.now(UTC)
    assert ledger.charge("dev", "emoji", now=NOW - timedelta(days=400)).accepted  # date order
    assert ledger.charge("dev", "emoji", now=now).accepted
    assert _rows(pg, f"SELECT count(*) FROM charges_d{today}") == [(1,)]
    assert _rows(pg, "SELECT count(*) FROM charges_default") == [(1,)]
    # creating the late day's partition moves its rows out of the default
    assert ensure_partitions(pg, D - 400, D - 400) == [D - 400]
    assert _rows(pg, "SELECT count(*) FROM charges_default") == [(0,)]
    assert _rows(pg, f"SELECT count(*) FROM charges_d{D - 400}") == [(1,)]
    assert _rows(pg, "SELECT count(*) FROM charges") == [(2,)]
    assert ensure_partitions(pg, D - 400, D - 400) == []  # idempotent


def test_sqlite_is_not_partitioned(tmp_path: Path) -> None:
    engine = next(make_engine("sqlite", tmp_path))
    with engine.connect() as conn:
        assert not is_partitioned(conn)
    assert ensure_partitions(engine, 0, 10) == []


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pg_only)])
def test_purge_drops_whole_days_and_deletes_rows_where_windows_differ(
    backend: str, tmp_path: Path
) -> None:
    for engine in make_engine(backend, tmp_path):
        ledger = Ledger(engine, SECRET)
        ledger.policies.ensure_defaults()
        short = ledger.policies.get("emoji").model_dump(include=set(PolicyBase.model_fields))
        ledger.policies.create(PolicyCreate(**{**short, "name": "short", "retention_days": 30}))
        ensure_partitions(engine, D - 95, D - 85)
        offsets = [200, 95, 91, 90, 89, 85, 31, 30, 29, 0]  # 200: in the default partition
        for off in offsets:
            for n in range(3):
                for use_case in ("short", "lookup-hints"):
                    now = NOW - timedelta(days=off)
                    assert ledger.charge(f"dev-{n}", use_case, now=now).accepted
        result = ledger.purge(now=NOW)
        # lookup-hints (90 days) loses days <= D-90; short (30 days) days <= D-30
        lost_lookup = 3 * sum(off >= 90 for off in offsets)
        lost_short = 3 * sum(off >= 30 for off in offsets)
        assert result.charges == lost_lookup + lost_short
        kept = _rows(engine, "SELECT use_case, min(day) FROM charges GROUP BY use_case ORDER BY 1")
        assert kept == [("lookup-hints", D - 89), ("short", D - 29)]
        assert ledger.audit.verify().ok
        body = _rows(
            engine,
            "SELECT body FROM audit_log WHERE action = 'purge.ledger' ORDER BY seq DESC LIMIT 1",
        )
        if backend == "postgresql":
            with engine.connect() as conn:
                days = partition_days(conn)
            assert min(days) == D - 89  # D-95..D-90 were dropped
            assert "partitions_dropped" in str(body[0][0])
        assert ledger.purge(now=NOW).charges == 0
