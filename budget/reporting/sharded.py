"""The effective-epsilon report over several databases, one per shard of device keys, merged.

A sharded ledger (docs/scaling.md) routes each device to one database by its key,
``int(device_key[:8], 16) % N``: its account, its charges and its reports' inbox rows live
there alone, and each shard's flush shuffles and publishes its own batches. The report's
population figures are functions of per-device values, so each shard's passes come from its own
stored summary brought forward, or a full pass over its key ranges where one is due
(:func:`dp_governor.budget.reporting.partitioned.summary_passes`), and the passes merge
exactly: the merged report equals the one a single database holding every device would give,
bit for bit. The policies must be the same everywhere (:func:`terms_digest`).

Central figures do not add: a device's reports are hidden only in its own shard's batches, so
its central loss is its shard's figure. :func:`merge_central` keeps, per use case, day and
horizon, the largest of the shards' figures (valid for every device, as each lies in exactly one
shard), and none where some shard's batches give none (its reports count unamplified).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from datetime import datetime
from typing import Any, Final

import orjson

from dp_governor.budget.clock import utc_day
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.central import (
    MAX_BATCHES_SHOWN,
    CentralLine,
    CentralLoss,
    DayFigure,
    central_figures,
)
from dp_governor.budget.reporting.partitioned import Source, summary_passes
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.report import ReportBasis, basis_of
from dp_governor.budget.reporting.routing import ROUTING, ShardMisrouted, shard_of
from dp_governor.budget.rule.book import PolicyBook

__all__ = [
    "CENTRAL_RULE",
    "ROUTING",
    "PoliciesChanged",
    "ShardMisrouted",
    "ShardPoliciesDiffer",
    "merge_central",
    "same_policies",
    "shard_of",
    "sharded_basis",
    "terms_digest",
]

CENTRAL_RULE: Final = (
    "each shard shuffles and publishes its own batches and a device lies in exactly one shard,"
    " so a device's central loss is its own shard's figure: per use case, day and horizon the"
    " largest of the shards' figures is kept (none where some shard's batches give none)"
)
_IGNORED: Final = frozenset({"created_at", "actor"})  # when and by whom: no figure uses them


class ShardPoliciesDiffer(ValueError):
    """Shard ``shard``'s policies differ from the first shard's: no report covers both."""

    def __init__(self, shard: int) -> None:
        super().__init__(f"shard {shard} has other policies than shard 0")
        self.shard = shard


class PoliciesChanged(RuntimeError):
    """Shard ``source``'s policies changed while the report ran: its passes are under others."""

    def __init__(self, message: str, source: int = 0) -> None:
        super().__init__(message)
        self.source = source


