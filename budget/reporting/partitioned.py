"""The effective-epsilon report's passes of one database or several, from their stored summaries.

Each database (the one ledger, or each shard of device keys: :mod:`.sharded`) keeps its own
stored summary (:mod:`.summary`). A worker process brings it forward
(:func:`~.summary.brought_forward`), at a cost in proportion to what changed since. Where a full
pass is due (no summary yet, a policy version added, a purge past the summary's windows, or
``full``) the accounts are split into key ranges of nearly equal size
(:meth:`Ledger.account_splits`), each scanned in a worker (:func:`~.summary.scan_range`) from one
start (:func:`~.summary.scan_start`); the ranges' summaries join into the one a single scan
gives (:func:`~.summary.joined`: the histograms add, the watermarks' ids unite), brought to one
snapshot and stored for the next report (:func:`~.summary.settled_full`). Either way the passes
equal those of one scan of the database, bit for bit.

A shard's read checks that the devices it reads route to it
(:class:`~dp_governor.budget.reporting.routing.RouteCheck`): a full pass every device it holds;
bringing a summary forward, the devices it read (those charged, and those whose charges left or
entered a window) and the smallest and largest key the shard holds (docs/scaling.md says what
only the full pass checks).
"""

from __future__ import annotations

import functools
import multiprocessing
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import ParamSpec, TypeVar

from dp_governor.budget.clock import utc_day
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.central import central_figures
from dp_governor.budget.reporting.loss import ACCOUNTS_CHUNK
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.report import ReportBasis, basis_of
from dp_governor.budget.reporting.routing import RouteCheck, key_ends
from dp_governor.budget.reporting.summary import (
    Summary,
    brought_forward,
    joined,
    scan_range,
    scan_start,
    settled_full,
)
from dp_governor.budget.rule.book import PolicyBook

__all__ = ["Passes", "Source", "partitioned_basis", "parts_pool", "summary_passes"]

Passes = tuple[PolicyBook, SpendPass, SpendPass]  # finished (window, lifetime), under the book
P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Source:
    """One database of the report: ``ledger`` opened here, ``open_ledger`` for a worker.

    ``open_ledger`` must pickle (a module-level function or a :func:`functools.partial` of
    one). With ``shards``, the database is the shard at its position among that many and
    every device read is checked to route there.
    """

    ledger: Ledger
    open_ledger: Callable[[], Ledger]
    shards: int | None = None


class _InProcess(Executor):
    """An executor that runs each task at once in this process: one worker needs no process."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``fn(*args, **kwargs)`` run now; its result (or exception) in a done future."""
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:  # the caller's result() raises it, as from a process
            future.set_exception(exc)
        return future


@contextmanager
def parts_pool(workers: int, given: Executor | None = None) -> Iterator[Executor]:
    """``given`` (the caller's: a Dask client's), else ``workers`` spawned processes, or this one.

    Spawned: no copy of the parent's connections. ``given`` is left open for its caller.
    """
    if given is not None:
        yield given
        return
    if workers == 1:
        yield _InProcess()
        return
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        yield pool


def _route(position: int, shards: int | None) -> RouteCheck | None:
    """The routing check of shard ``position`` of ``shards`` (``None``: not a shard)."""
    return None if shards is None else RouteCheck(position, shards)


def _forward(
    open_ledger: Callable[[], Ledger], now: datetime, position: int, shards: int | None
) -> tuple[Passes | None, RouteCheck | None]:
    """A worker: the database's stored summary brought forward (``None``: a full pass is due)."""
    route = _route(position, shards)
    ledger = open_ledger()
    try:
        read: set[str] = set()  # the devices that changed: each checked once, with the ends
        forward = brought_forward(ledger, now=now, seen=None if route is None else read.add)
        if forward is None:
            return None, None  # the full pass checks every device
        if route is not None:
            route.partial = True  # the changed devices and the key ends, not every device
            for key in sorted(read | set(key_ends(ledger.engine))):
                route.see(key)
        book, summary = forward
        return (book, summary.window, summary.lifetime), route
    finally:
        ledger.close()


def _scan(
    open_ledger: Callable[[], Ledger],
    start: tuple[PolicyBook, int],
    keys: tuple[str, str | None],
    position: int,
    shards: int | None,
    *,
    day: int,
    chunk: int,
) -> tuple[Summary, RouteCheck | None]:
    """A worker: the summary of the accounts with keys in ``keys`` (``(after, until]``)."""
    route = _route(position, shards)
    ledger = open_ledger()
    try:
        book, through = start
        after, until = keys
        seen = None if route is None else route.see
        summary = scan_range(
            ledger.engine, book, through, day=day, chunk=chunk, after=after, until=until, seen=seen
        )
        return summary, route
    finally:
        ledger.close()


