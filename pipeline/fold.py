"""The fold: published batch parts added into per-day sketches, each write checked first.

``aggregate`` reads a sketch and the reports of its unfolded batch parts outside any write
transaction and adds them, then writes the sketch and marks the parts folded in one transaction,
only if the sketch is still the one it read (its count unchanged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, and_, select, update

from dp_governor.budget import Ledger
from dp_governor.budget.storage.db import write_step
from dp_governor.mechanisms import Mechanism, Sketch
from dp_governor.pipeline.codec import sketch_from_bytes, sketch_to_bytes
from dp_governor.pipeline.ingest import Ingestor
from dp_governor.pipeline.tables import PARTS as _PARTS
from dp_governor.pipeline.tables import REPORTS as _REPORTS
from dp_governor.pipeline.tables import SKETCHES as _SKETCHES
from dp_governor.policies import Policy, mechanism_for
from dp_governor.policies.repository import lock_names

__all__ = [
    "AggregateResult",
    "aggregate",
    "load_sketch",
    "mechanisms_by_params",
    "part_payloads",
    "published_parts",
]

_FOLD_ROUND = 1_000_000  # reports one sketch write adds at most (a part is never split)
_FOLD_ATTEMPTS = 3
_READ_PAGE = 20_000
log = logging.getLogger("dpgov.pipeline")


class _Stale(Exception):
    """Rolls a fold's write back: the sketch or its parts changed since they were read."""


def mechanisms_by_params(ledger: Ledger, use_case: str) -> dict[str, Mechanism]:
    """Every parameter set a use case ever had, by its hash (reports keep theirs)."""
    out: dict[str, Mechanism] = {}
    for version in ledger.policies.versions(use_case):
        mech = mechanism_for(version)
        out[mech.fingerprint.params] = mech
    return out


def published_parts(
    conn: Connection, use_case: str, first_day: int, last_day: int
) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """A use case's published batch parts by (day, parameter hash): ``(batch, reports)`` each."""
    rows = conn.execute(
        select(_PARTS.c.day, _PARTS.c.params, _PARTS.c.batch, _PARTS.c.reports)
        .where(
            and_(_PARTS.c.use_case == use_case, _PARTS.c.day >= first_day, _PARTS.c.day <= last_day)
        )
        .order_by(_PARTS.c.day, _PARTS.c.params, _PARTS.c.batch)
    )
    out: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for day, params, batch, reports in rows:
        out.setdefault((int(day), str(params)), []).append((int(batch), int(reports)))
    return out


def part_payloads(
    engine: Engine, batch: int, params: str, day: int, page: int = _READ_PAGE
) -> Iterator[list[str]]:
    """The stored payloads of one batch part, ``page`` at a time (one read transaction)."""
    query = select(_REPORTS.c.payload).where(
        and_(_REPORTS.c.batch == batch, _REPORTS.c.params == params, _REPORTS.c.day == day)
    )
    with engine.connect() as conn, conn.execution_options(yield_per=page).execute(query) as result:
        for rows in result.partitions():
            yield [r[0] for r in rows]


@dataclass(frozen=True, slots=True)
class AggregateResult:
    """Reports folded into sketches by one ``aggregate`` run, and the use cases that failed.

    ``failed`` maps a use case to the error that stopped its folding (its reports stay
    unfolded for the next run); the other use cases were folded regardless.
    """

    reports: int
    sketches: int
    failed: dict[str, str] = field(default_factory=dict)


def aggregate(
    ledger: Ledger, *, progress: Callable[[int, int], None] | None = None
) -> AggregateResult:
    """Fold every unfolded published batch part into its (use case, parameters, day) sketch.

    Each group is folded on its own: an error in one (a sketch too large for memory, a
    corrupt report) is logged and reported in the result, and the other groups go on.
    ``progress`` is called with the unfolded reports handled so far and those found, before
    each group and at the end.
    """
    engine = ledger.engine
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                _PARTS.c.use_case, _PARTS.c.params, _PARTS.c.day, _PARTS.c.batch, _PARTS.c.reports
            )
            .where(_PARTS.c.folded.is_(False))
            .order_by(_PARTS.c.use_case, _PARTS.c.params, _PARTS.c.day, _PARTS.c.batch)
        ).all()
    groups: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    for r in rows:
        groups.setdefault((str(r.use_case), str(r.params), int(r.day)), []).append(
            (int(r.batch), int(r.reports))
        )
    folded = 0
    touched = 0
    failed: dict[str, str] = {}
    known: dict[str, dict[str, Mechanism]] = {}
    total, handled = sum(n for parts in groups.values() for _, n in parts), 0
    for group, parts in groups.items():
        if progress is not None:  # before each group, and once all are done
            progress(handled, total)
        handled += sum(n for _, n in parts)
        use_case, params, day = group
        if use_case in failed:
            continue
        try:
            if use_case not in known:
                known[use_case] = mechanisms_by_params(ledger, use_case)
            mechanism = known[use_case].get(params)
            if mechanism is None:
                continue  # parameters of no known version: leave the reports for inspection
            n = sum(_fold_round(engine, mechanism, group, r) for r in _rounds(parts))
        except Exception as exc:  # one use case's failure never stops the others
            log.exception("aggregate: folding %s (day %d) failed", use_case, day)
            failed[use_case] = f"{type(exc).__name__}: {exc}"
            continue
        folded += n
        touched += n > 0
    if progress is not None:
        progress(total, total)
    return AggregateResult(folded, touched, failed)


