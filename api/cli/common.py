"""What the service commands share: settings, opening the database, refusing."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, NoReturn
from urllib.parse import quote

import typer
from pydantic import ValidationError
from sqlalchemy import inspect, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from api.database import init_service_db
from api.settings import NOT_INITIALISED, KeyRefused, ServiceKeys, Settings, service_keys
from budget import Ledger, create_db_engine

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="Overrides DPGOV_DATABASE_URL (default: sqlite:///dpgov.sqlite, in this folder).",
    ),
]


def load_settings(database_url: str | None, **overrides: object) -> Settings:
    """Settings from the environment with command-line overrides; exits 2 on invalid values."""
    try:
        values = {k: v for k, v in overrides.items() if v is not None}
        if database_url is not None:
            values["database_url"] = database_url
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "settings"
        typer.echo(f"Error: invalid setting `{field}`: {err['msg']}", err=True)
        raise typer.Exit(2) from None


class Access(enum.Enum):
    """What a command may do to the database it opens (and to the keys beside it)."""

    CREATE = "create"  # serve, db init: the database, its tables and defaults; keys if new
    WRITE = "write"  # jobs run, policies apply: an existing database; records missing fingerprints
    READ = "read"  # everything else: changes nothing, creates nothing


def refuse(message: str, code: int = 2) -> NoReturn:
    """Print one error line and exit (2: what the command was given is wrong)."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def existing_database(url: str) -> str:
    """``url``, refused unless its database exists; SQLite opened ``mode=rw`` (never created).

    A relative SQLite path is relative to the current folder: the message names the absolute
    path, so that an operator in the wrong folder sees where the command looked.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        refuse(f"`database_url` must be a sqlite:// or postgresql:// URL, got {url!r}")
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    if database in ("", ":memory:"):
        refuse(f"{url!r} is an in-memory database, which holds no ledger: set DPGOV_DATABASE_URL")
    if database.startswith("file:"):  # already a SQLite URI: the operator chose its mode
        return url
    path = Path(database).resolve()
    if not path.is_file():
        refuse(
            f"no database at {path}: set DPGOV_DATABASE_URL (or --database-url) to the"
            " service's database, or run `dpgov db init` to create one there"
        )
    query = {**parsed.query, "mode": "rw", "uri": "true"}
    return parsed.set(database=f"file:{quote(str(path))}", query=query).render_as_string(
        hide_password=False
    )


def open_service(settings: Settings, access: Access = Access.READ) -> tuple[Ledger, ServiceKeys]:
    """The ledger and its checked keys; refuses (exit 2) anything that is not the service's.

    Only :attr:`Access.CREATE` creates a database, tables or key files (key files only for a
    database with no history); every access checks the keys against the recorded fingerprints.
    """
    url = (
        settings.database_url
        if access is Access.CREATE
        else existing_database(settings.database_url)
    )
    try:
        engine = create_db_engine(url)
    except ValueError as exc:
        refuse(str(exc))
    try:
        if access is Access.WRITE and not inspect(engine).has_table("audit_log"):
            raise KeyRefused(NOT_INITIALISED)
        if access is not Access.READ:
            init_service_db(engine)
        keys = service_keys(
            settings, engine, generate=access is Access.CREATE, record=access is not Access.READ
        )
        ledger = Ledger(engine, keys.device_key_secret, audit_key=keys.audit_key)
        if access is Access.CREATE:
            ledger.policies.ensure_defaults()
    except KeyRefused as exc:
        engine.dispose()
        refuse(str(exc))
    except DBAPIError as exc:
        engine.dispose()
        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        refuse(f"cannot use the database {shown}: {reason}", 1)
    return ledger, keys


def open_ledger(settings: Settings, access: Access = Access.READ) -> Ledger:
    """The ledger of :func:`open_service`, for commands that need no key themselves."""
    return open_service(settings, access)[0]
