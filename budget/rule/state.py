"""One device's state, packed into its ``accounts`` row: every use case it ever reported to.

The gate reads and writes one row per device and report: the lifetime totals, what each recent
day spent per slot (for the daily and window caps, and the window accounting) and the lifetime
multiset per slot (for the accountant). A slot is a (use case, micro-epsilon per report, group
size, budget) the device was ever charged at: the terms in force when each charge was made and
the budget it was charged under, so that a later policy edit never changes what an earlier
charge counts for. Which slots a budget's caps count is the policy book's business
(:mod:`dp_governor.budget.rule.book`), not the row's: a group move changes no row. Separate tables
per concern would be separate random-key B-trees, and at a production ledger's size every report
would dirty one page of each; one row is one page. Pure code, no I/O.

Packing (compact JSON, readable in ``sqlite3`` and ``psql``):

- ``lifetime``: the slots ``[[use_case, micro-epsilon, group size, reports, budget], ...]`` in
  the order they were first charged, with their lifetime count. No timestamps; it survives
  retention. Rows written before budgets were recorded hold four-element slots: they decode
  with the budget :data:`ANY_BUDGET`, which every budget their use case ever drew from counts.
- ``days``: ``[[day, n_0, n_1, ...], ...]`` in ascending day order, ``n_i`` the reports of slot
  ``i`` that day (trailing zeros left out); the first entry's day is absolute, every later one
  is the difference to the entry before it. A slot's days on or before its use case's
  retention horizon are cleared whenever the row is written, and by the daily purge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import orjson

__all__ = [
    "ANY_BUDGET",
    "AccountState",
    "Counted",
    "Slot",
    "decode",
    "lifetime_counts",
    "window_counts",
]

Slot = tuple[str, int, int, str]  # use case, micro-epsilon per report, group size, budget
ANY_BUDGET = ""  # a slot charged before budgets were recorded: counted by all its use case had
_NONE = -(1 << 62)


class Counted(Protocol):
    """Which slots a budget counts (:class:`dp_governor.budget.rule.book.Terms` is one)."""

    @property
    def budget(self) -> str:
        """The budget's name (a charge records it)."""

    @property
    def members(self) -> frozenset[str]:
        """The use cases that draw from the budget now (their whole history counts)."""

    @property
    def ever_members(self) -> frozenset[str]:
        """Every use case that ever drew from the budget."""


