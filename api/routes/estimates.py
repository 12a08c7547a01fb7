"""Estimates: frequency estimates from the stored sketches, and SFP's discovered words."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Query

from dp_governor.api.deps import (
    AdminDep,
    CachesDep,
    ClockDep,
    IngestorDep,
    PolicyStoreDep,
    UseCaseName,
)
from dp_governor.api.schemas import (
    Discoveries,
    Discovery,
    EstimateItem,
    EstimateQuery,
    Estimates,
    IsoDay,
)
from dp_governor.budget import Clock, InvalidRequest, utc_day
from dp_governor.budget.clock import date_day, day_date
from dp_governor.mechanisms import Discovering
from dp_governor.pipeline.fold import load_sketch
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.policies.repository import PolicyStore

__all__ = ["day_range", "router"]

router = APIRouter(tags=["estimates"])

FromDay = Annotated[
    IsoDay | None,
    Query(
        alias="from",
        description="The first UTC day (ISO date); default 89 days before today, so that the"
        " default range is the last 90 days.",
    ),
]
ToDay = Annotated[
    IsoDay | None, Query(alias="to", description="The last UTC day (ISO date); default today.")
]


def day_range(start: date | None, end: date | None, clock: Clock) -> tuple[int, int]:
    """The day numbers of ``from`` and ``to`` (default: the last 90 days, today included)."""
    today = utc_day(clock.now())
    first = date_day(start) if start else today - 89
    last = date_day(end) if end else today
    if first > last:
        raise InvalidRequest("from", "must not be after `to`")
    return first, last


@router.get("/v1/use-cases/{name}/estimates", response_model=Estimates)
def estimates(
    name: UseCaseName,
    ingestor: IngestorDep,
    store: PolicyStoreDep,
    clock: ClockDep,
    candidates: Annotated[
        list[str],
        Query(
            min_length=1,
            max_length=300_000,
            description="The values to estimate, one `candidates=` each (for long lists, POST"
            " them to `.../estimates:query`).",
        ),
    ],
    start: FromDay = None,
    end: ToDay = None,
    _admin: None = AdminDep,
) -> Estimates:
    """Frequency estimates with standard errors from the chosen days' sketches (>= T)."""
    return _estimate(ingestor, store, clock, name, candidates, start, end)


@router.post("/v1/use-cases/{name}/estimates:query", response_model=Estimates)
def estimates_query(
    name: UseCaseName,
    ingestor: IngestorDep,
    store: PolicyStoreDep,
    query: EstimateQuery,
    clock: ClockDep,
    _admin: None = AdminDep,
) -> Estimates:
    """As ``GET .../estimates``, with the candidates in the body (for long lists)."""
    return _estimate(ingestor, store, clock, name, query.candidates, query.start, query.end)


def _estimate(
    ingestor: Ingestor,
    store: PolicyStore,
    clock: Clock,
    name: str,
    candidates: list[str],
    start: date | None,
    end: date | None,
) -> Estimates:
    policy = store.get(name)
    first, last = day_range(start, end, clock)
    sketch, days = load_sketch(ingestor.ledger, ingestor, policy, first, last)
    est = sketch.estimate(candidates)
    items = [
        EstimateItem(item=str(c), count=float(n), stderr=float(s))
        for c, n, s in zip(est.candidates, est.counts, est.stderr, strict=True)
        if n >= policy.publish_threshold
    ]
    items.sort(key=lambda e: -e.count)
    return Estimates(
        use_case=name,
        days=[day_date(d) for d in days],
        n=est.n,
        publish_threshold=policy.publish_threshold,
        estimates=items,
    )


@router.get("/v1/use-cases/{name}/discoveries", response_model=Discoveries)
def discoveries(
    name: UseCaseName,
    ingestor: IngestorDep,
    store: PolicyStoreDep,
    caches: CachesDep,
    clock: ClockDep,
    start: FromDay = None,
    end: ToDay = None,
    _admin: None = AdminDep,
) -> Discoveries:
    """Words discovered by SFP over the chosen days, above the publication threshold."""
    policy = store.get(name)
    first, last = day_range(start, end, clock)
    sketch, days = load_sketch(ingestor.ledger, ingestor, policy, first, last)
    if not isinstance(sketch, Discovering):
        raise InvalidRequest("name", f"use case {name!r} is not an SFP use case")
    found = caches.discovery(policy, days, sketch)
    return Discoveries(
        use_case=name,
        days=[day_date(d) for d in days],
        n=sketch.n,
        words=[Discovery(word=d.word, count=d.count, stderr=d.stderr) for d in found],
        threshold=sketch.publication_threshold(policy.publish_threshold or None),
    )
