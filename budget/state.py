"""One device's state against one budget, packed into its ``accounts`` row.

The gate reads and writes one row per (device, budget) and report: the lifetime totals, the
spend of each recent day (for the daily and window caps) and the lifetime multiset per use case
(for the accountant). Separate tables for each would be separate random-key B-trees, and at a
production ledger's size every report would dirty one page of each (about 4 KiB of WAL per tree
per report); one row is one page. Pure code, no I/O: the gate, the batch path, the purge and the
views decode and encode through here.

Packing (compact JSON, readable in ``sqlite3`` and ``psql``):

- ``days``: ``[[day, reports, micro-epsilon], ...]`` in ascending day order; days past the
  budget's retention window are pruned whenever the row is written (and by the daily purge for
  devices that stop reporting), so the row never holds a day the window no longer needs.
- ``lifetime``: ``{use_case: [[micro-epsilon, reports], ...]}`` with epsilons ascending: the
  multiset the accountant composes. It carries no time and survives retention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

__all__ = ["AccountState", "decode"]


@dataclass(slots=True)
class AccountState:
    """A decoded ``accounts`` row: lifetime totals, recent days and the lifetime multiset."""

    count: int = 0
    epsilon_micro: int = 0
    days: list[list[int]] = field(default_factory=list)
    lifetime: dict[str, list[list[int]]] = field(default_factory=dict)

    def today(self, day: int) -> tuple[int, int]:
        """``(reports, micro-epsilon)`` spent on ``day``."""
        if self.days and self.days[-1][0] == day:
            return self.days[-1][1], self.days[-1][2]
        for d, n, e in self.days:
            if d == day:
                return n, e
        return 0, 0

    def window(self, day: int, retention: int) -> list[tuple[int, int]]:
        """``(day, micro-epsilon)`` spends on days ``day - retention + 1 .. day``."""
        low = day - retention
        return [(d, e) for d, _, e in self.days if low < d <= day]

    def window_spend(self, day: int, retention: int) -> int:
        """The micro-epsilon spent in the window ending on ``day``."""
        low = day - retention
        return sum(e for d, _, e in self.days if low < d <= day)

    def charge(self, use_case: str, day: int, eps: int, retention: int, reports: int = 1) -> None:
        """Count ``reports`` of ``eps`` for ``use_case`` on ``day``; prune days out of window."""
        self.count += reports
        self.epsilon_micro += eps * reports
        days = self.days
        if days and days[-1][0] == day:
            days[-1][1] += reports
            days[-1][2] += eps * reports
        else:
            for entry in days:
                if entry[0] == day:  # a day before the latest (a clock set back): rare
                    entry[1] += reports
                    entry[2] += eps * reports
                    break
            else:
                days.append([day, reports, eps * reports])
                days.sort()
        if days[0][0] <= day - retention:
            self.prune(day - retention)
        spends = self.lifetime.setdefault(use_case, [])
        for entry in spends:
            if entry[0] == eps:
                entry[1] += reports
                break
        else:
            spends.append([eps, reports])
            spends.sort()

    def prune(self, through: int) -> int:
        """Drop the days up to and including ``through``; how many were dropped."""
        keep = [entry for entry in self.days if entry[0] > through]
        dropped = len(self.days) - len(keep)
        self.days = keep
        return dropped

    @property
    def oldest_day(self) -> int | None:
        """The first day held (``None``: none), the purge's filter."""
        return self.days[0][0] if self.days else None

    def encode_days(self) -> str:
        """The ``days`` column."""
        return orjson.dumps(self.days).decode()

    def encode_lifetime(self) -> str:
        """The ``lifetime`` column."""
        return orjson.dumps(self.lifetime).decode()

    def lifetime_of(self, use_case: str) -> list[tuple[int, int]]:
        """``(micro-epsilon, reports)`` of ``use_case`` over the device's lifetime."""
        return [(e, n) for e, n in self.lifetime.get(use_case, [])]


def decode(count: int, epsilon_micro: int, days: str, lifetime: str) -> AccountState:
    """An ``accounts`` row's state."""
    return AccountState(int(count), int(epsilon_micro), orjson.loads(days), orjson.loads(lifetime))