def _key_bounds(ledger: Ledger, partitions: int) -> list[tuple[str, str | None]]:
    """``ledger``'s accounts in ``partitions`` ranges ``(after, until]`` (fewer if small)."""
    bounds = ["", *ledger.account_splits(partitions)]
    return [
        (after, bounds[i + 1] if i + 1 < len(bounds) else None) for i, after in enumerate(bounds)
    ]


@dataclass(slots=True)
class _Done:
    """Tells ``done`` ``(parts finished, parts in all)``; ``None`` while the whole is not known.

    The summaries brought forward come first: until each has, it is not known which databases
    need a full pass, nor in how many ranges, so no total is claimed that a range would exceed.
    """

    done: Callable[[int, int | None], None] | None
    finished: int = 0
    total: int | None = None

    def one(self) -> None:
        """One more part finished."""
        self.finished += 1
        self._tell()

    def known(self, total: int) -> None:
        """Every part is known: ``total`` in all."""
        self.total = total
        self._tell()

    def _tell(self) -> None:
        if self.done is not None:
            self.done(self.finished, self.total)


def _keep(routes: dict[int, RouteCheck], position: int, route: RouteCheck | None) -> None:
    """Add ``route``'s counts to those of its shard."""
    if route is not None:
        routes.setdefault(position, RouteCheck(route.position, route.shards)).merge(route)


def summary_passes(
    sources: Sequence[Source],
    *,
    now: datetime,
    partitions: int,
    workers: int,
    full: bool = False,
    chunk: int = ACCOUNTS_CHUNK,
    done: Callable[[int, int | None], None] | None = None,
    executor: Executor | None = None,
) -> list[Passes]:
    """Each source's report passes: its summary brought forward, else a full pass in ranges.

    The summaries are brought forward in up to ``workers`` threads of this process (each
    reads what changed in its database); ``partitions`` key ranges of a source whose full pass
    is due (all with ``full``) are read in ``workers`` processes (``1``: in this one), or on
    ``executor`` when given (a Dask client's: its workers open the databases themselves).
    ``done`` is told ``(parts finished, parts in all)``, a part a summary or a range; the
    whole is ``None`` until every summary has been brought forward or found stale. Raises
    :class:`~dp_governor.budget.reporting.routing.ShardMisrouted` for the first shard that
    holds devices routed elsewhere (sources with ``shards``), once every part is read.
    """
    if partitions < 1 or workers < 1:
        raise ValueError("partitions and workers must be at least 1")
    day = utc_day(now)
    out: list[Passes | None] = [None] * len(sources)
    routes: dict[int, RouteCheck] = {}
    told = _Done(done)
    parts: dict[int, list[Summary]] = defaultdict(list)
    if not full:  # in threads of this process: what changed is small, a process start is not
        with ThreadPoolExecutor(max_workers=min(workers, len(sources))) as threads:
            forwards = [
                threads.submit(_forward, s.open_ledger, now, i, s.shards)
                for i, s in enumerate(sources)
            ]
            for i, forward in enumerate(forwards):
                out[i], route = forward.result()
                _keep(routes, i, route)
                told.one()
    starts = {i: scan_start(s.ledger.engine) for i, s in enumerate(sources) if out[i] is None}
    with parts_pool(workers if starts else 1, executor) as pool:
        scan = functools.partial(_scan, day=day, chunk=chunk)
        scans = []
        for i, start in starts.items():
            for keys in _key_bounds(sources[i].ledger, partitions):
                task = pool.submit(scan, sources[i].open_ledger, start, keys, i, sources[i].shards)
                scans.append((i, task))
        told.known(told.finished + len(scans))
        for i, task in scans:
            summary, route = task.result()
            parts[i].append(summary)
            _keep(routes, i, route)
            told.one()
    for i, (book, _) in starts.items():
        out[i] = settled_full(sources[i].ledger.engine, book, joined(book, parts[i]), now=now)
    for position in sorted(routes):
        routes[position].refuse()
    return [p for p in out if p is not None]


def partitioned_basis(
    ledger: Ledger,
    open_ledger: Callable[[], Ledger],
    *,
    now: datetime,
    partitions: int,
    workers: int,
    full: bool = False,
    done: Callable[[int, int | None], None] | None = None,
    executor: Executor | None = None,
) -> ReportBasis:
    """:func:`effective_epsilon_basis` with a full pass in ``partitions`` key ranges when due.

    From the stored summary brought forward when it can be (:func:`summary_passes`);
    ``open_ledger`` opens the same ledger in a worker process; ``done`` is told ``(parts
    finished, parts in all)`` (:func:`summary_passes`); ``executor`` runs the parts instead of
    ``workers`` processes.
    """
    ((book, window, lifetime),) = summary_passes(
        [Source(ledger, open_ledger)],
        now=now,
        partitions=partitions,
        workers=workers,
        full=full,
        done=done,
        executor=executor,
    )
    day = utc_day(now)
    basis = basis_of(book, day, window, lifetime, computed_at=now.isoformat())
    return replace(basis, central=central_figures(ledger.engine, book.versions, day))
