"""Database fixtures: a fresh SQLite file, and a fresh PostgreSQL database when configured.

``DPGOV_TEST_DATABASE_URL`` names the PostgreSQL server; without it those cases are skipped.
Each test's database is a copy of one migrated once per test process (:class:`Templates`).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from hypothesis import settings
from sqlalchemy import Connection, Engine, make_url, text

from dp_governor.budget import Ledger, create_db_engine, init_db
from dp_governor.budget.storage.db import scratch_schema

# No example may fail for being slow: a busy machine is slow, not wrong.
settings.register_profile("dpgov", deadline=None)
settings.load_profile("dpgov")

SECRET = b"test-secret-test-secret-test-secret!"
SHUFFLER_KEY = b"test-shuffler-key-test-shuffler-key!"
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


class Templates:
    """Databases migrated once per test process; each test's database starts as a copy of one.

    Running the migrations is most of the cost of a new database (a tenth of a second of CPU
    on SQLite, more on PostgreSQL): a copy, then :func:`init_db` (which finds the schema
    current and creates the days' partitions), gives the same database for far less.
    SQLite: a file copied with SQLite's backup API. PostgreSQL: ``CREATE DATABASE ...
    TEMPLATE``, the template a database nobody connects to after its migration. PostgreSQL's
    copies are made one ahead and dropped in a thread of their own (each takes a tenth of a
    second or more, a drop forces a checkpoint), so a test waits for neither.
    """

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.postgres: str | None = None
        self._aside = ThreadPoolExecutor(1, thread_name_prefix="test-databases")
        self._next: Future[str] | None = None
        self._drops: list[Future[None]] = []

    def sqlite_copy(self, path: Path) -> None:
        """Write a migrated SQLite ledger at ``path``."""
        if self.folder is None:
            folder = Path(tempfile.mkdtemp(prefix="dpgov-template-"))
            engine = create_db_engine(f"sqlite:///{folder / 'ledger.sqlite'}")
            init_db(engine)
            engine.dispose()
            self.folder = folder
        with (
            closing(sqlite3.connect(self.folder / "ledger.sqlite")) as source,
            closing(sqlite3.connect(path)) as copy,
        ):
            source.backup(copy)

    def postgres_copy(self) -> str:
        """A new PostgreSQL database holding a migrated ledger: its name (the next one begun)."""
        if self.postgres is None:
            name = self._create(None)
            engine = create_db_engine(_database_url(name), pool_size=1)
            init_db(engine)
            engine.dispose()
            self.postgres = name
        ready = self._next or self._aside.submit(self._create, self.postgres)
        self._next = self._aside.submit(self._create, self.postgres)
        return ready.result()

    def drop(self, name: str) -> None:
        """Drop the PostgreSQL database ``name`` in the background (its sessions ended)."""
        self._drops.append(self._aside.submit(self._drop, name))

    def close(self) -> None:
        """Remove the templates and the spare copy; wait for the drops (raise if one failed)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        try:
            if self._next is not None and self._next.exception() is None:
                self.drop(self._next.result())
            if self.postgres is not None:
                self.drop(self.postgres)
        finally:
            self._aside.shutdown(wait=True)
        failed = [str(d.exception()) for d in [self._next, *self._drops] if d and d.exception()]
        if failed:
            raise RuntimeError("a test database copy or drop failed: " + "; ".join(failed))

    @staticmethod
    def _drop(name: str) -> None:
        with _admin() as conn:
            conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))

    @staticmethod
    def _create(template: str | None) -> str:
        name = f"dpgov_test_{uuid.uuid4().hex[:12]}"
        with _admin() as conn:
            source = f" TEMPLATE {template}" if template else ""
            conn.execute(text(f"CREATE DATABASE {name}{source}"))
        return name


def _database_url(name: str) -> str:
    """``DPGOV_TEST_DATABASE_URL`` with database ``name`` instead of its own."""
    assert PG_URL is not None
    return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


@contextmanager
def _admin() -> Iterator[Connection]:
    """An autocommit connection to the configured PostgreSQL database (for CREATE DATABASE)."""
    assert PG_URL is not None
    engine = create_db_engine(PG_URL, pool_size=1)
    try:
        with engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")
    finally:
        engine.dispose()


