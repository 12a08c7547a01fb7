"""``dpgov db``: create the service's database and keys."""

from __future__ import annotations

import typer
from sqlalchemy import make_url

from api.cli.common import Access, DatabaseOption, load_settings, open_service

app = typer.Typer(help="Create the service's database and keys.", no_args_is_help=True)


@app.command("init")
def db_init(database_url: DatabaseOption = None) -> None:
    """Create the database, its tables, Apple's default policies and its keys (if new).

    On an existing database: record the fingerprints of the keys in use if it has none yet,
    else check the keys against them. Idempotent.
    """
    settings = load_settings(database_url)
    ledger, keys = open_service(settings, Access.CREATE)
    ledger.engine.dispose()
    shown = make_url(settings.database_url).render_as_string(hide_password=True)
    typer.echo(
        f"{shown}: ready; device-key secret from {keys.sources[0]}, audit key from"
        f" {keys.sources[1]}; their fingerprints are recorded in the database"
    )
