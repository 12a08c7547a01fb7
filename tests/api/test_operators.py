"""What an operator sees: one line for a database that cannot be used, schema upgrades, warnings.

Every command runs as a real ``dpgov`` process (``python -m dp_governor.api.cli``), as an operator's
shell runs it; PostgreSQL cases run when ``DPGOV_TEST_DATABASE_URL`` is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from dp_governor.api.server import free_port
from dp_governor.budget import create_db_engine, init_db
from dp_governor.budget.storage.db import scratch_schema
from tests.live import serve, server_env

PG_URL = os.environ.get("DPGOV_TEST_DATABASE_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="DPGOV_TEST_DATABASE_URL is not set")
UNREACHABLE = "postgresql+psycopg://dpgov@127.0.0.1:1/ledger"


def dpgov(folder: Path, *args: str, **settings: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``dpgov args`` in ``folder`` with :func:`server_env`'s settings."""
    return subprocess.run(
        [sys.executable, "-m", "dp_governor.api.cli", *args],
        env=server_env(folder, **settings),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["serve"],
        ["db", "init"],
        ["db", "upgrade"],
        ["policies", "list"],
        ["budget", "device-1"],
        ["jobs", "run", "purge"],
        ["audit", "verify"],
    ],
)
def test_an_unreachable_database_is_one_line_naming_the_setting(
    tmp_path: Path, args: list[str]
) -> None:
    port = ["--port", str(free_port())] if args == ["serve"] else []  # 8000 may be in use
    run = dpgov(tmp_path, *args, *port, database_url=UNREACHABLE)
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "DPGOV_DATABASE_URL (or --database-url)" in lines[0]
    assert "127.0.0.1" in lines[0] and "refused" in lines[0].lower()


def test_a_sqlite_file_in_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nowhere' / 'ledger.sqlite'}"
    for args in (["db", "init"], ["serve", "--port", str(free_port())]):
        run = dpgov(tmp_path, *args, database_url=url)
        assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "DPGOV_DATABASE_URL" in run.stderr and "No such file or directory" in run.stderr


def test_db_upgrade_brings_a_ledger_from_before_migrations_to_this_release(tmp_path: Path) -> None:
    assert dpgov(tmp_path, "db", "init").returncode == 0
    engine = create_db_engine(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))  # as release 0.1 left it
    engine.dispose()
    first = dpgov(tmp_path, "db", "upgrade")
    assert first.returncode == 0, first.stderr
    assert "upgraded from the layout of a release before migrations" in first.stdout
    again = dpgov(tmp_path, "db", "upgrade")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "ledger.sqlite").touch()
    run = dpgov(empty, "db", "upgrade")
    assert run.returncode == 2 and "dpgov db init" in run.stderr


@needs_pg
def test_serve_on_postgresql_refuses_an_old_schema_until_db_upgrade(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "oldschema") as url:
        engine = create_db_engine(url)
        init_db(engine)
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE alembic_version"))  # as release 0.1 left it
        engine.dispose()
        run = dpgov(tmp_path, "serve", "--port", str(free_port()), database_url=url)
        assert run.returncode == 1, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "run `dpgov db upgrade`" in lines[0], run.stderr
        assert dpgov(tmp_path, "db", "upgrade", database_url=url).returncode == 0
        with serve(tmp_path, database_url=url) as served:
            assert httpx.get(served.base + "/healthz").status_code == 200


def test_the_server_says_how_to_set_a_missing_admin_token(tmp_path: Path) -> None:
    with serve(tmp_path, admin_token=None) as served:
        deadline = time.monotonic() + 60
        while "DPGOV_ADMIN_TOKEN" not in served.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = served.log.read_text()
    assert "no admin token is set: every admin route refuses" in log
    assert "DPGOV_ADMIN_TOKEN to at least 32 characters" in log


@pytest.mark.parametrize("args", [["--help"], ["policies", "list"], ["budget", "device-1"]])
def test_help_and_read_commands_import_no_heavy_package(tmp_path: Path, args: list[str]) -> None:
    """What a command imports is deterministic: the packages only other commands need stay out."""
    assert dpgov(tmp_path, "db", "init").returncode == 0
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dp_governor.api.cli", *args],
        env=server_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in run.stderr.splitlines()}
    heavy = {"fastapi", "uvicorn", "scipy", "dp_accounting", "pandas", "pyarrow", "dask"}
    assert not imported & heavy, sorted(imported & heavy)
    if args == ["--help"]:
        assert not imported & {"sqlalchemy", "sqlmodel", "numpy", "budget"}


@needs_pg
def test_a_writing_command_on_postgresql_refuses_an_old_schema(tmp_path: Path) -> None:
    assert PG_URL is not None
    with scratch_schema(PG_URL, "oldwrite") as url:
        assert dpgov(tmp_path, "db", "init", database_url=url).returncode == 0
        engine = create_db_engine(url)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
        engine.dispose()
        run = dpgov(tmp_path, "jobs", "run", "purge", database_url=url)
        assert run.returncode == 1 and "revision 0001" in run.stderr, run.stderr
        assert "dpgov db upgrade" in run.stderr
        upgraded = dpgov(tmp_path, "db", "upgrade", database_url=url)
        assert "upgraded from revision 0001" in upgraded.stdout, upgraded.stderr
        assert dpgov(tmp_path, "jobs", "run", "purge", database_url=url).returncode == 0