TEMPLATES = Templates()


@pytest.fixture(autouse=True, scope="session")
def _templates() -> Iterator[None]:
    """Remove this process's template databases at the end of the session."""
    yield
    TEMPLATES.close()


def make_engine(backend: str, tmp_path: Path) -> Iterator[Engine]:
    """A fresh, initialised database of the given backend; dropped afterwards."""
    if backend == "sqlite":
        path = tmp_path / "ledger.sqlite"
        TEMPLATES.sqlite_copy(path)
        # No pause between a job's write steps (they leave SQLite's lock to the requests of a
        # live server; tests/budget/storage/test_storage.py tests it): correctness does not
        # depend on it, and in-process jobs here would spend a third of their time asleep.
        engine = create_db_engine(f"sqlite:///{path}", job_pause=0)
        init_db(engine)
        yield engine
        engine.dispose()
        return
    name = TEMPLATES.postgres_copy()
    try:
        engine = create_db_engine(_database_url(name), pool_size=20)
        init_db(engine)
        try:
            yield engine
        finally:
            engine.dispose()
    finally:
        TEMPLATES.drop(name)


@pytest.fixture(autouse=True, scope="session")
def _bodies_without_family() -> Iterator[None]:
    """Accept report bodies without ``family``, as a fleet built before the field is accepted.

    The suites' literal bodies predate the field; what they test does not depend on it. The
    default (required) and its refusals are tested by ``tests/api/test_report_family.py``,
    the README's tour, the client, the demo and the JavaScript device, each with it unset.
    """
    old = os.environ.get("DPGOV_REQUIRE_REPORT_FAMILY")
    os.environ["DPGOV_REQUIRE_REPORT_FAMILY"] = "false"
    yield
    if old is None:
        del os.environ["DPGOV_REQUIRE_REPORT_FAMILY"]
    else:
        os.environ["DPGOV_REQUIRE_REPORT_FAMILY"] = old


@pytest.fixture(autouse=True, scope="session")
def _figures_waited_for() -> Iterator[None]:
    """Public requests wait for the audit figures however slow a busy machine computes them.

    The production default (2 s) answers 503 sooner; that answer is tested by
    ``tests/api/test_figures_pending.py`` with its own setting. Servers the tests start as
    subprocesses inherit it.
    """
    old = os.environ.get("DPGOV_FIGURES_WAIT_SECONDS")
    os.environ["DPGOV_FIGURES_WAIT_SECONDS"] = "600"
    yield
    if old is None:
        del os.environ["DPGOV_FIGURES_WAIT_SECONDS"]
    else:
        os.environ["DPGOV_FIGURES_WAIT_SECONDS"] = old


@pytest.fixture(autouse=True, scope="session")
def _private_secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Key files a test does not place itself go to a scratch folder, never the user's own."""
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    yield from make_engine(request.param, tmp_path)


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database's URL: a new SQLite file, or a new PostgreSQL schema (then dropped)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite'}"
        return
    assert PG_URL is not None
    with scratch_schema(PG_URL, "e") as url:
        yield url


@pytest.fixture
def ledger(engine: Engine) -> Ledger:
    led = Ledger(engine, SECRET)
    led.policies.ensure_defaults()
    return led


@pytest.fixture(scope="module")
def small_batches() -> Iterator[None]:
    """Apple's default policies without their batch minimums (``min_batch_devices`` 1).

    For tests of the pipeline's mechanics with a few devices in-process, which would otherwise
    wait for the 1,000 to 200,000 distinct devices the defaults require before a batch
    publishes (policies/defaults.py); the defaults' own minimums are tested in
    tests/policies/test_defaults.py.
    """
    import dp_governor.policies.defaults as defaults

    with pytest.MonkeyPatch.context() as patch:  # module scope: module-scoped servers see it
        patch.setattr(
            defaults,
            "DEFAULT_POLICIES",
            tuple({**p, "min_batch_devices": 1} for p in defaults.DEFAULT_POLICIES),
        )
        yield
