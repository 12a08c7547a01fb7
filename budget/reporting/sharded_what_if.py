"""What-if of a policy edit over a ledger sharded by device key: each shard's sums, added.

A what-if's population part is sums over devices (:mod:`.what_if_summary`): the passes under
the current and the proposed book, and device counts per side (in the window, refused next
report, over the window and the lifetime caps: :func:`dp_governor.budget.reporting.views.what_if`)
or, for the device-wide budget, devices refused per use case and budget
(:func:`~dp_governor.budget.reporting.views.what_if_device_budget`). A device lies in one
shard, so the sums add; the rest (the effective-epsilon lines, what loosens) depends on the
policies alone, which :func:`~dp_governor.budget.reporting.sharded.same_policies` checks are the
same on every shard.

As the report over shards does (:func:`~.partitioned.summary_passes`), each shard's stored
what-if is brought forward in a thread of this process, at a cost in proportion to what
changed; a shard whose full pass is due (no stored what-if yet, a policy edit, a purge past its
windows; every shard with ``full``) is read whole in a worker process. Each read checks the
devices it reads route to its shard (:class:`~dp_governor.budget.reporting.routing.RouteCheck`):
a full pass every device the shard holds; brought forward, the devices that changed and the
smallest and largest key held (a refusal then says "at least", and that ``--full`` counts every
device).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.partitioned import parts_pool
from dp_governor.budget.reporting.population import Sums
from dp_governor.budget.reporting.routing import RouteCheck
from dp_governor.budget.reporting.sharded import PoliciesChanged, same_policies, terms_digest
from dp_governor.budget.reporting.views import (
    WhatIf,
    device_what_if_of,
    policy_measure,
    what_if_of,
)
from dp_governor.budget.reporting.what_if_summary import (
    DeviceWhatIf,
    PolicyWhatIf,
    forwarded_sums,
    what_if_sums,
)
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.model import PolicyCreate

__all__ = ["sharded_what_if", "sharded_what_if_device_budget"]

Shard = tuple[PolicyBook, Sums]  # a shard's sums, under its book
MeasureOf = Callable[[Ledger, RouteCheck | None], PolicyWhatIf | DeviceWhatIf]


def _policy_measure(
    use_case: str,
    proposed: PolicyCreate,
    alongside: Sequence[PolicyCreate],
    ledger: Ledger,
    route: RouteCheck | None,
) -> PolicyWhatIf:
    """:func:`policy_measure` on a shard, seen by its ``route`` (a picklable builder)."""
    return policy_measure(ledger, use_case, proposed, alongside=alongside, route=route)


def _device_measure(
    proposed: DeviceBudgetCreate, ledger: Ledger, route: RouteCheck | None
) -> DeviceWhatIf:
    """The device-wide budget what-if of ``proposed`` on ``ledger`` (a picklable builder)."""
    return DeviceWhatIf(ledger.book(), proposed, route)


def _forward(
    open_ledger: Callable[[], Ledger], measure_of: MeasureOf, now: datetime, route: RouteCheck
) -> tuple[Shard | None, RouteCheck]:
    """A thread: the shard's stored what-if brought forward (``None``: a full pass is due)."""
    ledger = open_ledger()
    try:
        return forwarded_sums(ledger, measure_of(ledger, route), now=now), route
    finally:
        ledger.close()


def _full(
    open_ledger: Callable[[], Ledger], measure_of: MeasureOf, now: datetime, route: RouteCheck
) -> tuple[Shard, RouteCheck]:
    """A worker process: every account of the shard read, the what-if stored for next time."""
    ledger = open_ledger()
    try:
        return what_if_sums(ledger, measure_of(ledger, route), now=now, full=True), route
    finally:
        ledger.close()