@dataclass(slots=True)
class AccountState:
    """A decoded ``accounts`` row; ``days`` hold absolute days here."""

    count: int = 0
    epsilon_micro: int = 0
    days: list[list[int]] = field(default_factory=list)
    slots: list[list[str | int]] = field(default_factory=list)

    def members(self, use_cases: frozenset[str]) -> list[int]:
        """The indices of the slots of ``use_cases``, whatever budget they were charged under."""
        return [i for i, slot in enumerate(self.slots) if slot[0] in use_cases]

    def counted(self, terms: Counted) -> list[int]:
        """The indices of the slots a budget's caps and filters count.

        A slot counts if its use case draws from the budget now (``members``: its whole
        history goes with it), or if it was charged under the budget (whatever its use case
        did since), or if it predates recorded budgets and its use case ever drew from it.

        >>> from types import SimpleNamespace as T
        >>> slots = [["a", 1, 1, 1, "g"], ["a", 1, 1, 1, "a"], ["b", 1, 1, 1, ""]]
        >>> group = T(budget="g", members=frozenset(), ever_members=frozenset({"a", "b"}))
        >>> AccountState(slots=slots).counted(group)
        [0, 2]
        """
        members, budget, ever = terms.members, terms.budget, terms.ever_members
        return [
            i
            for i, slot in enumerate(self.slots)
            if slot[0] in members
            or slot[4] == budget
            or (slot[4] == ANY_BUDGET and slot[0] in ever)
        ]

    def reports_on(self, day: int, idx: list[int]) -> int:
        """The reports of slots ``idx`` on ``day`` (the daily cap)."""
        for entry in reversed(self.days):
            if entry[0] == day:
                width = len(entry)
                return sum(entry[i + 1] for i in idx if i + 1 < width)
            if entry[0] < day:
                break
        return 0

    def today(self, day: int, idx: list[int]) -> tuple[int, int]:
        """``(reports, micro-epsilon)`` of slots ``idx`` on ``day``."""
        for entry in reversed(self.days):
            if entry[0] == day:
                slots, width = self.slots, len(entry)
                n = [(entry[i + 1], int(slots[i][1])) for i in idx if i + 1 < width]
                return sum(c for c, _ in n), sum(c * e for c, e in n)
            if entry[0] < day:
                break
        return 0, 0

    def use_case_today(self, day: int, use_case: str) -> tuple[int, int]:
        """``(reports, micro-epsilon)`` of ``use_case`` on ``day``, whatever terms and budget.

        After an acceptance, the charge's ordinal among the use case's charges that day and the
        device's spend on it so far (a transparency-log leaf's label and ``spent``).

        >>> state = AccountState(days=[[5, 1, 2], [6, 0, 1]], slots=[["a", 3, 1, 1, "a"],
        ...     ["b", 2, 1, 3, "b"]])
        >>> state.use_case_today(5, "b"), state.use_case_today(6, "b"), state.use_case_today(7, "a")
        ((2, 4), (1, 2), (0, 0))
        """
        days = self.days
        entry = days[-1] if days and days[-1][0] == day else self._held(day)
        slots = self.slots
        n = spent = 0
        for i in range(1, len(entry)):  # one pass over the day's counts (the gate's hot path)
            count = entry[i]
            if count and slots[i - 1][0] == use_case:
                n += count
                spent += count * int(slots[i - 1][1])
        return n, spent

    def first_countable_day(
        self, use_case: str, horizons: Mapping[str, int], idx: list[int] | None = None
    ) -> int:
        """The first day a new charge of ``use_case`` can be dated on and its limits counted.

        The day of the latest charge of slots ``idx`` (the slots the report's limits read;
        ``None``: every slot, as a device-wide budget reads), since each check counts the window
        ending on the charge's day and would leave a later day's windows unchecked; and after
        the horizon of each of those slots' use cases and of ``use_case`` itself (a purge
        deleted those days: what they held can no longer be counted, and a charge dated there
        would be deleted at once).

        >>> state = AccountState(days=[[9, 1], [12, 0, 1]],
        ...     slots=[["a", 5, 1, 4, "a"], ["b", 5, 1, 1, "b"]])
        >>> state.first_countable_day("a", {"a": 3}, [0]), state.first_countable_day("a", {}, None)
        (9, 12)
        >>> state.first_countable_day("c", {"a": 3, "c": 10}, [0])
        11
        """
        slots = self.slots
        chosen = range(len(slots)) if idx is None else idx
        first = _NONE
        for entry in reversed(self.days):
            width = len(entry)
            if any(entry[i + 1] for i in chosen if i + 1 < width):
                first = entry[0]
                break
        horizon = horizons.get(use_case, _NONE)
        for i in chosen:
            horizon = max(horizon, horizons.get(str(slots[i][0]), _NONE))
        return max(first, horizon + 1)

    def _held(self, day: int) -> list[int]:
        """The entry of ``day`` if held, else an empty one (not added)."""
        for entry in self.days:
            if entry[0] == day:
                return entry
        return [day]

    def window(
        self, day: int, retention: int, idx: list[int], horizons: Mapping[str, int]
    ) -> list[tuple[int, int]]:
        """``(day, micro-epsilon)`` of slots ``idx`` on days ``day - retention + 1 .. day``.

        A slot's days on or before its use case's horizon (deleted by retention) are not held.
        Where the window reaches back past the horizon, the deleted days' spend is unknown: it
        counts as all the slot's spend not held (its lifetime count less its held days), on the
        horizon's day, an upper bound (:meth:`unheld`).
        """
        low = day - retention
        slots = self.slots
        lows = [max(low, horizons.get(str(slots[i][0]), _NONE)) for i in idx]
        eps = [int(slots[i][1]) for i in idx]
        out = []
        for entry in self.days:
            d = entry[0]
            if low < d <= day:
                width = len(entry)
                spent = sum(
                    entry[i + 1] * e
                    for i, e, lo in zip(idx, eps, lows, strict=True)
                    if i + 1 < width and d > lo
                )
                if spent:
                    out.append((d, spent))
        if any(lo > low for lo in lows):
            out.extend(
                (h, n * int(slots[i][1])) for h, i, n in self.unheld(day, low, idx, horizons)
            )
        return out

    def unheld(
        self, day: int, low: int, idx: list[int], horizons: Mapping[str, int]
    ) -> list[tuple[int, int, int]]:
        """``(horizon, slot, reports)``: spend a window after ``low`` may hold but no day does.

        A purge deletes a use case's days through its horizon. A window that reaches back past
        the horizon (``low < horizon``: retention raised beyond what was kept, or a budget
        whose window is longer than a member's history) cannot know how much of the deleted
        spend fell inside it; all of it may have, so each such slot's reports not held on any
        day after the horizon are returned, dated on the horizon (the last day they can be on,
        so they leave the window last). A true upper bound, exact when nothing was deleted.

        >>> state = AccountState(days=[[9, 1]], slots=[["a", 5, 1, 4, "a"]])
        >>> state.unheld(10, 2, [0], {"a": 6})
        [(6, 0, 3)]
        """
        out = []
        for i in idx:
            horizon = horizons.get(str(self.slots[i][0]), _NONE)
            if not low < horizon <= day:
                continue
            held = sum(e[i + 1] for e in self.days if e[0] > horizon and i + 1 < len(e))
            missing = int(self.slots[i][3]) - held
            if missing > 0:
                out.append((horizon, i, missing))
        return out

    def window_spend(
        self, day: int, retention: int, idx: list[int], horizons: Mapping[str, int]
    ) -> int:
        """The micro-epsilon of slots ``idx`` in the window ending on ``day``."""
        return sum(e for _, e in self.window(day, retention, idx, horizons))

    def lifetime_spend(self, idx: list[int]) -> int:
        """The lifetime micro-epsilon of slots ``idx``."""
        slots = self.slots
        return sum(int(slots[i][1]) * int(slots[i][3]) for i in idx)

    def scaled_window(
        self, day: int, window: int, idx: list[int], horizons: Mapping[str, int]
    ) -> list[tuple[int, int, int]]:
        """``(day, S1, S2)`` of slots ``idx`` per day of ``day - window + 1 .. day``.

        Group-scaled: a report of ``e`` micro-epsilon at group size ``g`` adds ``g e`` to
        ``S1`` and ``(g e)^2`` to ``S2`` (what the device-wide budget and the filters count).
        A slot's days on or before its use case's horizon are not held; a window reaching past
        the horizon counts the slot's unheld reports on the horizon's day (:meth:`unheld`).
        """
        low = day - window
        weights = [(i, int(self.slots[i][1]) * int(self.slots[i][2])) for i in idx]
        lows = [max(low, horizons.get(str(self.slots[i][0]), _NONE)) for i, _ in weights]
        out = []
        for entry in self.days:
            d = entry[0]
            if not low < d <= day:
                continue
            s1 = s2 = 0
            for (i, w), lo in zip(weights, lows, strict=True):
                n = entry[i + 1] if i + 1 < len(entry) else 0
                if n and d > lo:
                    s1 += n * w
                    s2 += n * w * w
            if s1:
                out.append((d, s1, s2))
        if any(lo > low for lo in lows):
            for h, i, n in self.unheld(day, low, idx, horizons):
                w = int(self.slots[i][1]) * int(self.slots[i][2])
                out.append((h, n * w, n * w * w))
        return out

    def scaled_lifetime(self, idx: list[int]) -> tuple[int, int, int]:
        """``(reports, S1, S2)`` of slots ``idx`` over the lifetime, group-scaled.

        The slots' lifetime counts are a sufficient statistic: ``S1 = sum n_i g_i e_i`` and
        ``S2 = sum n_i (g_i e_i)^2`` over slots, exact integers whatever their size.

        >>> slots = [["a", 50_000, 1, 3, "a"], ["b", 100_000, 2, 1, "b"]]
        >>> AccountState(slots=slots).scaled_lifetime([0, 1])
        (4, 350000, 47500000000)
        """
        n = s1 = s2 = 0
        for i in idx:
            _, eps, group, count, _ = self.slots[i]
            w = int(eps) * int(group)
            n += int(count)
            s1 += int(count) * w
            s2 += int(count) * w * w
        return n, s1, s2

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

    def slot(self, use_case: str, eps: int, group_size: int = 1, budget: str = ANY_BUDGET) -> int:
        """The index of the (use case, epsilon, group size, budget) slot, added if new."""
        for i, (uc, e, g, _, b) in enumerate(self.slots):
            if e == eps and uc == use_case and g == group_size and b == budget:
                return i
        self.slots.append([use_case, eps, group_size, 0, budget])
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

    def add(
        self,
        use_case: str,
        day: int,
        eps: int,
        group_size: int = 1,
        reports: int = 1,
        budget: str = ANY_BUDGET,
    ) -> int:
        """Count ``reports`` on ``day`` in the day entries only; the slot's index."""
        i = self.slot(use_case, eps, group_size, budget)
        entry = self._day(day)
        if len(entry) <= i + 1:
            entry.extend([0] * (i + 2 - len(entry)))
        entry[i + 1] += reports
        return i

    def charge(
        self,
        use_case: str,
        day: int,
        eps: int,
        group_size: int = 1,
        reports: int = 1,
        budget: str = ANY_BUDGET,
    ) -> None:
        """Count ``reports`` of ``eps`` (at ``group_size``, under ``budget``) on ``day``."""
        self.count += reports
        self.epsilon_micro += eps * reports
        slot = self.slots[self.add(use_case, day, eps, group_size, reports, budget)]
        slot[3] = int(slot[3]) + reports

    def prune(self, through: Mapping[str, int]) -> int:
        """Clear each slot's days on or before ``through[use case]``; the counts cleared.

        Day entries left with no count are dropped. Lifetime counts are kept.
        """
        if not self.days or not through:
            return 0
        limits = [through.get(str(slot[0]), _NONE) for slot in self.slots]
        if self.days[0][0] > max(limits, default=_NONE):
            return 0
        cleared = 0
        keep = []
        for entry in self.days:
            d = entry[0]
            for i in range(1, len(entry)):
                if entry[i] and d <= limits[i - 1]:
                    entry[i] = 0
                    cleared += 1
            if any(entry[1:]):
                keep.append(entry)
        self.days = keep
        return cleared

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
    slots: list[list[str | int]] = orjson.loads(lifetime)
    for slot in slots:
        if len(slot) == 4:  # written before budgets were recorded
            slot.append(ANY_BUDGET)
    return AccountState(int(count), int(epsilon_micro), absolute, slots)


