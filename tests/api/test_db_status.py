"""``dpgov db current`` and ``dpgov db history`` only read: no table, row or fingerprint written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import inspect, make_url, text
from typer.testing import CliRunner

from dp_governor.api._schema_status import migrations
from dp_governor.api.cli import app as cli
from dp_governor.budget import create_db_engine
from dp_governor.budget.storage.db import scratch_schema
from dp_governor.budget.storage.schema import head_revision
from tests.conftest import PG_URL

needs_pg = pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")


def _run(*args: str, url: str, keys: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, list(args), env={"DPGOV_DATABASE_URL": url, "DPGOV_SECRETS_DIR": str(keys)}
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def _sqlite_dump(path: Path) -> list[str]:
    """Every schema statement and row of the file, as SQL (the WAL included)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return list(conn.iterdump())


def _pg_dump(url: str) -> list[tuple[object, ...]]:
    """The schema's tables with their row counts and ``dpgov_meta``'s rows."""
    engine = create_db_engine(url, pool_size=1)
    try:
        tables = sorted(inspect(engine).get_table_names())
        with engine.connect() as conn:
            counts = [(t, conn.execute(text(f"SELECT count(*) FROM {t}")).scalar()) for t in tables]
            meta = list(conn.execute(text("SELECT * FROM dpgov_meta ORDER BY name")))
        return [*counts, *(tuple(r) for r in meta)]
    finally:
        engine.dispose()


def test_current_and_history_read_a_sqlite_ledger_and_write_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert _run("db", "init", url=url, keys=tmp_path / "keys")[0] == 0
    before = _sqlite_dump(tmp_path / "ledger.sqlite")
    code, out = _run("db", "current", url=url, keys=tmp_path / "keys")
    assert code == 0, out
    assert f"at revision {head_revision()}, this release's" in out
    assert "device_key_secret, audit_key, shuffler_key" in out
    code, out = _run("db", "history", url=url, keys=tmp_path / "keys")
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == len(migrations()) + 1
    assert lines[0].startswith("0001  applied") and lines[-2].startswith(
        f"{head_revision()}  current"
    )
    assert _sqlite_dump(tmp_path / "ledger.sqlite") == before


def test_current_says_a_ledger_is_behind_and_exits_1(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert _run("db", "init", url=url, keys=tmp_path / "keys")[0] == 0
    with sqlite3.connect(tmp_path / "ledger.sqlite") as conn:
        conn.execute("DROP TABLE alembic_version")  # as release 0.1 left it
        conn.execute("DELETE FROM dpgov_meta")  # and made before fingerprints
    before = _sqlite_dump(tmp_path / "ledger.sqlite")
    code, out = _run("db", "current", url=url, keys=tmp_path / "keys")
    assert code == 1
    assert "a release before migrations; this release needs revision" in out
    assert "run `dpgov db upgrade`" in out and "recorded: none" in out
    code, out = _run("db", "history", url=url, keys=tmp_path / "keys")
    assert code == 0 and all("to apply" in line for line in out.splitlines()[:-1])
    assert _sqlite_dump(tmp_path / "ledger.sqlite") == before


def test_a_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none.sqlite'}"
    for command in ("current", "history"):
        code, out = _run("db", command, url=url, keys=tmp_path / "keys")
        assert code == 2 and "no database at" in out
    assert list(tmp_path.iterdir()) == []


@needs_pg
def test_a_read_only_postgresql_connection_is_enough(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "dbstatus") as url:
        assert _run("db", "init", url=url, keys=tmp_path / "keys")[0] == 0
        before = _pg_dump(url)
        parsed = make_url(url)
        options = f"{parsed.query['options']} -cdefault_transaction_read_only=on"
        read_only = parsed.update_query_dict({"options": options}).render_as_string(
            hide_password=False
        )
        engine = create_db_engine(read_only, pool_size=1)
        with engine.connect() as conn:  # the connection does refuse writes
            assert conn.execute(text("SHOW default_transaction_read_only")).scalar() == "on"
        engine.dispose()
        for command in ("current", "history"):
            code, out = _run("db", command, url=read_only, keys=tmp_path / "keys")
            assert code == 0, out
            assert f"revision {head_revision()}, this release's" in out
        assert _pg_dump(url) == before


@needs_pg
def test_a_postgresql_database_without_the_tables_gets_a_clear_answer(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "dbempty") as url:
        code, out = _run("db", "current", url=url, keys=tmp_path / "keys")
        assert code == 2
        assert out.strip().endswith("holds no dp-governor ledger: `dpgov db init` creates one")
        code, out = _run("db", "history", url=url, keys=tmp_path / "keys")
        assert code == 0 and "holds no dp-governor ledger" in out.splitlines()[-1]
        engine = create_db_engine(url, pool_size=1)
        assert inspect(engine).get_table_names() == []  # nothing created
        engine.dispose()
    assert not (tmp_path / "keys").exists()  # no key generated
