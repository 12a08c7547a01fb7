"""``dpgov serve``: the HTTP service under uvicorn."""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Annotated

import typer

from dp_governor.api.cli.common import Access, DatabaseOption, load_settings, open_service, refuse

if TYPE_CHECKING:
    from dp_governor.api.settings import Settings


class LogFormatOption(enum.StrEnum):
    """The server's log line formats (:mod:`dp_governor.api.logs`)."""

    text = "text"
    json = "json"


# The settings `serve` can override on its command line: the workers read these as checked here.
SERVE_OPTIONS = ("host", "port", "database_url", "log_format")


def export_for_workers(settings: Settings) -> None:
    """Put the settings ``serve`` decided in the environment its workers build their own from.

    A worker (and uvicorn's app factory in this process) reads :class:`Settings` from the
    environment again: every command-line override and every key path, resolved, is exported
    so that it sees what was checked here, never an overridden variable's own value.
    """
    for name in SERVE_OPTIONS:
        os.environ[f"DPGOV_{name.upper()}"] = str(getattr(settings, name))
    os.environ["DPGOV_SECRET_FILE"] = str(settings.secret_path().resolve())
    os.environ["DPGOV_AUDIT_KEY_FILE"] = str(settings.audit_key_path().resolve())
    os.environ["DPGOV_SHUFFLER_KEY_FILE"] = str(settings.shuffler_key_path().resolve())


def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (DPGOV_HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (DPGOV_PORT).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 1,
    database_url: DatabaseOption = None,
    log_format: Annotated[
        LogFormatOption | None,
        typer.Option(
            "--log-format",
            help="Log lines as `text` or `json` (one object per line) (DPGOV_LOG_FORMAT).",
        ),
    ] = None,
) -> None:
    """Run the HTTP service; creates the database and its keys if new (docs/operations.md).

    SQLite is upgraded at start; PostgreSQL with a schema behind this release is refused
    (`dpgov db upgrade` first). A port already taken is refused before the banner (exit 1),
    and a worker that cannot start stops the server: exit 1, its reason.
    """
    import logging.config

    from dp_governor.api.logs import log_config, log_fields
    from dp_governor.api.server import PortInUse, bind_port, run_server, serve_options

    fmt = None if log_format is None else log_format.value
    settings = load_settings(database_url, host=host, port=port, log_format=fmt)
    # bound first and held: a taken port is one clear error before anything is created (no
    # database left behind in a folder that cannot serve), and nobody takes it meanwhile
    try:
        sock = bind_port(settings.host, settings.port)
    except PortInUse as exc:
        refuse(f"cannot serve: {exc.strerror} (--host, --port: DPGOV_HOST, DPGOV_PORT)", 1)
    # tables, defaults, keys: once, up front; PostgreSQL is created if new, never upgraded here
    ledger, keys = open_service(settings, Access.CREATE)  # a wrong setting: one line
    ledger.close()
    config = log_config(settings.log_format)
    logging.config.dictConfig(config)  # every line from here on in the chosen format
    export_for_workers(settings)
    url = f"http://{settings.host}:{settings.port}"
    sources = {
        "secret_source": str(keys.sources[0]),
        "audit_key_source": str(keys.sources[1]),
        "shuffler_key_source": str(keys.shuffler_source),
    }
    if settings.log_format == "json":  # the banner as log lines, like every other line
        log = logging.getLogger("dpgov.serve")
        log.info("keys loaded", extra=log_fields(**sources))
        log.info("dp-governor running on %s (docs at /docs)", url, extra=log_fields(url=url))
    else:
        typer.echo(
            f"device-key secret from {keys.sources[0]}, audit key from {keys.sources[1]},"
            f" shuffler key from {keys.shuffler_source}"
        )
        typer.echo(f"dp-governor on {url} (docs at /docs)")
    failure = run_server(
        "dp_governor.api.app:create_app",
        workers,
        sock=sock,
        host=settings.host,
        port=settings.port,
        log_level="info",
        log_config=config,
        access_log=False,  # access lines carry client addresses: never on the report path
        **serve_options(settings),  # read deadlines, keep-alive, header cap, concurrency limit
    )
    if failure is not None:
        refuse(f"the server stopped: a worker could not start: {failure}", 1)
