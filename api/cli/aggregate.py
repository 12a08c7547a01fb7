"""``dpgov aggregate``: stored reports to Parquet, folded locally or on Dask."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from dp_governor.api.cli._engine import AggregateEngine, engine_named
from dp_governor.api.cli.common import (
    DatabaseOption,
    Progress,
    load_settings,
    open_ledger,
    path_option,
    refuse,
)


def _day_number(value: datetime | None, default: int) -> int:
    from dp_governor.budget import utc_day

    return utc_day(value.replace(tzinfo=UTC)) if value is not None else default


def aggregate(
    use_case: Annotated[str, typer.Argument(help="The use case whose reports to aggregate.")],
    start: Annotated[
        datetime | None,
        typer.Option("--from", formats=["%Y-%m-%d"], help="First UTC day (default: window start)."),
    ] = None,
    end: Annotated[
        datetime | None,
        typer.Option("--to", formats=["%Y-%m-%d"], help="Last UTC day (default: today)."),
    ] = None,
    out: Annotated[Path, path_option("--out", "-o", help="Parquet dataset directory.")] = Path(
        "dpgov-parquet"
    ),
    engine: Annotated[
        AggregateEngine,
        typer.Option(
            parser=engine_named,
            metavar="[local|dask]",
            help="local: this process; dask: a Dask cluster.",
        ),
    ] = AggregateEngine.local,
    scheduler: Annotated[
        str | None,
        typer.Option(help="Dask scheduler address (default: start a LocalCluster)."),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, max=256, help="LocalCluster workers.")] = 2,
    rows_per_file: Annotated[
        int, typer.Option(min=1, help="Reports per Parquet file (bounds a task's memory).")
    ] = 1_000_000,
    export: Annotated[
        bool, typer.Option(help="Export the report store first (--no-export: reuse --out).")
    ] = True,
    sketch_file: Annotated[
        Path | None, path_option("--sketch", help="Write the merged sketch here (.npz).")
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Export stored reports to Parquet and aggregate them into one sketch (local or Dask).

    Needs the ``scale`` extra (pyarrow, dask): ``pip install 'dp-governor[scale]'``.
    """
    from dp_governor.api._handles import ledger_engine, policy_store

    try:
        from dp_governor.pipeline.distributed import DaskOptions, aggregate_files
        from dp_governor.pipeline.parquet import dataset_files, export_reports

        if engine is AggregateEngine.dask:
            import dask.distributed  # noqa: F401 - the engine's own package, checked up front
    except ImportError as exc:
        refuse(
            f"`dpgov aggregate` needs the `scale` extra ({exc.name} is not installed):"
            " pip install 'dp-governor[scale]'"
        )
    from dp_governor.budget import SystemClock, UnknownUseCase, utc_day
    from dp_governor.pipeline.codec import sketch_digest, sketch_to_bytes
    from dp_governor.pipeline.fold import mechanisms_by_params
    from dp_governor.policies import mechanism_for

    if scheduler is not None and engine is not AggregateEngine.dask:
        typer.echo("Error: --scheduler needs --engine dask", err=True)
        raise typer.Exit(2)
    ledger = open_ledger(load_settings(database_url))
    try:
        try:
            policy = policy_store(ledger).get(use_case)
        except UnknownUseCase:
            refuse(f"unknown use case {use_case!r} (`dpgov policies list` names them)")
        today = utc_day(SystemClock().now())
        first = _day_number(start, today - policy.retention_days + 1)
        last = _day_number(end, today)
        if first > last:
            typer.echo("Error: --from must not be after --to", err=True)
            raise typer.Exit(2)
        mechanism = mechanism_for(policy)
        params = mechanism.fingerprint.params
        t0 = time.perf_counter()
        exported = None
        if export:
            try:
                with Progress(f"aggregate {use_case}: export", "reports") as progress:
                    exported = export_reports(
                        ledger_engine(ledger),
                        out,
                        use_case,
                        first,
                        last,
                        mechanisms_by_params(ledger, use_case),
                        rows_per_file=rows_per_file,
                        progress=progress,
                    )
            except OSError as exc:
                typer.echo(f"Error: cannot write {out}: {exc.strerror}", err=True)
                raise typer.Exit(1) from None
    finally:
        ledger.close()
    t1 = time.perf_counter()
    files = dataset_files(out, use_case, range(first, last + 1), params)
    try:
        with Progress(f"aggregate {use_case}: fold", "files") as progress:
            sketch = aggregate_files(
                mechanism,
                files,
                engine=engine.value,
                dask=DaskOptions(scheduler=scheduler, workers=workers),
                progress=progress,
            )
    except (OSError, ValueError) as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None
    t2 = time.perf_counter()
    if sketch_file is not None:
        sketch_file.write_bytes(sketch_to_bytes(sketch, narrow=False))  # widths to compute in
    other = sorted({p for (_, p) in exported.partitions if p != params} if exported else set())
    summary = {
        "use_case": use_case,
        "days": [first, last],
        "params": params,
        "engine": engine.value,
        "exported": exported.rows if exported else None,
        "files": len(files),
        "reports": sketch.n,
        "sketch_sha256": sketch_digest(sketch),
        "sketch_file": str(sketch_file) if sketch_file else None,
        "other_params_skipped": other,
        "seconds": {"export": round(t1 - t0, 3), "aggregate": round(t2 - t1, 3)},
    }
    typer.echo(json.dumps(summary, indent=2))
