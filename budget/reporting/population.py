"""The report's population figures in one streaming pass, in memory independent of devices.

Every population figure of the effective-epsilon report is a function of per-device values
(a device's spend per use case and per budget, its group-scaled total, its multiset of events).
:class:`SpendPass` reads spend rows grouped by device, folds each device's values into
histograms ``{value: devices}`` as soon as the device's last row has been read, and keeps
nothing else of it. Memory grows with the number of distinct values (spends are sums of a
few epsilons per report, so there are few), never with the number of devices. The maximum,
the counts over a cap and the quantiles computed from the histograms are exact, and two passes
over disjoint sets of devices merge exactly (:meth:`SpendPass.merge`: histograms add), so the
ledger may be read in chunks, or in partitions by device on several machines.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, Final

from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.state import ANY_BUDGET, Slot
from dp_governor.policies.model import from_micro

__all__ = ["COUNTS", "Events", "Row", "SpendPass", "Sums", "slot_rows"]

Row = tuple[str, str, int, int, int, str]  # device, use case, micro-eps, group, count, budget
Events = tuple[tuple[float, int], ...]  # a device's multiset: (epsilon, reports), sorted
_NONE: Final = ""
COUNTS: Final = "counts"  # the counters' key in a stored summary (:meth:`Sums.to_json`)


def slot_rows(dk: str, counts: dict[Slot, int]) -> list[Row]:
    """A device's ``{slot: reports}`` as its spend rows, in slot order.

    >>> slot_rows("d", {("b", 2, 1, "b"): 1, ("a", 5, 2, "a"): 3})
    [('d', 'a', 5, 2, 3, 'a'), ('d', 'b', 2, 1, 1, 'b')]
    """
    return [(dk, uc, e, g, n, b) for (uc, e, g, b), n in sorted(counts.items())]


def _less(have: Counter[Any], taken: Counter[Any]) -> None:
    """``have - taken`` in place, entries reaching 0 removed; a count below 0 raises."""
    for value, n in taken.items():
        left = have.get(value, 0) - n
        if left < 0:
            raise ValueError(f"a pass took out {n} devices at {value!r}, it held {left + n}")
        if left:
            have[value] = left
        else:
            have.pop(value, None)


def _less_each(have: dict[str, Counter[int]], taken: dict[str, Counter[int]]) -> None:
    """:func:`_less` per name; a name left with no devices is removed."""
    for name, counts in taken.items():
        mine = have.get(name, Counter())
        _less(mine, counts)
        if mine:
            have[name] = mine
        else:
            have.pop(name, None)


def _pairs(counts: Counter[int]) -> list[list[int]]:
    return [[v, n] for v, n in sorted(counts.items())]


class SpendPass:
    """Histograms of per-device spend, built from rows grouped by device (in key order).

    ``use_case[name]`` and ``budget[name]`` count the devices per micro-epsilon spent on the use
    case, or on what the budget's caps count (the slots the gate counts,
    :meth:`dp_governor.budget.rule.state.AccountState.counted`); ``totals`` per group-scaled
    micro-epsilon sum; ``ledgers`` per ``(multiset, grouped)``, ``grouped`` saying whether any
    event is scaled by a group size above 1; ``past_filter[name]`` the devices whose events a
    budget with a lifetime filter counts are past its target (what the filter's test reads:
    group-scaled ``S1`` and ``S2``; spend made before the filter was set can be).
    """

    def __init__(self, book: PolicyBook) -> None:
        budgets = {t.budget: t for t in book.terms.values()}
        self._budgets = frozenset(budgets)
        self._member_of: dict[str, set[str]] = defaultdict(set)  # budgets counting all of it
        self._filters = {  # budgets with a lifetime filter: its target
            name: t.filters.lifetime
            for name, t in budgets.items()
            if t.filters is not None and t.filters.lifetime is not None
        }
        self._ever_in: dict[str, set[str]] = defaultdict(set)  # budgets it ever drew from
        for name, t in budgets.items():
            for use_case in t.members:
                self._member_of[use_case].add(name)
            for use_case in t.ever_members:
                self._ever_in[use_case].add(name)
        self.use_case: dict[str, Counter[int]] = defaultdict(Counter)
        self.budget: dict[str, Counter[int]] = defaultdict(Counter)
        self.totals: Counter[int] = Counter()
        self.ledgers: Counter[tuple[Events, bool]] = Counter()
        self.past_filter: Counter[str] = Counter()
        self._dk = _NONE
        self._spent: dict[str, int] = {}
        self._in_budget: dict[str, int] = {}
        self._events: dict[int, int] = {}
        self._filtered: dict[str, tuple[int, int]] = {}  # this device's (S1, S2) per budget
        self._grouped = False

    def add(self, rows: Iterable[Row]) -> SpendPass:
        """Fold ``rows`` in; each device's rows must come together, devices in key order.

        Raises:
            ValueError: a device's rows came after a later device's (a merge would count
                it twice).
        """
        for dk, use_case, eps_micro, group, count, charged in rows:
            if dk != self._dk:
                if dk < self._dk:
                    raise ValueError(
                        f"spend rows must come grouped by device in key order: {dk!r} after"
                        f" {self._dk!r}"
                    )
                self._close()
                self._dk = dk
            spent = eps_micro * count
            self._spent[use_case] = self._spent.get(use_case, 0) + spent
            counting = self._member_of.get(use_case, set())
            if charged in self._budgets:
                counting = counting | {charged}
            elif charged == ANY_BUDGET:
                counting = counting | self._ever_in.get(use_case, set())
            for name in counting:
                self._in_budget[name] = self._in_budget.get(name, 0) + spent
            scaled = eps_micro * group
            if self._filters:
                for name in counting & self._filters.keys():
                    s1, s2 = self._filtered.get(name, (0, 0))
                    self._filtered[name] = (s1 + count * scaled, s2 + count * scaled * scaled)
            self._events[scaled] = self._events.get(scaled, 0) + count
            if group > 1 and count:
                self._grouped = True
        return self

    def finish(self) -> SpendPass:
        """Fold in the last device read; the pass is then complete (more rows may follow)."""
        self._close()
        return self

    def merge(self, other: SpendPass) -> SpendPass:
        """This pass and ``other`` (finished, over other devices) as one; exact."""
        self.finish()
        other.finish()
        for name, counts in other.use_case.items():
            self.use_case[name].update(counts)
        for name, counts in other.budget.items():
            self.budget[name].update(counts)
        self.totals.update(other.totals)
        self.ledgers.update(other.ledgers)
        self.past_filter.update(other.past_filter)
        return self

    def subtract(self, other: SpendPass) -> SpendPass:
        """This pass less ``other`` (finished, over some of the same devices' values); exact.

        Raises:
            ValueError: ``other`` holds a device this pass does not (the passes disagree).
        """
        self.finish()
        other.finish()
        _less_each(self.use_case, other.use_case)
        _less_each(self.budget, other.budget)
        _less(self.totals, other.totals)
        _less(self.ledgers, other.ledgers)
        _less(self.past_filter, other.past_filter)
        return self

    def to_json(self) -> dict[str, Any]:
        """The finished pass's histograms as JSON-ready lists, sorted (:meth:`of_json`)."""
        self.finish()
        return {
            "use_case": {n: _pairs(c) for n, c in sorted(self.use_case.items())},
            "budget": {n: _pairs(c) for n, c in sorted(self.budget.items())},
            "totals": _pairs(self.totals),
            "ledgers": [
                [[list(e) for e in multiset], grouped, n]
                for (multiset, grouped), n in sorted(self.ledgers.items())
            ],
            "past_filter": [[name, n] for name, n in sorted(self.past_filter.items())],
        }

    @classmethod
    def of_json(cls, book: PolicyBook, data: dict[str, Any]) -> SpendPass:
        """The finished pass :meth:`to_json` wrote, under ``book`` (the one it was built under).

        >>> from dp_governor.budget.rule.book import PolicyBook
        >>> book = PolicyBook.build([], {})
        >>> spend = SpendPass(book).add([("d", "a", 5, 2, 3, "a")]).finish()
        >>> SpendPass.of_json(book, spend.to_json()).ledgers == spend.ledgers
        True
        """
        out = cls(book)
        for name, pairs in data["use_case"].items():
            out.use_case[name] = Counter({int(v): int(n) for v, n in pairs})
        for name, pairs in data["budget"].items():
            out.budget[name] = Counter({int(v): int(n) for v, n in pairs})
        out.totals = Counter({int(v): int(n) for v, n in data["totals"]})
        out.ledgers = Counter(
            {
                (tuple((float(e), int(k)) for e, k in multiset), bool(grouped)): int(n)
                for multiset, grouped, n in data["ledgers"]
            }
        )
        out.past_filter = Counter({str(name): int(n) for name, n in data["past_filter"]})
        return out

    def _close(self) -> None:
        if not self._dk:
            return
        for name, spent in self._spent.items():
            self.use_case[name][spent] += 1
        for name, spent in self._in_budget.items():
            self.budget[name][spent] += 1
        events = self._events
        self.totals[sum(e * n for e, n in events.items())] += 1
        multiset = tuple((from_micro(e), n) for e, n in sorted(events.items()) if n)
        self.ledgers[(multiset, self._grouped)] += 1
        for name, (s1, s2) in self._filtered.items():
            if not self._filters[name].admits(s1, s2):
                self.past_filter[name] += 1
        self._dk = _NONE
        self._spent, self._in_budget, self._events, self._filtered = {}, {}, {}, {}
        self._grouped = False


class Sums:
    """Sums over a set of devices: named finished passes and integer counters.

    What a stored summary holds (:mod:`dp_governor.budget.reporting.summary`): each figure a sum
    over devices of a function of the device's state and the day, so sums over disjoint sets
    of devices add, and a set's sum less a subset's is the rest's; exact.
    """

    def __init__(self, passes: dict[str, SpendPass], counts: Counter[str] | None = None) -> None:
        self.passes = passes
        self.counts: Counter[str] = Counter() if counts is None else counts

    def merge(self, other: Sums) -> Sums:
        """These sums and ``other`` (over other devices) as one."""
        for name, spend in self.passes.items():
            spend.merge(other.passes[name])
        self.counts.update(other.counts)
        return self

    def subtract(self, other: Sums) -> Sums:
        """These sums less ``other`` (over some of the same devices).

        Raises:
            ValueError: ``other`` counts a device these sums do not (they disagree).
        """
        for name, spend in self.passes.items():
            spend.subtract(other.passes[name])
        _less(self.counts, other.counts)
        return self

    def copy(self, books: dict[str, PolicyBook]) -> Sums:
        """The same sums, each pass rebuilt under its book in ``books`` (``self`` left alone)."""
        passes = {name: SpendPass(books[name]).merge(s) for name, s in self.passes.items()}
        return Sums(passes, Counter(self.counts))

    def devices(self) -> int:
        """How many devices the sums count: the most any pass folded (a lifetime pass: all).

        >>> from dp_governor.budget.rule.book import PolicyBook
        >>> Sums({"w": SpendPass(PolicyBook.build([], {}))}).devices()
        0
        """
        return max((sum(p.totals.values()) for p in self.passes.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        """Each pass's :meth:`SpendPass.to_json` under its name, the counters under ``counts``."""
        out: dict[str, Any] = {name: s.to_json() for name, s in sorted(self.passes.items())}
        if self.counts:
            out[COUNTS] = dict(sorted(self.counts.items()))
        return out

    @classmethod
    def of_json(cls, books: dict[str, PolicyBook], data: dict[str, Any]) -> Sums:
        """The sums :meth:`to_json` wrote, each pass under its book in ``books``.

        >>> from dp_governor.budget.rule.book import PolicyBook
        >>> book = PolicyBook.build([], {})
        >>> sums = Sums({"w": SpendPass(book)}, Counter({"refused": 2}))
        >>> Sums.of_json({"w": book}, sums.to_json()).counts
        Counter({'refused': 2})
        """
        passes = {name: SpendPass.of_json(b, data[name]) for name, b in books.items()}
        return cls(passes, Counter({str(k): int(n) for k, n in data.get(COUNTS, {}).items()}))