def _each_shard(
    measure_of: MeasureOf,
    openers: Sequence[Callable[[], Ledger]],
    *,
    now: datetime,
    workers: int,
    full: bool,
) -> Shard:
    """Every shard's sums, from its stored what-if or a full pass, added; under shard 0's book.

    Raises :class:`~dp_governor.budget.reporting.routing.ShardMisrouted` for the first shard
    that holds a device the routing puts in another, and :class:`PoliciesChanged` if a shard's
    policies changed while it ran.
    """
    count = len(openers)
    shards: list[Shard | None] = [None] * count
    routes: dict[int, RouteCheck] = {}
    if not full:  # in threads of this process: what changed is small, a process start is not
        with ThreadPoolExecutor(max_workers=min(workers, count)) as threads:
            forwards = [
                threads.submit(_forward, opener, measure_of, now, RouteCheck(i, count))
                for i, opener in enumerate(openers)
            ]
            for i, forward in enumerate(forwards):
                shards[i], route = forward.result()
                if shards[i] is not None:  # else the full pass checks every device
                    routes[i] = route
    due = [i for i, shard in enumerate(shards) if shard is None]
    with parts_pool(min(workers, len(due)) or 1) as pool:
        fulls = {
            i: pool.submit(_full, openers[i], measure_of, now, RouteCheck(i, count)) for i in due
        }
        for i, task in fulls.items():
            shards[i], routes[i] = task.result()
    for i in sorted(routes):
        routes[i].refuse()
    done = [shard for shard in shards if shard is not None]
    book, total = done[0]
    for i, (shard_book, sums) in enumerate(done[1:], start=1):
        if terms_digest(shard_book) != terms_digest(book):
            raise PoliciesChanged("the policies changed while the what-if ran: run it again", i)
        total.merge(sums)
    return book, total


def sharded_what_if(
    ledgers: Sequence[Ledger],
    openers: Sequence[Callable[[], Ledger]],
    use_case: str,
    proposed: PolicyCreate,
    *,
    now: datetime,
    alongside: Sequence[PolicyCreate] = (),
    workers: int,
    full: bool = False,
) -> WhatIf:
    """:func:`what_if` over every shard: each shard's sums (stored what-if or a full pass), added.

    ``ledgers[i]`` is shard ``i`` opened here, ``openers[i]`` opens it in a thread or worker
    process (it must pickle). The edit is checked here first, on shard 0, as a write would
    check it (raising :class:`~dp_governor.budget.errors.PolicyConflict`,
    :class:`~dp_governor.budget.errors.InvalidRequest` or
    :class:`~dp_governor.budget.errors.UnknownUseCase`), so a refusal never comes from a worker;
    :class:`~dp_governor.budget.reporting.sharded.ShardPoliciesDiffer` names a shard whose
    policies differ, :class:`~dp_governor.budget.reporting.routing.ShardMisrouted` one that
    holds devices the routing puts in another. ``full`` reads every shard whole.
    """
    same_policies(ledgers)
    measure = policy_measure(ledgers[0], use_case, proposed, alongside=alongside)
    measure_of = functools.partial(_policy_measure, use_case, proposed, list(alongside))
    book, sums = _each_shard(measure_of, openers, now=now, workers=workers, full=full)
    return what_if_of(ledgers[0], measure, book, sums, now=now)


def sharded_what_if_device_budget(
    ledgers: Sequence[Ledger],
    openers: Sequence[Callable[[], Ledger]],
    proposed: DeviceBudgetCreate,
    *,
    now: datetime,
    workers: int,
    full: bool = False,
) -> dict[str, dict[str, dict[str, int]]]:
    """:func:`what_if_device_budget` over every shard: the devices refused, added.

    From each shard's stored what-if or a full pass, as :func:`sharded_what_if`; raises as it
    does for shards with other policies or misrouted devices.
    """
    same_policies(ledgers)
    measure_of = functools.partial(_device_measure, proposed)
    return device_what_if_of(*_each_shard(measure_of, openers, now=now, workers=workers, full=full))
