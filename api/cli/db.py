"""``dpgov db``: create the service's database and keys; upgrade its schema; say where it stands."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from dp_governor.api.cli.common import (
    Access,
    DatabaseOption,
    existing_database,
    load_settings,
    open_service,
    refuse,
)

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from dp_governor.api._device_secret import DeviceAdoption
    from dp_governor.api._schema_status import SchemaStatus
    from dp_governor.api.settings import Settings

app = typer.Typer(
    help="Create the service's database and keys; upgrade its schema.", no_args_is_help=True
)


@app.command("init")
def db_init(database_url: DatabaseOption = None) -> None:
    """Create the database, its tables, Apple's default policies and its keys (if new).

    On an existing database: record the fingerprints of the keys in use if it has none yet,
    else check the keys against them; upgrade its schema (as ``dpgov db upgrade``). Idempotent.
    """
    from sqlalchemy import make_url

    settings = load_settings(database_url)
    ledger, keys = open_service(settings, Access.CREATE, upgrade=True)
    ledger.close()
    shown = make_url(settings.database_url).render_as_string(hide_password=True)
    typer.echo(
        f"{shown}: ready; device-key secret from {keys.sources[0]}, audit key from"
        f" {keys.sources[1]}, shuffler key from {keys.shuffler_source}; their fingerprints are"
        " recorded in the database"
    )


KnownDeviceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--known-device",
        help="A device id that has reported (repeatable): checks the device-key secret of a"
        " ledger that records no fingerprint yet before recording it.",
    ),
]
TrustOption = Annotated[
    bool,
    typer.Option(
        "--trust-device-secret",
        help="Record the device-key secret of a ledger that records no fingerprint yet"
        " unchecked (no device id is known): the operator vouches that it is the server's.",
    ),
]


@app.command("upgrade")
def db_upgrade(
    database_url: DatabaseOption = None,
    known_device: KnownDeviceOption = None,
    trust_device_secret: TrustOption = False,
) -> None:
    """Run the schema migrations this release needs (stop the service and back up first).

    One transaction under a lock: the database is wholly upgraded or untouched, and a second
    run finds nothing to do. A database that records its keys' fingerprints needs no key; one
    made before them gets them recorded from the keys of the server's settings (the audit key
    must tag its first entry, the device-key secret is checked with --known-device).
    docs/operations.md, "Upgrading".
    """
    from sqlalchemy import inspect

    from dp_governor.api._device_secret import DeviceAdoption
    from dp_governor.api.database import database_problem, shown_url
    from dp_governor.budget import create_db_engine
    from dp_governor.budget.storage.schema import head_revision, upgrade_db

    settings = load_settings(database_url)
    shown = shown_url(settings.database_url)
    url = existing_database(settings.database_url)
    adoption = DeviceAdoption(tuple(known_device or ()), trust_device_secret)
    try:
        engine = create_db_engine(url)
    except ValueError as exc:
        refuse(database_problem(settings.database_url, exc) or str(exc))
    try:
        if not inspect(engine).has_table("audit_log"):
            refuse(f"{shown} holds no ledger: run `dpgov db init`")
        found = upgrade_db(engine)
        recorded = _record_fingerprints(settings, engine, adoption)
    except typer.Exit:
        raise
    except Exception as exc:
        problem = database_problem(settings.database_url, exc)
        if problem is None:
            raise
        refuse(problem, 1)
    finally:
        engine.dispose()
    head = head_revision()
    before = f"revision {found}" if found else "the layout of a release before migrations"
    if found == head:
        typer.echo(f"{shown}: at revision {head}, nothing to do{recorded}")
    else:
        typer.echo(f"{shown}: upgraded from {before} to revision {head}{recorded}")


def _record_fingerprints(settings: Settings, engine: Engine, adoption: DeviceAdoption) -> str:
    """Record the fingerprints of a ledger made before them; what to add to the upgrade's line.

    Nothing is read for a database that records both (the upgrade needs no key); otherwise
    the keys are checked as a first start checks them, and a refusal exits 2 naming the setting.
    """
    from dp_governor.api._keys import service_keys
    from dp_governor.api.settings import KeyRefused
    from dp_governor.budget.storage.db import stored_fingerprints

    stored = stored_fingerprints(engine) or {}
    if {"fingerprint.device_key_secret", "fingerprint.audit_key"} <= stored.keys():
        return ""
    try:
        keys = service_keys(settings, engine, record=True, adopt=adoption)
    except KeyRefused as exc:
        if not _has_history(engine):  # nothing to lose: the first start generates and records
            return (
                "; no audit history, so the first `dpgov serve` or `dpgov db init` records its"
                " keys' fingerprints"
            )
        refuse(f"the schema is upgraded, but the keys' fingerprints are not recorded: {exc}")
    return (
        f"; key fingerprints recorded (device-key secret from {keys.sources[0]}, audit key from"
        f" {keys.sources[1]})"
    )


def _has_history(engine: Engine) -> bool:
    """Whether the audit log holds an entry (keys then exist that must be found, not made)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT 1 FROM audit_log LIMIT 1")).first() is not None


@app.command("current")
def db_current(database_url: DatabaseOption = None) -> None:
    """Say which schema revision the database is at and which key fingerprints it records.

    Only reads (works on a read-only connection). Exit 0 at this release's revision, 1 behind
    it (`dpgov db upgrade`), 2 for a database that holds no ledger.
    """
    from dp_governor.api._schema_status import schema_status

    shown, status = _read_status(database_url, schema_status)
    typer.echo(f"{shown}: {status.describe()}")
    if not status.ledger:
        raise typer.Exit(2)
    if not status.current:
        raise typer.Exit(1)


@app.command("history")
def db_history(database_url: DatabaseOption = None) -> None:
    """List this release's schema revisions, oldest first, marking those the database has.

    Only reads: the revisions come from the packaged migrations, the marks from the database.
    """
    from dp_governor.api._schema_status import migrations, schema_status

    shown, status = _read_status(database_url, schema_status)
    order = [m.revision for m in migrations()]
    at = order.index(status.revision) if status.revision in order else -1
    for i, migration in enumerate(migrations()):
        mark = "current" if i == at else "applied" if i < at else "to apply"
        typer.echo(f"{migration.revision}  {mark:<8}  {migration.summary}")
    typer.echo(f"{shown}: {status.describe()}")


def _read_status(
    database_url: str | None, read: Callable[[Engine], SchemaStatus]
) -> tuple[str, SchemaStatus]:
    """The database's status by reads alone; a database that cannot be used is one line (exit 1)."""
    from dp_governor.api.database import database_problem, shown_url
    from dp_governor.budget import create_db_engine

    settings = load_settings(database_url)
    shown = shown_url(settings.database_url)
    url = existing_database(settings.database_url)
    try:
        engine = create_db_engine(url, pool_size=1)
    except ValueError as exc:
        refuse(database_problem(settings.database_url, exc) or str(exc))
    try:
        return shown, read(engine)
    except Exception as exc:
        problem = database_problem(settings.database_url, exc)
        if problem is None:
            raise
        refuse(problem, 1)
    finally:
        engine.dispose()
