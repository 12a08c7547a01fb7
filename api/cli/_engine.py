"""``--engine dask [--scheduler ADDR]``: where ``audit report``'s parts run.

The parts (a summary brought forward, a key range read) run in local processes by default;
on Dask they run on the workers of a client from
:func:`dp_governor.pipeline.distributed.dask_executor`, each opening the ledger itself (the
SQLite file by its path, PostgreSQL by its URL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from dp_governor.api.cli.aggregate import AggregateEngine
from dp_governor.api.cli.common import refuse

if TYPE_CHECKING:
    from concurrent.futures import Executor

__all__ = ["EngineOption", "SchedulerOption", "check_engine", "parts_executor"]

EngineOption = Annotated[
    AggregateEngine,
    typer.Option(
        help="Where --partitions' or --shard's parts run: local processes, or a Dask cluster"
        " (--scheduler, else a LocalCluster of --workers)."
    ),
]
SchedulerOption = Annotated[
    str | None,
    typer.Option(help="With --engine dask: the scheduler's address (default: a LocalCluster)."),
]


def check_engine(engine: AggregateEngine, scheduler: str | None, parts: bool) -> None:
    """Refuse (one line, exit 2) ``--scheduler`` without Dask, or Dask with no parts to run."""
    if scheduler is not None and engine is not AggregateEngine.dask:
        refuse("--scheduler needs --engine dask")
    if engine is AggregateEngine.dask and not parts:
        refuse("--engine dask needs --partitions (more than 1) or --shard")


@contextlib.contextmanager
def parts_executor(
    engine: AggregateEngine, scheduler: str | None, workers: int
) -> Iterator[Executor | None]:
    """The Dask executor the parts run on (``None``: local processes); a refusal is one line.

    Without the ``scale`` extra, or with a scheduler that cannot be reached: exit 2.
    """
    if engine is not AggregateEngine.dask:
        yield None
        return
    from dp_governor.pipeline.distributed import DaskOptions, dask_executor

    stack = contextlib.ExitStack()
    try:
        executor = stack.enter_context(
            dask_executor(DaskOptions(scheduler=scheduler, workers=workers))
        )
    except ImportError as exc:
        refuse(
            f"--engine dask needs the `scale` extra ({exc.name} is not installed):"
            " pip install 'dp-governor[scale]'"
        )
    except (OSError, ValueError) as exc:  # unreachable, or not an address Dask can parse
        refuse(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({exc})")
    with stack:
        yield executor
