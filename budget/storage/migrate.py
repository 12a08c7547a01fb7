"""Fold ledgers of the per-budget layouts into one account row per device (migration 0002).

Two layouts that came before release 0.1 are recognised; migration 0002 upgrades either in the
migration's transaction (a database is either wholly migrated or untouched):

- **per budget, packed** (``accounts`` keyed by device and budget, slots without a group size):
  each device's rows are folded into one state; a day's counts are kept per slot.
- **per budget, in tables** (``daily_spend`` and ``lifetime_totals`` beside ``accounts``): each
  device's days are rebuilt per use case from the charges held (the retention purge kept those
  and ``daily_spend`` in step) and its lifetime multiset from ``lifetime_totals``; both tables
  and the old covering index are dropped, and ``charges`` is indexed by day.

Neither layout recorded the group size a charge was made at. A charge still held in
``charges`` (tables layout) takes its own policy version's; every other count takes the largest
group size any version of its use case had at that epsilon (never understating a group's loss).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import Connection, inspect, text

from dp_governor.budget.rule.state import AccountState, state_columns
from dp_governor.budget.storage.db import raw_cursor

__all__ = ["is_per_budget", "per_device_states", "write_accounts"]


def is_per_budget(conn: Connection) -> bool:
    """Whether ``accounts`` is one of the per-budget layouts (it has a ``budget`` column)."""
    inspector = inspect(conn)
    if not inspector.has_table("accounts"):
        return False
    return "budget" in {c["name"] for c in inspector.get_columns("accounts")}


def per_device_states(conn: Connection) -> dict[str, AccountState]:
    """Each device's state, folded from either per-budget layout (read only)."""
    sizes = _group_sizes(conn)
    if inspect(conn).has_table("daily_spend"):
        return _from_tables(conn, sizes)
    return _from_packed(conn, sizes)


def write_accounts(conn: Connection, states: dict[str, AccountState]) -> None:
    """Insert the per-device rows into a new, empty ``accounts``; mark the upgrade.

    The audit chain of an earlier release does not describe these rows: ``ledger_upgrades``
    says so, so that ``verify`` does not compare them with it
    (:mod:`dp_governor.budget.audit.verify`).
    """
    if states:
        ph = ", ".join(["?" if conn.dialect.paramstyle == "qmark" else "%s"] * 6)
        cursor = raw_cursor(conn)
        cursor.executemany(
            "INSERT INTO accounts (device_key, count, epsilon_micro, days, lifetime,"
            f" oldest_day) VALUES ({ph})",
            [(dk, *state_columns(s)) for dk, s in sorted(states.items())],
        )
    conn.execute(text("CREATE TABLE IF NOT EXISTS ledger_upgrades (at TEXT, layout TEXT)"))
    conn.execute(
        text("INSERT INTO ledger_upgrades VALUES (:at, :layout)"),
        {"at": datetime.now(UTC).isoformat(), "layout": "per-budget accounts"},
    )


class _Sizes:
    """The group size of each policy version, and the largest per (use case, epsilon)."""

    def __init__(self) -> None:
        self.of_version: dict[tuple[str, int], int] = {}
        self.largest: dict[tuple[str, int], int] = {}
        self.largest_any: dict[str, int] = {}

    def add(self, name: str, version: int, eps: int, size: int) -> None:
        self.of_version[(name, version)] = size
        self.largest[(name, eps)] = max(self.largest.get((name, eps), 1), size)
        self.largest_any[name] = max(self.largest_any.get(name, 1), size)

    def for_lifetime(self, name: str, eps: int) -> int:
        """The largest group size ``name`` had at ``eps`` (or at any epsilon; else 1)."""
        return self.largest.get((name, eps), self.largest_any.get(name, 1))


def _group_sizes(conn: Connection) -> _Sizes:
    sizes = _Sizes()
    for name, version, eps, size in conn.execute(
        text("SELECT name, version, epsilon_per_report, group_size FROM policies")
    ):
        sizes.add(str(name), int(version), round(float(eps) * 1_000_000), int(size))
    return sizes


def _held_days(conn: Connection, sizes: _Sizes, states: dict[str, AccountState]) -> None:
    """Count every charge held in its device's days, at its own version's group size."""
    for dk, use_case, version, eps, day, count in conn.execute(
        text(
            "SELECT device_key, use_case, policy_version, epsilon_micro, day, COUNT(*)"
            " FROM charges GROUP BY device_key, use_case, policy_version, epsilon_micro, day"
        )
    ):
        size = sizes.of_version.get((str(use_case), int(version)), 1)
        states[str(dk)].add(str(use_case), int(day), int(eps), size, int(count))


def _from_tables(conn: Connection, sizes: _Sizes) -> dict[str, AccountState]:
    """Per-device states from ``accounts`` totals, ``lifetime_totals`` and held charges."""
    states: dict[str, AccountState] = defaultdict(AccountState)
    for dk, count, eps in conn.execute(
        text("SELECT device_key, count, epsilon_micro FROM accounts")
    ):
        state = states[str(dk)]
        state.count += int(count)
        state.epsilon_micro += int(eps)
    for dk, use_case, eps, count in conn.execute(
        text(
            "SELECT device_key, use_case, epsilon_micro, count FROM lifetime_totals"
            " ORDER BY device_key, use_case, epsilon_micro"
        )
    ):
        _add_lifetime(states[str(dk)], str(use_case), int(eps), sizes, int(count))
    _held_days(conn, sizes, states)
    return dict(states)


def _from_packed(conn: Connection, sizes: _Sizes) -> dict[str, AccountState]:
    """Per-device states from per-budget packed rows (slots ``[use case, eps, reports]``)."""
    states: dict[str, AccountState] = defaultdict(AccountState)
    rows = conn.execute(
        text(
            "SELECT device_key, count, epsilon_micro, days, lifetime FROM accounts"
            " ORDER BY device_key, budget"
        )
    )
    for dk, count, eps, days_text, lifetime_text in rows:
        state = states[str(dk)]
        state.count += int(count)
        state.epsilon_micro += int(eps)
        old_slots: list[list[Any]] = orjson.loads(lifetime_text)
        new_index = []
        for use_case, slot_eps, n in old_slots:
            size = sizes.for_lifetime(str(use_case), int(slot_eps))
            new_index.append((str(use_case), int(slot_eps), size))
            _add_lifetime(state, str(use_case), int(slot_eps), sizes, int(n))
        day = 0
        for entry in orjson.loads(days_text):
            day += int(entry[0])
            for i, n in enumerate(entry[1:]):
                if n:
                    use_case, slot_eps, size = new_index[i]
                    state.add(use_case, day, slot_eps, size, int(n))
    return dict(states)


def _add_lifetime(state: AccountState, use_case: str, eps: int, sizes: _Sizes, n: int) -> None:
    slot = state.slots[state.slot(use_case, eps, sizes.for_lifetime(use_case, eps))]
    slot[3] = int(slot[3]) + n
