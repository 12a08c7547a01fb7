"""``dpgov db``: create the service's database and keys; upgrade its schema."""

from __future__ import annotations

import typer

from dp_governor.api.cli.common import (
    Access,
    DatabaseOption,
    existing_database,
    load_settings,
    open_service,
    refuse,
)

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


@app.command("upgrade")
def db_upgrade(database_url: DatabaseOption = None) -> None:
    """Run the schema migrations this release needs (stop the service and back up first).

    One transaction under a lock: the database is wholly upgraded or untouched, and a second
    run finds nothing to do. Needs no key. docs/operations.md, "Upgrading".
    """
    from sqlalchemy import inspect

    from dp_governor.api.database import database_problem, shown_url
    from dp_governor.budget import create_db_engine
    from dp_governor.budget.storage.schema import head_revision, upgrade_db

    settings = load_settings(database_url)
    shown = shown_url(settings.database_url)
    url = existing_database(settings.database_url)
    try:
        engine = create_db_engine(url)
    except ValueError as exc:
        refuse(database_problem(settings.database_url, exc) or str(exc))
    try:
        if not inspect(engine).has_table("audit_log"):
            refuse(f"{shown} holds no ledger: run `dpgov db init`")
        found = upgrade_db(engine)
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
        typer.echo(f"{shown}: at revision {head}, nothing to do")
    else:
        typer.echo(f"{shown}: upgraded from {before} to revision {head}")
