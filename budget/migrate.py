"""Upgrade a ledger made before the packed account state (:mod:`budget.state`).

Earlier databases kept a device's days in ``daily_spend``, its lifetime multiset in
``lifetime_totals``, and read its charges through a covering index by device.
:func:`migrate_account_state` rebuilds every account's days per use case from the charges held
(the retention purge kept those and ``daily_spend`` in step), puts the lifetime multiset in the
accounts, drops the two tables and the covering index, and indexes ``charges`` by day, in one
transaction: a database is either wholly migrated or untouched. A use case's lifetime counts go
to the account of the budget its latest policy draws from (the old table did not record the
budget).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from sqlalchemy import Engine, inspect, text

from budget.db import placeholder, writer
from budget.gate import state_columns
from budget.state import AccountState

__all__ = ["migrate_account_state"]

log = logging.getLogger(__name__)


def migrate_account_state(engine: Engine) -> bool:
    """Fold ``daily_spend`` and ``lifetime_totals`` into ``accounts``; whether there was any."""
    if not inspect(engine).has_table("daily_spend"):
        return False
    ph = placeholder(engine)
    with writer(engine).begin() as conn:
        budgets: dict[str, str] = {}
        for name, group in conn.execute(
            text("SELECT name, budget_group FROM policies ORDER BY name, version")
        ):
            budgets[str(name)] = str(group or name)  # the latest version wins
        states: dict[tuple[str, str], AccountState] = defaultdict(AccountState)
        for dk, b, count, eps in conn.execute(
            text("SELECT device_key, budget, count, epsilon_micro FROM accounts")
        ):
            states[(dk, b)] = AccountState(int(count), int(eps))
        for dk, use_case, eps, count in conn.execute(
            text(
                "SELECT device_key, use_case, epsilon_micro, count FROM lifetime_totals"
                " ORDER BY device_key, use_case, epsilon_micro"
            )
        ):
            state = states[(dk, budgets.get(use_case, use_case))]
            slot = state.slots[state.slot(use_case, int(eps))]
            slot[2] = int(slot[2]) + int(count)
        for dk, b, use_case, eps, day, count in conn.execute(
            text(
                "SELECT device_key, budget, use_case, epsilon_micro, day, COUNT(*) FROM charges"
                " GROUP BY device_key, budget, use_case, epsilon_micro, day"
            )
        ):
            states[(dk, b)].add(use_case, int(day), int(eps), int(count))
        for column in (
            "days TEXT NOT NULL DEFAULT '[]'",
            "lifetime TEXT NOT NULL DEFAULT '[]'",
            "oldest_day INTEGER",
        ):
            conn.execute(text(f"ALTER TABLE accounts ADD COLUMN {column}"))
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.executemany(
            "INSERT INTO accounts (device_key, budget, count, epsilon_micro, days, lifetime,"
            f" oldest_day) VALUES ({', '.join([ph] * 7)}) ON CONFLICT (device_key, budget)"
            " DO UPDATE SET days = excluded.days, lifetime = excluded.lifetime,"
            " oldest_day = excluded.oldest_day",
            [(dk, b, *state_columns(s)) for (dk, b), s in states.items()],
        )
        conn.execute(text("DROP TABLE daily_spend"))
        conn.execute(text("DROP TABLE lifetime_totals"))
        conn.execute(text("DROP INDEX IF EXISTS ix_charges_use_case_device"))
        conn.execute(text("CREATE INDEX IF NOT EXISTS ix_charges_day ON charges (day)"))
    log.info("migrated %d accounts to the packed account state", len(states))
    return True
