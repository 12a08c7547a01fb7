"""``dpgov serve``: the HTTP service under uvicorn."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from api.cli.common import Access, DatabaseOption, load_settings, open_service


def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (DPGOV_HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (DPGOV_PORT).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 1,
    database_url: DatabaseOption = None,
) -> None:
    """Run the HTTP service; creates the database and its keys if new (docs/operations.md)."""
    import uvicorn

    from api.server import serve_options

    settings = load_settings(database_url, host=host, port=port)
    ledger, keys = open_service(settings, Access.CREATE)  # tables, defaults, keys: once, up front
    ledger.engine.dispose()
    os.environ["DPGOV_DATABASE_URL"] = settings.database_url  # the workers read the same
    os.environ["DPGOV_SECRET_FILE"] = str(settings.secret_path().resolve())
    os.environ["DPGOV_AUDIT_KEY_FILE"] = str(settings.audit_key_path().resolve())
    typer.echo(f"device-key secret from {keys.sources[0]}, audit key from {keys.sources[1]}")
    typer.echo(f"dp-governor on http://{settings.host}:{settings.port} (docs at /docs)")
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_level="info",
        access_log=False,  # access lines carry client addresses: never on the report path
        **serve_options(settings),  # read deadlines, keep-alive, header cap, concurrency limit
    )
