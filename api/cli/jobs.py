"""``dpgov jobs``: run a scheduled job now, or clear its lease."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dp_governor.api.cli.common import (
    Access,
    DatabaseOption,
    Progress,
    load_settings,
    open_ledger,
    open_service,
)

app = typer.Typer(help="Run scheduled jobs now.", no_args_is_help=True)

# The jobs' names, as :data:`dp_governor.api.jobs.JOBS` declares them (a test holds the two
# equal): a name is checked before the job modules, the settings or the database are loaded.
JOB_NAMES = ("flush-inbox", "aggregate", "purge", "checkpoint", "dashboard", "verify")
JOB_HELP = "flush-inbox, aggregate, purge, checkpoint, dashboard or verify."


def known_job(name: str) -> str:
    """``name`` if it is a job's; else exit 2 naming the jobs, before anything heavy loads."""
    if name not in JOB_NAMES:
        typer.echo(f"Error: unknown job {name!r}; jobs: {', '.join(JOB_NAMES)}", err=True)
        raise typer.Exit(2)
    return name


@app.command("run")
def jobs_run(
    name: Annotated[str, typer.Argument(help=JOB_HELP)],
    database_url: DatabaseOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Take the job's lease from whoever holds it (a crashed process)."
        ),
    ] = False,
) -> None:
    """Run one scheduled job against the configured database and print its result."""
    known_job(name)
    from dp_governor.api._handles import ledger_engine
    from dp_governor.api._job_database import as_job_sessions
    from dp_governor.api._job_process import lower_priority
    from dp_governor.api.jobs import (
        CHILD_JOBS,
        RUNTIMES,
        JobBusy,
        Runtime,
        lease_of,
        run_job,
    )
    from dp_governor.api.leases import LeaseLost, lease_holder
    from dp_governor.budget import SystemClock
    from dp_governor.pipeline.ingest import Ingestor
    from dp_governor.pipeline.seal import InboxSeal

    settings = load_settings(database_url)
    if name in CHILD_JOBS:  # as low a priority as the service's job worker (DPGOV_JOB_CPU)
        lower_priority(settings.job_cpu, settings.job_nice)
    ledger, keys = open_service(settings, Access.WRITE)
    if name in CHILD_JOBS and as_job_sessions(ledger_engine(ledger)):
        ledger_engine(ledger).dispose()  # the sessions opened so far predate the setting
    key = f"cli-{name}"
    progress = Progress(f"jobs run {name}", "reports")
    RUNTIMES[key] = Runtime.configured(
        ledger,
        Ingestor(ledger, keys.device_key_secret, seal=InboxSeal(keys.shuffler_keys)),
        SystemClock(),
        settings,
        progress=lambda step: progress.step(f"jobs run {name}: {step}"),
    )
    try:
        with progress:
            result = run_job(name, key, force=force)
        held = None if result is not None else lease_holder(ledger_engine(ledger), lease_of(name))
    except (JobBusy, LeaseLost) as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        RUNTIMES.pop(key, None)
        ledger.close()
    if result is None:
        by = "" if held is None else f" ({held[0]} holds its lease for {held[1]:.0f} s more)"
        typer.echo(
            f"Error: job {name!r} is running in another process{by}; if that process is gone,"
            f" `dpgov jobs run {name} --force` runs it now",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(json.dumps({"job": name, "result": result}))
    kept = result.get("kept")
    if isinstance(kept, dict) and kept.get("problem"):
        typer.echo(f"Error: {kept['problem']}", err=True)
        raise typer.Exit(1)


@app.command("release")
def jobs_release(
    name: Annotated[str, typer.Argument(help=JOB_HELP)],
    database_url: DatabaseOption = None,
) -> None:
    """Clear a job's lease whoever holds it, so the next run need not wait for it to expire."""
    known_job(name)
    from dp_governor.api._handles import ledger_engine
    from dp_governor.api.jobs import lease_of, release_job

    ledger = open_ledger(load_settings(database_url))
    try:
        released = release_job(ledger_engine(ledger), name)
    finally:
        ledger.close()
    typer.echo(json.dumps({"job": name, "lease": lease_of(name), "released": released}))