def window_counts(
    state: AccountState, day: int, retention: Mapping[str, int], horizons: Mapping[str, int]
) -> dict[Slot, int]:
    """``{(use case, micro-epsilon, group size, budget): reports}`` in each use case's window.

    Only use cases in ``retention`` count; a slot's days on or before its use case's horizon
    are not held, and a window reaching back past the horizon counts the slot's unheld
    reports (:meth:`AccountState.unheld`, an upper bound). One pass over the days (the
    population reports call this once per device).
    """
    counts: dict[Slot, int] = {}
    keys: list[Slot | None] = []
    lows: list[int] = []
    past: list[int] = []  # slots whose window reaches back past their horizon
    for i, (use_case, eps, group, _, budget) in enumerate(state.slots):
        keep = retention.get(str(use_case))
        keys.append(None if keep is None else (str(use_case), int(eps), int(group), str(budget)))
        horizon = horizons.get(str(use_case), _NONE)
        lows.append(max(day - (keep or 0), horizon))
        if keep is not None and day - keep < horizon:
            past.append(i)
    for entry in state.days:
        d = entry[0]
        if d > day:
            continue
        for i, n in enumerate(entry[1:]):
            key = keys[i]
            if n and key is not None and d > lows[i]:
                counts[key] = counts.get(key, 0) + n
    for i in past:
        key = keys[i]
        assert key is not None
        low = day - retention[key[0]]
        for _, _, n in state.unheld(day, low, [i], horizons):
            counts[key] = counts.get(key, 0) + n
    return counts


def lifetime_counts(state: AccountState) -> dict[Slot, int]:
    """``{(use case, micro-epsilon, group size, budget): reports}`` over the device's lifetime."""
    counts: dict[Slot, int] = defaultdict(int)
    for use_case, eps, group, n, budget in state.slots:
        if n:
            counts[(str(use_case), int(eps), int(group), str(budget))] += int(n)
    return dict(counts)


def state_columns(state: AccountState) -> tuple[int, int, str, str, int | None]:
    """The written columns of a state: count, micro-epsilon, days, lifetime, oldest day."""
    return (
        state.count,
        state.epsilon_micro,
        state.encode_days(),
        state.encode_lifetime(),
        state.oldest_day,
    )