def _rounds(parts: list[tuple[int, int]]) -> Iterator[list[int]]:
    """The parts' batches in rounds of about ``_FOLD_ROUND`` reports (whole parts, at least one)."""
    current: list[int] = []
    size = 0
    for batch, reports in parts:
        if current and size + reports > _FOLD_ROUND:
            yield current
            current, size = [], 0
        current.append(batch)
        size += reports
    if current:
        yield current


def _fold_round(
    engine: Engine, mechanism: Mechanism, group: tuple[str, str, int], batches: list[int]
) -> int:
    """Add some parts of a group to its sketch; how many reports (0 if they changed meanwhile).

    The sketch and the parts' reports are read and added outside any write transaction; the
    write (:func:`_write_sketch`) goes through only if neither changed, else this tries again
    with what is then left to fold, a few times, and leaves the rest to the next run.
    """
    use_case, params, day = group
    for _ in range(_FOLD_ATTEMPTS):
        with engine.connect() as conn:
            batches = [
                int(b)
                for b in conn.execute(
                    select(_PARTS.c.batch).where(
                        and_(
                            _PARTS.c.batch.in_(batches),
                            _PARTS.c.params == params,
                            _PARTS.c.day == day,
                            _PARTS.c.folded.is_(False),
                        )
                    )
                ).scalars()
            ]
            if not batches:
                return 0
            existing = conn.execute(
                select(_SKETCHES.c.n, _SKETCHES.c.state).where(_group(use_case, params, day))
            ).first()
        sketch = sketch_from_bytes(mechanism, existing.state) if existing else mechanism.sketch()
        for batch in batches:
            for payloads in part_payloads(engine, batch, params, day):
                sketch.add(mechanism.decode(payloads))
        before = None if existing is None else int(existing.n)
        if _write_sketch(engine, group, before, sketch, batches):
            return int(sketch.n) - (before or 0)
    log.warning(
        "aggregate: the sketch of %s (day %d) changed under the fold %d times; its reports"
        " wait for the next run",
        use_case,
        day,
        _FOLD_ATTEMPTS,
    )
    return 0


def _group(use_case: str, params: str, day: int) -> Any:
    """The condition selecting one (use case, parameters, day) sketch."""
    return and_(
        _SKETCHES.c.use_case == use_case, _SKETCHES.c.params == params, _SKETCHES.c.day == day
    )


def _write_sketch(
    engine: Engine,
    group: tuple[str, str, int],
    before: int | None,
    sketch: Sketch,
    batches: list[int],
) -> bool:
    """Write the sketch and mark its parts folded, if the sketch still counts ``before``.

    One transaction under the group's lock (PostgreSQL; SQLite's writers are serial): the count
    read must be the one the sketch was built from (``None``: no sketch yet), and every part
    must still be unfolded (a concurrent fold or purge changes one or the other); otherwise
    nothing is written. The counts only grow, so an unchanged count is an unchanged sketch.
    """
    use_case, params, day = group
    state = sketch_to_bytes(sketch)  # compressed before the transaction
    try:
        with write_step(engine) as conn:
            lock_names(conn, [f"sketch:{use_case}:{params}:{day}"])
            current = conn.execute(
                select(_SKETCHES.c.n).where(_group(use_case, params, day))
            ).scalar_one_or_none()
            if current != before:
                raise _Stale
            flipped = conn.execute(
                update(_PARTS)
                .where(
                    and_(
                        _PARTS.c.batch.in_(batches),
                        _PARTS.c.params == params,
                        _PARTS.c.day == day,
                        _PARTS.c.folded.is_(False),
                    )
                )
                .values(folded=True)
            ).rowcount
            if flipped != len(batches):
                raise _Stale
            if current is None:
                conn.execute(
                    _SKETCHES.insert().values(
                        use_case=use_case, params=params, day=day, n=sketch.n, state=state
                    )
                )
            else:
                conn.execute(
                    update(_SKETCHES)
                    .where(_group(use_case, params, day))
                    .values(n=sketch.n, state=state)
                )
    except _Stale:
        return False
    return True


def load_sketch(
    ledger: Ledger, ingestor: Ingestor, policy: Policy, first_day: int, last_day: int
) -> tuple[Sketch, list[int]]:
    """The merged sketch of the policy's current parameters over ``first_day..last_day``."""
    mechanism, params = ingestor.mechanism(policy)
    merged = mechanism.sketch()
    days: list[int] = []
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(_SKETCHES.c.day, _SKETCHES.c.state)
            .where(
                and_(
                    _SKETCHES.c.use_case == policy.name,
                    _SKETCHES.c.params == params,
                    _SKETCHES.c.day >= first_day,
                    _SKETCHES.c.day <= last_day,
                )
            )
            .order_by(_SKETCHES.c.day)
        )
        for day, state in rows:
            merged.merge(sketch_from_bytes(mechanism, state))
            days.append(int(day))
    return merged, days