def terms_digest(book: PolicyBook) -> str:
    """SHA-256 of every policy version's terms and the device-wide budget in force.

    What the report's figures depend on; when a version was written and by whom are left
    out (each shard records its own copy's).
    """
    versions = [
        p.model_dump(mode="json", exclude=set(_IGNORED))
        for p in sorted(book.versions, key=lambda p: (p.name, p.version))
    ]
    device = None if book.device is None else repr(book.device)
    blob = orjson.dumps(
        {"versions": versions, "device": device, "device_window": book.device_window},
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(blob).hexdigest()


def same_policies(ledgers: Sequence[Ledger]) -> list[PolicyBook]:
    """Every shard's policy book, checked equal to the first's (:func:`terms_digest`).

    Raises:
        ShardPoliciesDiffer: naming the first shard whose policies differ.
    """
    books = [ledger.book() for ledger in ledgers]
    first = terms_digest(books[0])
    for shard, book in enumerate(books[1:], start=1):
        if terms_digest(book) != first:
            raise ShardPoliciesDiffer(shard)
    return books


def _worst(figures: Sequence[CentralLoss | None]) -> CentralLoss | None:
    """The largest figure, the first of equals; ``None`` if any is (no amplification there)."""
    if not figures or any(f is None for f in figures):
        return None
    known = [f for f in figures if f is not None]
    return max(known, key=lambda f: f.epsilon)  # max keeps the first of equals


def _merge_days(lines: Sequence[CentralLine]) -> list[DayFigure]:
    """Each day's batches over the shards: counts add, the smallest listed, the worst composed."""
    by_day: dict[str, list[DayFigure]] = {}
    for line in lines:
        for day in line.days:
            by_day.setdefault(day.day, []).append(day)
    merged = []
    for name, days in sorted(by_day.items()):
        every = [b for d in days for b in d.batches]
        smallest = sorted(range(len(every)), key=lambda i: (every[i].devices, every[i].reports))
        shown = sorted(smallest[:MAX_BATCHES_SHOWN])  # in the shards' order, as listed
        merged.append(
            DayFigure(
                day=name,
                published=sum(d.published for d in days),
                devices=sum(d.devices for d in days),
                reports=sum(d.reports for d in days),
                batches=[every[i] for i in shown],
                composed=_worst([d.composed for d in days]),
            )
        )
    return merged


def _merge_line(lines: Sequence[CentralLine]) -> CentralLine:
    """One use case's central figures from its shards' lines (the module docstring's rule)."""
    if len(lines) == 1:
        return lines[0]
    in_window = [line for line in lines if line.days]  # a day listed: batches in the window
    notes = list(dict.fromkeys(n for line in lines for n in line.notes))
    notes.append(f"merged over {len(lines)} shards: {CENTRAL_RULE}")
    return replace(
        lines[0],
        days=_merge_days(lines),
        window=_worst([line.window for line in in_window]),
        year=_worst([line.year for line in lines]),
        window_adaptive=_worst([line.window_adaptive for line in in_window]),
        year_adaptive=_worst([line.year_adaptive for line in lines]),
        notes=notes,
    )


def merge_central(per_shard: Sequence[Sequence[CentralLine]]) -> list[CentralLine]:
    """The shards' central figures as one list, a line per use case any shard published for."""
    by_use_case: dict[str, list[CentralLine]] = {}
    for lines in per_shard:
        for line in lines:
            by_use_case.setdefault(line.use_case, []).append(line)
    return [_merge_line(lines) for _, lines in sorted(by_use_case.items())]


def sharded_basis(
    ledgers: Sequence[Ledger],
    openers: Sequence[Callable[[], Ledger]],
    *,
    now: datetime,
    partitions: int = 1,
    workers: int,
    full: bool = False,
    done: Callable[[int, int | None], None] | None = None,
    executor: Executor | None = None,
) -> ReportBasis:
    """The report's basis over every shard: each from its summary or ``partitions`` key ranges.

    ``ledgers[i]`` is shard ``i`` opened here and ``openers[i]`` opens it in a worker process
    (it must pickle; ``executor``, when given, runs the parts instead of ``workers``
    processes: :func:`summary_passes`); ``full`` reads every account of every shard (and
    checks every device's routing). Raises :class:`ShardPoliciesDiffer` naming the first shard
    whose policies differ from shard 0's, :class:`PoliciesChanged` (``source``: the shard) if a
    shard's changed during the run, and :class:`ShardMisrouted` naming the first shard found
    holding a device the routing puts in another (a shard given twice, or shards out of order,
    show so). The provenance's ``shards`` says what was covered.
    """
    if not ledgers or len(ledgers) != len(openers):
        raise ValueError("give one opener for each of at least one shard")
    books = same_policies(ledgers)
    sources = [
        Source(ledger, opener, len(ledgers))
        for ledger, opener in zip(ledgers, openers, strict=True)
    ]
    passes = summary_passes(
        sources,
        now=now,
        partitions=partitions,
        workers=workers,
        full=full,
        done=done,
        executor=executor,
    )
    first = terms_digest(books[0])
    window, lifetime = SpendPass(books[0]), SpendPass(books[0])
    for shard, (book, shard_window, shard_lifetime) in enumerate(passes):
        if terms_digest(book) != first:
            raise PoliciesChanged("the policies changed while the report ran: run it again", shard)
        window.merge(shard_window)
        lifetime.merge(shard_lifetime)
    devices = [sum(shard_lifetime.totals.values()) for _, _, shard_lifetime in passes]
    day = utc_day(now)
    basis = basis_of(books[0], day, window, lifetime, computed_at=now.isoformat())
    central = merge_central(
        [
            central_figures(ledger.engine, book.versions, day)
            for ledger, book in zip(ledgers, books, strict=True)
        ]
    )
    shards: dict[str, Any] = {
        "shards": len(ledgers),
        "devices": sum(devices),
        "devices_per_shard": devices,
        "policies_sha256": terms_digest(books[0]),
        "routing": ROUTING,
        "merge": "every shard's per-device histograms added (exact: as one database)",
        "central": CENTRAL_RULE,
    }
    return replace(basis, central=central, provenance={**basis.provenance, "shards": shards})
