"""Audit entries as earlier releases wrote them, for tests of what later releases accept."""

from __future__ import annotations

from typing import Any

import orjson

from dp_governor.budget.audit.log import Entry
from dp_governor.budget.gate.charge import charge_entry

__all__ = ["entry_before_labels"]


def entry_before_labels(
    dk: str,
    decision: Any,
    terms: Any,
    idempotency: str | None = None,
    tally: tuple[int, int] | None = None,
) -> Entry:
    """A charge entry as the release before per-charge labels wrote it (no ``n``, no ``spent``).

    Takes :func:`~dp_governor.budget.gate.charge.charge_entry`'s arguments, so a test patches it
    into the gate in its place.
    """
    entry = charge_entry(dk, decision, terms, idempotency)
    data = orjson.loads(str(entry.data))
    del data["n"], data["spent"]
    return Entry(
        entry.actor, entry.action, orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()
    )
