"""The job worker's sessions run without PostgreSQL's parallel query workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from dp_governor.api._job_database import as_job_sessions
from tests.conftest import PG_URL


@pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
def test_every_session_of_the_engine_runs_its_queries_in_its_own_backend_alone() -> None:
    assert PG_URL is not None
    engine = create_engine(PG_URL, pool_size=2)
    try:
        assert as_job_sessions(engine)
        with engine.connect() as one, engine.connect() as two:  # two sessions, both set
            for conn in (one, two):
                setting = conn.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one()
                assert setting == "0"
                assert conn.execute(text("SHOW application_name")).scalar_one() == "dpgov-job"
                conn.rollback()
        with engine.connect() as again:  # a pooled session keeps it after a rollback
            assert again.execute(text("SHOW max_parallel_workers_per_gather")).scalar_one() == "0"
    finally:
        engine.dispose()


def test_sqlite_has_nothing_to_turn_off(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.sqlite'}")
    assert not as_job_sessions(engine)
    engine.dispose()
