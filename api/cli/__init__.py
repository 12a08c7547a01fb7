"""The ``dpgov`` command line: one module per command group, put together here.

- :mod:`.serve`: the HTTP service. :mod:`.db`: create, upgrade, say where the schema stands.
- :mod:`.policies`: list, show, apply (with a review and a what-if), export.
- :mod:`.budget`: a device's remaining budget. :mod:`.audit`: verify, report, export, recompute.
- :mod:`.jobs`: run a scheduled job now or clear its lease. :mod:`.aggregate`: Parquet and Dask.
- :mod:`.witness`: follow a transparency log and cosign it. :mod:`.selftest`: audit randomizers.
- :mod:`.simulate` and :mod:`.demo`: a simulated fleet, alone or against a running service.
- :mod:`.common`: settings, opening the database, refusals and progress, shared by all.
"""

from __future__ import annotations

import typer

from dp_governor import __version__
from dp_governor.api.cli import (
    aggregate,
    audit,
    budget,
    db,
    demo,
    jobs,
    policies,
    selftest,
    serve,
    simulate,
    witness,
)
from dp_governor.api.cli._help import PlainHelpGroup
from dp_governor.api.cli.common import refuse_unknown_settings

__all__ = ["app", "main"]

app = typer.Typer(
    name="dpgov",
    help="dp-governor: privacy accounting and budget governance for local-DP telemetry.",
    no_args_is_help=True,
    add_completion=False,
    cls=PlainHelpGroup,  # every command's help as plain text
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    """Print the installed distribution's version (``pyproject.toml``'s, read from its metadata)."""
    if value:
        typer.echo(f"dpgov {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """dp-governor: privacy accounting and budget governance for local-DP telemetry."""
    refuse_unknown_settings()


app.command()(simulate.simulate)
app.command()(demo.demo)
app.command()(serve.serve)
app.add_typer(db.app, name="db")
app.add_typer(jobs.app, name="jobs")
app.add_typer(audit.app, name="audit")
app.command()(aggregate.aggregate)
app.add_typer(policies.app, name="policies")
app.command()(selftest.selftest)
app.command()(budget.budget)
app.add_typer(witness.app, name="witness")


def main() -> None:
    """Entry point of the ``dpgov`` console script."""
    app()
