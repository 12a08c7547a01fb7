"""The effective-epsilon report's pass run in parallel over ranges of device keys, merged exactly.

The accounts are split into ranges of nearly equal size (:meth:`Ledger.account_splits`); each
range is scanned in a process of its own (:func:`spend_passes` restricted to it), and the
finished passes merge into those of one scan (:meth:`SpendPass.merge`: histograms add), so the
report equals :func:`dp_governor.budget.reporting.loss.effective_epsilon_basis`'s bit for bit.
The ranges may come from several databases (:mod:`.sharded`: one per shard of device keys):
:func:`merged_passes` takes each range with the opener of its own ledger.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime

from dp_governor.budget.clock import utc_day
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.central import central_figures
from dp_governor.budget.reporting.loss import spend_passes
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.report import ReportBasis, basis_of
from dp_governor.budget.reporting.routing import RouteCheck
from dp_governor.budget.rule.book import PolicyBook

__all__ = ["KeyRange", "PoliciesChanged", "key_ranges", "merged_passes", "partitioned_basis"]

Part = tuple[PolicyBook, SpendPass, SpendPass, RouteCheck | None]


class PoliciesChanged(RuntimeError):
    """A policy or horizon changed while the partitions were read: the passes do not agree.

    ``source`` is the index of the ledger whose book changed (:class:`KeyRange`).
    """

    def __init__(self, message: str, source: int = 0) -> None:
        super().__init__(message)
        self.source = source


@dataclass(frozen=True, slots=True)
class KeyRange:
    """The device keys ``(after, through]`` of one ledger, read under ``book`` (its ``source``-th).

    ``open_ledger`` opens that ledger in a worker process (it must pickle: a module-level
    function or a :func:`functools.partial` of one). With ``shards``, the ledger is shard
    ``source`` of that many and every device read is checked to route there
    (:class:`~dp_governor.budget.reporting.routing.RouteCheck`).
    """

    source: int
    open_ledger: Callable[[], Ledger]
    after: str
    through: str | None
    shards: int | None = None


def key_ranges(
    ledger: Ledger,
    open_ledger: Callable[[], Ledger],
    partitions: int,
    source: int = 0,
    shards: int | None = None,
) -> list[KeyRange]:
    """``ledger``'s accounts in ``partitions`` key ranges of nearly equal size (fewer if small).

    ``shards``: the ledger is shard ``source`` of that many (:class:`KeyRange`).
    """
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    bounds = ["", *ledger.account_splits(partitions)]
    return [
        KeyRange(source, open_ledger, after, bounds[i + 1] if i + 1 < len(bounds) else None, shards)
        for i, after in enumerate(bounds)
    ]


def _part(r: KeyRange, now: datetime) -> Part:
    """One range's finished (window, lifetime) passes, under the book it read them with.

    With the range's devices checked against the routing when it is a shard's.
    """
    route = None if r.shards is None else RouteCheck(r.source, r.shards)
    ledger = r.open_ledger()
    try:
        book = ledger.book()
        ((window, lifetime),) = spend_passes(
            ledger, now=now, books=[book], after=r.after, through=r.through, route=route
        )
        return book, window, lifetime, route
    finally:
        ledger.close()


def merged_passes(
    ranges: Sequence[KeyRange],
    books: Sequence[PolicyBook],
    *,
    now: datetime,
    workers: int,
    done: Callable[[int, int], None] | None = None,
) -> list[tuple[SpendPass, SpendPass]]:
    """Each source's (window, lifetime) passes: its ``ranges`` read in ``workers`` processes.

    ``books[i]`` is source ``i``'s book as read before the run; the passes are built under it
    and merged per source (:meth:`SpendPass.merge`). ``done`` is told ``(ranges finished,
    ranges)``. Raises :class:`PoliciesChanged` naming the source whose book changed meanwhile,
    and, once every range is read, :class:`~dp_governor.budget.reporting.routing.ShardMisrouted`
    for the first shard that holds devices routed elsewhere (ranges with ``shards``).
    """
    if workers < 1:
        raise ValueError("workers must be at least 1")
    merged = [(SpendPass(book), SpendPass(book)) for book in books]
    routes: dict[int, RouteCheck] = {}
    spawn = multiprocessing.get_context("spawn")  # no copy of the parent's connections
    with ProcessPoolExecutor(max_workers=min(workers, len(ranges)), mp_context=spawn) as pool:
        futures = [(r.source, pool.submit(_part, r, now)) for r in ranges]
        for n, (source, future) in enumerate(futures, start=1):
            read_under, part_window, part_lifetime, route = future.result()
            if route is not None:
                routes.setdefault(source, RouteCheck(route.position, route.shards)).merge(route)
            book = books[source]
            if (read_under.versions, read_under.horizons) != (book.versions, book.horizons):
                raise PoliciesChanged(
                    "the policies changed while the report ran: run it again", source
                )
            merged[source][0].merge(part_window)
            merged[source][1].merge(part_lifetime)
            if done is not None:
                done(n, len(ranges))
    for source in sorted(routes):
        routes[source].refuse()
    return [(window.finish(), lifetime.finish()) for window, lifetime in merged]


def partitioned_basis(
    ledger: Ledger,
    open_ledger: Callable[[], Ledger],
    *,
    now: datetime,
    partitions: int,
    workers: int,
    done: Callable[[int, int], None] | None = None,
) -> ReportBasis:
    """:func:`effective_epsilon_basis` from ``partitions`` key ranges in ``workers`` processes.

    ``open_ledger`` opens the same ledger in a worker process (it must pickle: a module-level
    function or a :func:`functools.partial` of one); ``done`` is told ``(ranges finished,
    ranges)``. Raises :class:`PoliciesChanged` if the policy book changed during the run.
    """
    if partitions < 1 or workers < 1:
        raise ValueError("partitions and workers must be at least 1")
    book = ledger.book()
    ranges = key_ranges(ledger, open_ledger, partitions)
    ((window, lifetime),) = merged_passes(ranges, [book], now=now, workers=workers, done=done)
    day = utc_day(now)
    basis = basis_of(book, day, window, lifetime, computed_at=now.isoformat())
    return replace(basis, central=central_figures(ledger.engine, book.versions, day))
