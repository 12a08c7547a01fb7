"""The service's database: the ledger's, policies' and pipeline's tables in one file or server."""

from __future__ import annotations

import os
from typing import Any

import api.ingestion.tables  # noqa: F401 - registers the pipeline tables
from budget import init_db

__all__ = ["create_private_sqlite_file", "init_service_db"]


def init_service_db(engine: Any) -> None:
    """Create the ledger, policy and pipeline tables (a new SQLite file readable by us alone)."""
    create_private_sqlite_file(engine)
    init_db(engine)


def create_private_sqlite_file(engine: Any) -> None:
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
