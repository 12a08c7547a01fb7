"""The effective-epsilon report's pass run in parallel over ranges of device keys, merged exactly.

The accounts are split into ranges of nearly equal size (:meth:`Ledger.account_splits`); each
range is scanned in a process of its own (:func:`spend_passes` restricted to it), and the
finished passes merge into those of one scan (:meth:`SpendPass.merge`: histograms add), so the
report equals :func:`dp_governor.budget.reporting.loss.effective_epsilon_basis`'s bit for bit.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime

from dp_governor.budget.clock import utc_day
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.central import central_figures
from dp_governor.budget.reporting.loss import spend_passes
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.report import ReportBasis, basis_of
from dp_governor.budget.rule.book import PolicyBook

__all__ = ["PoliciesChanged", "partitioned_basis"]

Part = tuple[PolicyBook, SpendPass, SpendPass]


class PoliciesChanged(RuntimeError):
    """A policy or horizon changed while the partitions were read: the passes do not agree."""


def _part(
    open_ledger: Callable[[], Ledger], now: datetime, after: str, through: str | None
) -> Part:
    """One range's finished (window, lifetime) passes, under the book it read them with."""
    ledger = open_ledger()
    try:
        book = ledger.book()
        ((window, lifetime),) = spend_passes(
            ledger, now=now, books=[book], after=after, through=through
        )
        return book, window, lifetime
    finally:
        ledger.close()


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
    bounds = ["", *ledger.account_splits(partitions)]
    ranges = [
        (after, bounds[i + 1] if i + 1 < len(bounds) else None) for i, after in enumerate(bounds)
    ]
    spawn = multiprocessing.get_context("spawn")  # no copy of the parent's connections
    with ProcessPoolExecutor(max_workers=min(workers, len(ranges)), mp_context=spawn) as pool:
        futures = [pool.submit(_part, open_ledger, now, a, t) for a, t in ranges]
        window, lifetime = SpendPass(book), SpendPass(book)
        for n, future in enumerate(futures, start=1):
            read_under, part_window, part_lifetime = future.result()
            if (read_under.versions, read_under.horizons) != (book.versions, book.horizons):
                raise PoliciesChanged("the policies changed while the report ran: run it again")
            window.merge(part_window)
            lifetime.merge(part_lifetime)
            if done is not None:
                done(n, len(ranges))
    day = utc_day(now)
    basis = basis_of(book, day, window.finish(), lifetime.finish(), computed_at=now.isoformat())
    return replace(basis, central=central_figures(ledger.engine, book.versions, day))
