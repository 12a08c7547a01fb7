"""``--engine dask [--scheduler ADDR]``: where ``audit report``'s parts run.

The parts (a key range read, a shard's full pass) run in local processes by default; on Dask
they run on the workers of a client from
:func:`dp_governor.pipeline.distributed.dask_executor`, each opening the ledger itself (the
SQLite file by its path, PostgreSQL by its URL). The client connects (or its LocalCluster
starts) at the first part: a report brought forward from stored summaries starts none. A
refusal in a worker (its opener's: :func:`worker_opener`) comes back as :class:`Refused` and
is said here, one line, as the local engine says it.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.util
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Annotated, ParamSpec, TypeVar

import typer

from dp_governor.api.cli.common import Refused, finite, open_ledger, refusals_raised, refuse

if TYPE_CHECKING:
    from dp_governor.api.settings import Settings
    from dp_governor.budget.ledger import Ledger
    from dp_governor.pipeline.distributed import DaskOptions

__all__ = [
    "CONNECT_TIMEOUT",
    "AggregateEngine",
    "EngineOption",
    "SchedulerOption",
    "SchedulerTimeoutOption",
    "check_engine",
    "engine_named",
    "parts_executor",
    "worker_opener",
]


class AggregateEngine(enum.StrEnum):
    """Where ``dpgov aggregate`` folds the partitions, and ``audit report``'s parts run."""

    local = "local"
    dask = "dask"


CONNECT_TIMEOUT = 5.0  # seconds to wait for --scheduler, unless --scheduler-timeout
P = ParamSpec("P")
T = TypeVar("T")


def engine_named(text: str) -> AggregateEngine:
    """The engine ``text`` names; any other is one line naming the engines (exit 2).

    >>> engine_named("dask")
    <AggregateEngine.dask: 'dask'>
    """
    try:
        return AggregateEngine(text)
    except ValueError:
        names = ", ".join(e.value for e in AggregateEngine)
        refuse(f"--engine must be one of {names}, got {text!r}")


EngineOption = Annotated[
    AggregateEngine,
    typer.Option(
        parser=engine_named,
        metavar="[local|dask]",
        help="Where --partitions' or --shard's parts run: local processes, or a Dask cluster"
        " (--scheduler, else a LocalCluster of --workers, started when a part needs it).",
    ),
]
SchedulerOption = Annotated[
    str | None,
    typer.Option(help="With --engine dask: the scheduler's address (default: a LocalCluster)."),
]
SchedulerTimeoutOption = Annotated[
    float | None,
    typer.Option(
        parser=finite(0.0, 3600.0, open_low=True),
        help=f"Seconds to wait for --scheduler before giving up (default: {CONNECT_TIMEOUT:g}).",
    ),
]


def _open_in_worker(settings: Settings, own_origin: bool) -> Ledger:
    """:func:`open_ledger` in a worker; its refusal raised as :class:`Refused`, not printed."""
    with refusals_raised():
        return open_ledger(settings, own_origin=own_origin)


def worker_opener(settings: Settings, *, own_origin: bool = False) -> Callable[[], Ledger]:
    """The ledger of ``settings`` opened in a worker (it pickles); a refusal is :class:`Refused`."""
    return functools.partial(_open_in_worker, settings, own_origin)


def check_engine(
    engine: AggregateEngine, scheduler: str | None, timeout: float | None, parts: bool
) -> None:
    """Refuse (one line, exit 2) options that cannot hold together, or Dask not installed."""
    if scheduler is not None and engine is not AggregateEngine.dask:
        refuse("--scheduler needs --engine dask")
    if timeout is not None and scheduler is None:
        refuse("--scheduler-timeout needs --scheduler")
    if engine is AggregateEngine.dask and not parts:
        refuse("--engine dask needs --partitions (more than 1) or --shard")
    if engine is AggregateEngine.dask and importlib.util.find_spec("distributed") is None:
        refuse(
            "--engine dask needs the `scale` extra (distributed is not installed):"
            " pip install 'dp-governor[scale]'"
        )


@contextlib.contextmanager
def _connected(options: DaskOptions) -> Iterator[Executor]:
    """:func:`dask_executor` of ``options``; not reaching the scheduler is :class:`Refused`."""
    from dp_governor.pipeline.distributed import dask_executor

    stack = contextlib.ExitStack()
    try:
        executor = stack.enter_context(dask_executor(options))
    except OSError:
        raise Refused(
            f"--scheduler {options.scheduler}: cannot reach the Dask scheduler within"
            f" {options.connect_timeout:g} s (--scheduler-timeout)"
        ) from None
    except ValueError as exc:  # not an address Dask can parse
        raise Refused(
            f"--scheduler {options.scheduler}: not a Dask scheduler address ({exc})"
        ) from None
    with stack:
        yield executor


class _OnDemand(Executor):
    """A Dask client's executor, connected (its LocalCluster started) at the first task."""

    def __init__(self, options: DaskOptions, stack: contextlib.ExitStack) -> None:
        self._options, self._stack = options, stack
        self._executor: Executor | None = None

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``fn(*args, **kwargs)`` on a worker (the client connected first, if not yet)."""
        if self._executor is None:
            self._executor = self._stack.enter_context(_connected(self._options))
        return self._executor.submit(fn, *args, **kwargs)


@contextlib.contextmanager
def parts_executor(
    engine: AggregateEngine, scheduler: str | None, timeout: float | None, workers: int
) -> Iterator[Executor | None]:
    """The Dask executor the parts run on (``None``: local processes), connected on demand.

    A :class:`Refused` raised in the body (a worker's refusal, a scheduler out of reach) is
    said as one line, with its exit code.
    """
    try:
        if engine is not AggregateEngine.dask:
            yield None
            return
        from dp_governor.pipeline.distributed import DaskOptions

        options = DaskOptions(
            scheduler=scheduler, workers=workers, connect_timeout=timeout or CONNECT_TIMEOUT
        )
        with contextlib.ExitStack() as stack:
            yield _OnDemand(options, stack)
    except Refused as exc:
        refuse(exc.message, exc.code)
