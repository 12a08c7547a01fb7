"""Reports accepted and refused per UTC day over the last days: public counts, no device.

Accepted reports are counted from the ``charges`` table (one row per acceptance, indexed by
day); refusals from the audit log's ``charge`` entries with ``"accepted":false``, which record
each refusal's use case, reason and day (the caps' reasons always listed, a filter's once one
refused). Only counts leave this module: no device key, no idempotency key. The audit log is
read from the first entry written on or after the first day (found by bisecting its sequence
numbers, which grow with time), so the cost follows the days shown, not the log's length.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Engine, func, select

from dp_governor.budget.audit.log import timestamp
from dp_governor.budget.clock import day_date, day_start, utc_day
from dp_governor.budget.storage.tables import AuditEntry, Charge

__all__ = ["REFUSAL_REASONS", "Activity", "daily_activity"]

REFUSAL_REASONS = ("daily_cap", "window_cap", "lifetime_cap")


@dataclass(frozen=True, slots=True)
class Activity:
    """Per-day counts over ``days`` (ISO dates, oldest first), each list aligned with them.

    ``accepted``: reports charged, per use case. ``refused``: reports refused by a cap, per
    reason and per use case and reason (``"use_case/reason"``).
    """

    days: list[str]
    accepted: dict[str, list[int]]
    refused: dict[str, list[int]]
    refused_by_use_case: dict[str, list[int]]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def _first_seq_at_or_after(engine: Engine, at: str) -> int | None:
    """The smallest audit sequence number written at or after ``at`` (bisection on seq)."""
    log = AuditEntry.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        lo, hi = conn.execute(select(func.min(log.c.seq), func.max(log.c.seq))).one()
        if lo is None:
            return None

        def at_of(seq: int) -> tuple[int, str]:
            row = conn.execute(
                select(log.c.seq, log.c.at).where(log.c.seq >= seq).order_by(log.c.seq).limit(1)
            ).one()
            return int(row[0]), str(row[1])

        if at_of(hi)[1] < at:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            seq, when = at_of(mid)
            if when < at:
                lo = seq + 1
            else:
                hi = mid
        return int(lo)


def daily_activity(engine: Engine, *, now: datetime, days: int = 14) -> Activity:
    """Accepted and refused reports per day for the ``days`` UTC days ending with ``now``'s."""
    if not 1 <= days <= 400:
        raise ValueError(f"days must be 1 to 400, got {days}")
    today = utc_day(now)
    first = today - days + 1
    index = {d: i for i, d in enumerate(range(first, today + 1))}
    accepted: dict[str, list[int]] = defaultdict(lambda: [0] * days)
    refused: dict[str, list[int]] = {r: [0] * days for r in REFUSAL_REASONS}
    by_use_case: dict[str, list[int]] = defaultdict(lambda: [0] * days)
    charges = Charge.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        rows = conn.execute(
            select(charges.c.day, charges.c.use_case, func.count())
            .where(charges.c.day >= first, charges.c.day <= today)
            .group_by(charges.c.day, charges.c.use_case)
        ).all()
    for day, use_case, n in rows:
        accepted[str(use_case)][index[int(day)]] += int(n)
    start = _first_seq_at_or_after(engine, timestamp(day_start(first)))
    if start is not None:
        log = AuditEntry.__table__  # type: ignore[attr-defined]
        query = select(log.c.body).where(
            log.c.seq >= start,
            log.c.action == "charge",
            log.c.body.like('%"accepted":false%'),
        )
        with (
            engine.connect() as conn,
            conn.execution_options(yield_per=10_000).execute(query) as result,
        ):
            for (body,) in result:
                data = orjson.loads(body)["data"]
                i = index.get(int(data["day"]))
                if i is None:
                    continue
                reason = str(data["reason"])
                refused.setdefault(reason, [0] * days)[i] += 1
                by_use_case[f"{data['use_case']}/{reason}"][i] += 1
    return Activity(
        days=[day_date(d).isoformat() for d in range(first, today + 1)],
        accepted=dict(sorted(accepted.items())),
        refused=refused,
        refused_by_use_case=dict(sorted(by_use_case.items())),
    )
