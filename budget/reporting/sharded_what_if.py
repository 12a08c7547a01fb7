"""What-if of a policy edit over a ledger sharded by device key: each shard's counts, added.

A what-if's population part is device counts per side (in the window, refused next report,
over the window and the lifetime caps; :func:`dp_governor.budget.reporting.views.what_if`), and
the device-wide budget's is devices refused per use case and budget
(:func:`~dp_governor.budget.reporting.views.what_if_device_budget`). A device lies in one
shard, so the counts add; the rest (the effective-epsilon lines, what loosens) depends on the
policies alone, which :func:`~dp_governor.budget.reporting.sharded.same_policies` checks are the
same on every shard. Each shard is read in a worker process of its own, which checks every
device it reads routes to that shard (:class:`~dp_governor.budget.reporting.routing.RouteCheck`).
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime
from typing import Any

from dp_governor.budget.errors import InvalidRequest
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.routing import RouteCheck
from dp_governor.budget.reporting.sharded import same_policies
from dp_governor.budget.reporting.views import WhatIf, what_if, what_if_device_budget
from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.model import PolicyCreate

__all__ = ["sharded_what_if", "sharded_what_if_device_budget"]

DeviceWhatIf = dict[str, dict[str, dict[str, int]]]


def _what_if(
    open_ledger: Callable[[], Ledger],
    route: RouteCheck,
    use_case: str,
    proposed: PolicyCreate,
    now: datetime,
    alongside: Sequence[PolicyCreate],
) -> tuple[WhatIf, RouteCheck]:
    """One shard's what-if, in a worker process, and what it read routed elsewhere."""
    ledger = open_ledger()
    try:
        return what_if(ledger, use_case, proposed, now=now, alongside=alongside, route=route), route
    finally:
        ledger.close()


def _device_what_if(
    open_ledger: Callable[[], Ledger],
    route: RouteCheck,
    proposed: DeviceBudgetCreate,
    now: datetime,
) -> tuple[DeviceWhatIf, RouteCheck]:
    """One shard's device-wide budget what-if, in a worker process, and its route check."""
    ledger = open_ledger()
    try:
        return what_if_device_budget(ledger, proposed, now=now, route=route), route
    finally:
        ledger.close()


def _each_shard(
    call: Callable[..., tuple[Any, RouteCheck]],
    openers: Sequence[Callable[[], Ledger]],
    workers: int,
    *args: Any,
) -> list[Any]:
    """``call(opener, route, *args)`` for every shard, ``workers`` processes at once, in order.

    Raises :class:`~dp_governor.budget.reporting.routing.ShardMisrouted` for the first shard
    that holds a device the routing puts in another.
    """
    spawn = multiprocessing.get_context("spawn")  # no copy of the parent's connections
    with ProcessPoolExecutor(max_workers=min(workers, len(openers)), mp_context=spawn) as pool:
        futures = [
            pool.submit(call, opener, RouteCheck(shard, len(openers)), *args)
            for shard, opener in enumerate(openers)
        ]
        results = [future.result() for future in futures]
    for _, route in results:
        route.refuse()
    return [result for result, _ in results]


def _added(sides: Sequence[dict[str, int]]) -> dict[str, int]:
    """Per-side counts of disjoint sets of devices, added."""
    return {side: sum(s[side] for s in sides) for side in sides[0]}


def sharded_what_if(
    ledgers: Sequence[Ledger],
    openers: Sequence[Callable[[], Ledger]],
    use_case: str,
    proposed: PolicyCreate,
    *,
    now: datetime,
    alongside: Sequence[PolicyCreate] = (),
    workers: int,
) -> WhatIf:
    """:func:`what_if` over every shard: the device counts added, the rest shard 0's.

    The edit is checked here first, on shard 0, as a write would check it (raising
    :class:`~dp_governor.budget.errors.PolicyConflict`,
    :class:`~dp_governor.budget.errors.InvalidRequest` or
    :class:`~dp_governor.budget.errors.UnknownUseCase`), so a refusal never comes from a worker;
    :class:`~dp_governor.budget.reporting.sharded.ShardPoliciesDiffer` names a shard whose
    policies differ, :class:`~dp_governor.budget.reporting.routing.ShardMisrouted` one that
    holds devices the routing puts in another.
    """
    same_policies(ledgers)
    first = ledgers[0]
    first.policies.get(use_case)
    if proposed.name != use_case:
        raise InvalidRequest("name", f"must be {use_case!r}, the use case asked about")
    together = [proposed, *(p for p in alongside if p.name != use_case)]
    with first.engine.connect() as conn:
        first.policies.proposed(conn, together)
    shards: list[WhatIf] = _each_shard(
        _what_if, openers, workers, use_case, proposed, now, list(alongside)
    )
    return replace(
        shards[0],
        devices_in_window=_added([s.devices_in_window for s in shards]),
        refused_next_report_today=_added([s.refused_next_report_today for s in shards]),
        over_window_cap=_added([s.over_window_cap for s in shards]),
        over_lifetime_cap=_added([s.over_lifetime_cap for s in shards]),
    )


def sharded_what_if_device_budget(
    ledgers: Sequence[Ledger],
    openers: Sequence[Callable[[], Ledger]],
    proposed: DeviceBudgetCreate,
    *,
    now: datetime,
    workers: int,
) -> DeviceWhatIf:
    """:func:`what_if_device_budget` over every shard: the devices refused, added.

    Raises as :func:`sharded_what_if` does for shards with other policies or misrouted devices.
    """
    same_policies(ledgers)
    shards: list[DeviceWhatIf] = _each_shard(_device_what_if, openers, workers, proposed, now)
    out: dict[str, dict[str, Counter[str]]] = {}
    for shard in shards:
        for name, sides in shard.items():
            for side, refused in sides.items():
                out.setdefault(name, {}).setdefault(side, Counter()).update(refused)
    return {
        name: {side: dict(sorted(c.items())) for side, c in sides.items()}
        for name, sides in sorted(out.items())
    }
