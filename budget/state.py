"""One device's state against one budget, packed into its ``accounts`` row.

The gate reads and writes one row per (device, budget) and report: the lifetime totals, what
each recent day spent per use case (for the daily and window caps, and the per-device window
accounting) and the lifetime multiset per use case (for the accountant). Separate tables for
each would be separate random-key B-trees, and at a production ledger's size every report would
dirty one page of each (about 4 KiB of WAL per tree per report); one row is one page. Pure
code, no I/O: the gate, the batch path, the purge, the ledger's readers and the views decode and
encode through here.

Packing (compact JSON, readable in ``sqlite3`` and ``psql``), small enough that a device that
reports every day of a 90-day window stays inside one SQLite page (no overflow page to rewrite):

- ``lifetime``: the slots ``[[use_case, micro-epsilon per report, reports], ...]`` in the order
  they were first charged: every (use case, epsilon) this budget was ever charged at, with its
  lifetime count. No timestamps; it survives retention.
- ``days``: ``[[day, n_0, n_1, ...], ...]`` in ascending day order, ``n_i`` the reports of slot
  ``i`` that day (trailing zeros left out); the first entry's day is absolute, every later one
  is the difference to the entry before it. Days past the budget's retention window are pruned
  whenever the row is written, and by the daily purge for devices that stop reporting.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

__all__ = ["AccountState", "decode", "lifetime_counts", "window_counts"]


@dataclass(slots=True)
class AccountState:
    """A decoded ``accounts`` row; ``days`` hold absolute days here."""

    count: int = 0
    epsilon_micro: int = 0
    days: list[list[int]] = field(default_factory=list)
    slots: list[list[str | int]] = field(default_factory=list)

    def _eps(self, entry: list[int]) -> int:
        slots = self.slots
        return sum(n * int(slots[i][1]) for i, n in enumerate(entry[1:]) if n)

    def reports_on(self, day: int) -> int:
        """The reports counted on ``day`` (the gate's daily cap)."""
        for entry in reversed(self.days):
            if entry[0] == day:
                return sum(entry) - day
            if entry[0] < day:
                break
        return 0

    def today(self, day: int) -> tuple[int, int]:
        """``(reports, micro-epsilon)`` spent on ``day``."""
        for entry in reversed(self.days):
            if entry[0] == day:
                return sum(entry[1:]), self._eps(entry)
            if entry[0] < day:
                break
        return 0, 0

    def window(self, day: int, retention: int) -> list[tuple[int, int]]:
        """``(day, micro-epsilon)`` spends on days ``day - retention + 1 .. day``."""
        low = day - retention
        return [(e[0], self._eps(e)) for e in self.days if low < e[0] <= day]

    def window_spend(self, day: int, retention: int) -> int:
        """The micro-epsilon spent in the window ending on ``day``."""
        return sum(e for _, e in self.window(day, retention))

    def use_case_window(self, use_case: str, day: int, retention: int) -> dict[int, int]:
        """``{micro-epsilon per report: reports}`` of ``use_case`` in the window up to ``day``."""
        low = day - retention
        mine = [(i + 1, int(slot[1])) for i, slot in enumerate(self.slots) if slot[0] == use_case]
        out: dict[int, int] = {}
        for entry in self.days:
            if low < entry[0] <= day:
                width = len(entry)
                for j, eps in mine:
                    if j < width and entry[j]:
                        out[eps] = out.get(eps, 0) + entry[j]
        return out

    def daily(self) -> dict[str, dict[int, tuple[int, int]]]:
        """``{use_case: {day: (reports, micro-epsilon)}}`` of every day held."""
        out: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
        for entry in self.days:
            for i, n in enumerate(entry[1:]):
                if n:
                    use_case, eps = str(self.slots[i][0]), int(self.slots[i][1])
                    count, total = out[use_case].get(entry[0], (0, 0))
                    out[use_case][entry[0]] = (count + n, total + n * eps)
        return dict(out)

    def slot(self, use_case: str, eps: int) -> int:
        """The index of the (use case, epsilon) slot, added if new."""
        for i, (uc, e, _) in enumerate(self.slots):
            if e == eps and uc == use_case:
                return i
        self.slots.append([use_case, eps, 0])
        return len(self.slots) - 1

    def _day(self, day: int) -> list[int]:
        """The entry of ``day``, added if new."""
        days = self.days
        if days and days[-1][0] == day:
            return days[-1]
        for entry in days:
            if entry[0] == day:
                return entry
        entry = [day]
        days.append(entry)
        if len(days) > 1 and days[-2][0] > day:  # only if the clock was set back
            days.sort()
        return entry

    def add(self, use_case: str, day: int, eps: int, reports: int = 1) -> int:
        """Count ``reports`` on ``day`` in the day entries only; the slot's index."""
        i = self.slot(use_case, eps)
        entry = self._day(day)
        if len(entry) <= i + 1:
            entry.extend([0] * (i + 2 - len(entry)))
        entry[i + 1] += reports
        return i

    def charge(self, use_case: str, day: int, eps: int, retention: int, reports: int = 1) -> None:
        """Count ``reports`` of ``eps`` for ``use_case`` on ``day``; prune days out of window."""
        self.count += reports
        self.epsilon_micro += eps * reports
        slot = self.slots[self.add(use_case, day, eps, reports)]
        slot[2] = int(slot[2]) + reports
        if self.days[0][0] <= day - retention:
            self.prune(day - retention)

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
        """The ``days`` column: days as differences, trailing zero counts left out."""
        packed = []
        previous = 0
        for entry in self.days:
            counts = entry[1:]
            while counts and not counts[-1]:
                counts = counts[:-1]
            packed.append([entry[0] - previous, *counts])
            previous = entry[0]
        return orjson.dumps(packed).decode()

    def encode_lifetime(self) -> str:
        """The ``lifetime`` column (the slots)."""
        return orjson.dumps(self.slots).decode()


def decode(count: int, epsilon_micro: int, days: str, lifetime: str) -> AccountState:
    """An ``accounts`` row's state."""
    absolute: list[list[int]] = []
    day = 0
    for entry in orjson.loads(days):
        day += entry[0]
        absolute.append([day, *entry[1:]])
    return AccountState(int(count), int(epsilon_micro), absolute, orjson.loads(lifetime))


def window_counts(
    states: Iterable[AccountState], day: int, retention: Mapping[str, int]
) -> dict[tuple[str, int], int]:
    """``{(use case, micro-epsilon): reports}`` in each use case's window, over one device.

    Only use cases in ``retention`` count; a use case can span accounts (it joined a group).
    One pass over each account's days (the population reports call this once per device).
    """
    counts: dict[tuple[str, int], int] = {}
    for state in states:
        keys: list[tuple[str, int] | None] = []
        lows: list[int] = []
        for use_case, eps, _ in state.slots:
            keep = retention.get(str(use_case))
            keys.append(None if keep is None else (str(use_case), int(eps)))
            lows.append(day - (keep or 0))
        for entry in state.days:
            d = entry[0]
            if d > day:
                continue
            for i, n in enumerate(entry[1:]):
                key = keys[i]
                if n and key is not None and d > lows[i]:
                    counts[key] = counts.get(key, 0) + n
    return counts


def lifetime_counts(states: Iterable[AccountState]) -> dict[tuple[str, int], int]:
    """``{(use case, micro-epsilon): reports}`` over one device's lifetime, across its accounts."""
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for state in states:
        for use_case, eps, n in state.slots:
            if n:
                counts[(str(use_case), int(eps))] += int(n)
    return dict(counts)
