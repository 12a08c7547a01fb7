"""Retention: spend records, inbox rows, stored reports and sketches past each window deleted."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import Connection, Engine, and_, delete, func, select, update
from sqlalchemy.exc import IntegrityError

from dp_governor.budget import Ledger, utc_day
from dp_governor.budget.audit.log import Entry
from dp_governor.budget.reporting.series_forward import advance_series
from dp_governor.budget.reporting.summary import advance_summary
from dp_governor.budget.reporting.what_if_summary import advance_what_ifs
from dp_governor.budget.storage.db import delete_pages, write_step
from dp_governor.pipeline.tables import INBOX as _INBOX
from dp_governor.pipeline.tables import MOVES as _MOVES
from dp_governor.pipeline.tables import PARTS as _PARTS
from dp_governor.pipeline.tables import REPORTS as _REPORTS
from dp_governor.pipeline.tables import SKETCHES as _SKETCHES
from dp_governor.pipeline.tables import (
    STEP_ROWS,
)

__all__ = ["purge"]

log = logging.getLogger("dpgov.pipeline")


def purge(ledger: Ledger, *, now: datetime, rows: int = STEP_ROWS) -> dict[str, int]:
    """Retention: the ledger's purge of the spend records, then of the reports themselves.

    Both follow the book's one rule (:meth:`dp_governor.budget.rule.book.PolicyBook.purge_through`)
    over every use case ever defined, retired ones included: the ledger keeps spend records for the
    longest retention ever, the inbox rows, stored reports and sketches go at the latest
    version's retention (``data_through``; docs/decisions/retention.md). Deletes go ``rows`` a
    transaction; a use case's inbox is left alone while a batch of it is being moved (the next
    purge takes those rows), and its stored reports go part by part, each part's row with its
    last reports. The audit entry counts what this run deleted. The stored report summary and
    what-ifs and the dashboard's series are brought to ``now`` first
    (:func:`dp_governor.budget.reporting.summary.advance_summary`,
    :func:`dp_governor.budget.reporting.what_if_summary.advance_what_ifs`,
    :func:`dp_governor.budget.reporting.series_forward.advance_series`), so the horizons this
    purge raises never make the next report, what-if or series read everything again.
    """
    for advance in (advance_summary, advance_what_ifs, advance_series):
        try:
            advance(ledger, now=now)
        except Exception as exc:  # a stored summary never holds back retention: it goes stale
            log.warning("%s before the purge failed (%r): a full pass next", advance.__name__, exc)
    result = ledger.purge(now=now, rows=rows)
    engine = ledger.engine
    day = utc_day(now)
    reports = sketches = inbox = 0
    with engine.connect() as conn:
        kept = ledger.gate.book(conn).purge_through(day)
    for name, retention in kept.items():
        cutoff = retention.data_through
        inbox += _purge_inbox(engine, name, cutoff, rows)
        reports += _purge_reports(engine, name, cutoff, rows)
        with write_step(engine) as conn:
            sketches += conn.execute(
                delete(_SKETCHES).where(
                    and_(_SKETCHES.c.use_case == name, _SKETCHES.c.day <= cutoff)
                )
            ).rowcount
    with write_step(engine) as conn:
        data = {"day": day, "reports": reports, "sketches": sketches, "inbox": inbox}
        ledger.audit.append(conn, [Entry("job:purge", "purge.reports", data)], now=now)
    with engine.connect() as conn:
        inbox_depth = conn.execute(select(func.count()).select_from(_INBOX)).scalar_one()
    return {
        "charges": result.charges,
        "daily_spend": result.daily_spend,
        "idempotency": result.idempotency,
        "reports": reports,
        "sketches": sketches,
        "inbox": inbox,
        "inbox_depth": int(inbox_depth),
    }


def _purge_inbox(engine: Engine, use_case: str, cutoff: int, rows: int) -> int:
    """Delete a use case's inbox rows on or before ``cutoff``, unless a batch of it is moving.

    Each transaction raises the use case's generation (:class:`InboxMove`), so a flush that
    read these rows before plans its batch again instead of claiming rows that are gone.
    """
    return delete_pages(
        engine,
        _INBOX,
        (_INBOX.c.use_case, _INBOX.c.day, _INBOX.c.id),
        and_(_INBOX.c.use_case == use_case, _INBOX.c.day <= cutoff),
        rows,
        before=lambda conn: _next_generation(conn, use_case),  # a batch moving: next purge's
    )


def _next_generation(conn: Connection, use_case: str) -> bool:
    """Raise a use case's inbox generation in ``conn``; ``False`` while a batch is moving."""
    raised = conn.execute(
        update(_MOVES)
        .where(and_(_MOVES.c.use_case == use_case, _MOVES.c.batch.is_(None)))
        .values(generation=_MOVES.c.generation + 1)
    ).rowcount
    if raised:
        return True
    if conn.execute(select(_MOVES.c.use_case).where(_MOVES.c.use_case == use_case)).first():
        return False
    try:
        with conn.begin_nested():
            conn.execute(_MOVES.insert().values(use_case=use_case, generation=1, moved=0))
    except IntegrityError:  # a flush claimed the use case's first batch meanwhile
        return False
    return True


def _purge_reports(engine: Engine, use_case: str, cutoff: int, rows: int) -> int:
    """Delete a use case's stored reports on or before ``cutoff``, part by part.

    Each part's reports go a page at a time in the order of ``ix_reports_part``; the part's row
    goes in the transaction of its last reports.
    """
    with engine.connect() as conn:
        parts = conn.execute(
            select(_PARTS.c.batch, _PARTS.c.params, _PARTS.c.day).where(
                and_(_PARTS.c.use_case == use_case, _PARTS.c.day <= cutoff)
            )
        ).all()
    order = (_REPORTS.c.batch, _REPORTS.c.params, _REPORTS.c.day, _REPORTS.c.id)
    deleted = 0
    for batch, params, day in parts:

        def part_row(
            conn: Connection, batch: int = batch, params: str = params, day: int = day
        ) -> None:
            conn.execute(
                delete(_PARTS).where(
                    and_(_PARTS.c.batch == batch, _PARTS.c.params == params, _PARTS.c.day == day)
                )
            )

        in_part = and_(
            _REPORTS.c.batch == batch, _REPORTS.c.params == params, _REPORTS.c.day == day
        )
        deleted += delete_pages(engine, _REPORTS, order, in_part, rows, last=part_row)
    return deleted
