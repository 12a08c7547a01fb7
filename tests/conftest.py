"""Database fixtures: a fresh SQLite file, and a fresh PostgreSQL schema when configured.

``DPGOV_TEST_DATABASE_URL`` names the PostgreSQL server; without it those cases are skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, make_url, text

from budget import Ledger, create_db_engine, init_db

SECRET = b"test-secret-test-secret-test-secret!"
PG_URL = os.environ.get("DPGOV_TEST_DATABASE_URL")
BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=pytest.mark.skipif(
            not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set (no PostgreSQL to test on)"
        ),
    ),
]


def make_engine(backend: str, tmp_path: Path) -> Iterator[Engine]:
    """A fresh, initialised database of the given backend; dropped afterwards."""
    if backend == "sqlite":
        engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        init_db(engine)
        yield engine
        engine.dispose()
        return
    assert PG_URL is not None
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_db_engine(PG_URL, pool_size=1)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    engine = create_db_engine(url.render_as_string(hide_password=False), pool_size=20)
    init_db(engine)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    yield from make_engine(request.param, tmp_path)


@pytest.fixture
def ledger(engine: Engine) -> Ledger:
    led = Ledger(engine, SECRET)
    led.policies.ensure_defaults()
    return led
