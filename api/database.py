"""The service's database: created or upgraded at start, and what an operator is told when it fails.

Kept apart from :mod:`dp_governor.api.app` so that the command line opens a database without
importing the web framework. The embedded SQLite default is upgraded at every start; PostgreSQL is
upgraded only by ``dpgov db upgrade`` (or ``db init``): ``serve`` creates a new PostgreSQL database
but refuses an out-of-date one (:class:`dp_governor.budget.storage.schema.SchemaOutdated`), so that
N workers never migrate a production database behind the operator's back.
"""

from __future__ import annotations

import os

from sqlalchemy import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

import dp_governor.pipeline.tables  # noqa: F401 - registers the pipeline tables on the models' metadata
from dp_governor.budget.storage.schema import SchemaOutdated, init_db

__all__ = ["SETTING", "create_private_sqlite_file", "database_problem", "init_service_db"]

SETTING = "DPGOV_DATABASE_URL (or --database-url)"


def init_service_db(engine: Engine, *, upgrade: bool | None = None) -> None:
    """Bring the ledger, policy and pipeline tables to this release (new SQLite file: mode 0600).

    ``upgrade`` defaults to the backend's rule: SQLite upgrades, PostgreSQL only creates a new
    database and raises :class:`SchemaOutdated` for an old one.
    """
    create_private_sqlite_file(engine)
    init_db(engine, upgrade=engine.dialect.name == "sqlite" if upgrade is None else upgrade)


def create_private_sqlite_file(engine: Engine) -> None:
    """Create a missing SQLite database file with mode 0600, like the secrets beside it.

    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode. An existing file,
    an in-memory database and PostgreSQL are left alone.
    """
    if engine.dialect.name != "sqlite":
        return
    path = engine.url.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def shown_url(url: str) -> str:
    """``url`` with its password hidden (or as given, when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return repr(url)


def database_problem(url: str, exc: BaseException) -> str | None:
    """One line for an operator: the setting, the database and the cause; ``None`` if not ours.

    Covers what a wrong or unreachable database URL raises (driver errors, a missing folder,
    an unsupported scheme) and a schema behind this release.
    """
    if isinstance(exc, SchemaOutdated):
        return f"{shown_url(url)}: {exc}"
    if isinstance(exc, DBAPIError):
        lines = str(exc.orig).strip().splitlines() if exc.orig is not None else []
        cause = " ".join(line.strip() for line in lines[:2]) or type(exc).__name__
    elif isinstance(exc, OSError):
        cause = f"{exc.strerror or type(exc).__name__}: {exc.filename or ''}".rstrip(": ")
    elif isinstance(exc, ArgumentError | ValueError):
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        return None
    return f"cannot use the database {shown_url(url)} set by {SETTING}: {cause}"
