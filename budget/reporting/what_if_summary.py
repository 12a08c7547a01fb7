"""The what-if's device counts and passes, stored and brought up to date by what changed.

Every figure a what-if shows is a sum over devices of a function of (device state, day): the
(window, lifetime) passes under the current book and under the book with the proposal, each
side's devices in the window, refused their next report, over the window and the lifetime caps
(:func:`dp_governor.budget.reporting.views.what_if`), and the devices refused per use case,
side and budget (:func:`~dp_governor.budget.reporting.views.what_if_device_budget`). So they are
kept as the report's histograms are (:mod:`dp_governor.budget.reporting.summary`): a stored
summary advanced by subtracting the touched devices' old values and adding their new ones.

**What the functions read.** The digest (:meth:`PolicyWhatIf.key`) covers every policy version,
the device-wide budget in force and the proposal (the proposed book is built from them), so a
policy edit or a new device-wide budget makes the summary stale; each summary is stored under a
name holding its digest, and at most :data:`KEPT` of them are kept. The days each function reads
are, for every use case ``u``'s slots:

- the passes: ``u``'s window, its retention under the current book (the rows the report reads);
- the gate's rule (:func:`~dp_governor.budget.rule.decide.check`) on each side's terms: today
  (the daily caps, a window of 1 day; the device-wide budget's daily limits too), the budget's
  window and its window filter (``retention_days`` of the side's terms), the device-wide
  window and its filter (``window_days`` of the side's device-wide budget), and the lifetime
  (no day). The device-wide budget counts every slot, so today and its window are read over
  every use case's days; a budget counts the slots of the use cases that ever drew from it
  (:meth:`~dp_governor.budget.rule.state.AccountState.counted`: its members now, the slots
  charged under it, the slots from before budgets were recorded of a use case that drew from
  it; every one of them in ``ever_members``), so its window is read over theirs.

Those lengths are :meth:`PolicyWhatIf.windows` (:func:`_lengths`); the summary's day-moved set
covers each (a charge on a day that left or entered any of them, today included), and its
horizon condition each. The purge keeps a use case's days for the longest window any budget it
ever shared counts and the longest device-wide window, so the current book's windows never reach
past its horizons. A proposal whose windows do (retention or a device-wide window raised past
what was kept, a group joined whose members kept less) reads unheld spend that changes as the
purge deletes days, which no charge left finds: its summary is stale after each purge (a full
pass), exact either way.

The daily purge brings every stored what-if to its own day before it deletes anything
(:func:`advance_what_ifs`), rebuilding each measure from the proposal stored with it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import orjson
from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError

from dp_governor.budget.ledger import Ledger
from dp_governor.budget.reporting.measure import Fold, Measure, versions_digest
from dp_governor.budget.reporting.population import SpendPass, Sums, slot_rows
from dp_governor.budget.reporting.routing import RouteCheck, key_ends
from dp_governor.budget.reporting.summary import advance, brought_forward, stored_specs, summed
from dp_governor.budget.rule.book import PolicyBook, Terms
from dp_governor.budget.rule.decide import check
from dp_governor.budget.rule.state import AccountState, lifetime_counts, window_counts
from dp_governor.budget.storage.db import writer
from dp_governor.budget.storage.tables import ReportSummary
from dp_governor.policies.device import DeviceBudgetCreate, DeviceBudgetVersion, limits_of
from dp_governor.policies.model import Policy, PolicyCreate

__all__ = [
    "KEPT",
    "PREFIX",
    "SIDES",
    "DeviceWhatIf",
    "PolicyWhatIf",
    "Reads",
    "advance_what_ifs",
    "forwarded_sums",
    "what_if_sums",
]

PREFIX: Final = "what-if:"  # the stored what-ifs' names: the prefix, then the digest
KEPT: Final = 8  # stored what-ifs kept, the most recently computed
SIDES: Final = ("current", "proposed")
CHUNK: Final = 20_000  # accounts a read of a full pass
_SUMMARIES = ReportSummary.__table__  # type: ignore[attr-defined]
log = logging.getLogger("dpgov.reporting")


def _digest(book: PolicyBook, spec: dict[str, Any]) -> str:
    """The SHA-256 of the policy versions, the device-wide budget in force and ``spec``."""
    device = None if book.device is None else dataclasses.asdict(book.device)
    data = {"book": versions_digest(book), "device": device, "spec": spec}
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _lengths(terms: Sequence[Terms], use_case: str) -> set[int]:
    """The window lengths the gate's rule on ``terms`` reads ``use_case``'s days over.

    Today and the device-wide window (which count every slot); each budget's window and window
    filter where the budget counts the use case's slots, which only a budget it ever drew from
    does (:meth:`~dp_governor.budget.rule.state.AccountState.counted`: its members, the
    budget it was charged under, or before budgets were recorded every one it drew from).
    """
    out = {1}
    for t in terms:
        if t.device is not None:
            out.add(t.device.window_days or 1)
        if use_case in t.ever_members:
            out.add(t.retention_days)
            if t.filters is not None:
                out.add(t.filters.window_days)
    return out


class Reads:
    """A shard's route check (:class:`RouteCheck`) seeing each device key read once.

    Bringing a summary up to date folds a device's old value, then at once its new one; the
    devices come in key order either way.
    """

    def __init__(self, route: RouteCheck | None) -> None:
        self.route, self._last = route, ""

    def see(self, dk: str) -> None:
        """Pass ``dk`` to the route check, unless it was the key seen last."""
        if self.route is not None and dk != self._last:
            self.route.see(dk)
            self._last = dk


def _at(terms: Terms, horizons: Mapping[str, int]) -> Terms:
    """``terms`` with ``horizons`` (a summary's old values are read with the old ones)."""
    return dataclasses.replace(terms, horizons=horizons)


def _count_side(counts: Counter[str], side: str, t: Terms, day: int, state: AccountState) -> None:
    """Count one device on one side, if it has history on the side's budget.

    In its window, refused its next report (the gate's own rule), over the window cap, over
    the lifetime cap: each a counter ``side:figure``.
    """
    idx = state.counted(t)
    if not idx:
        return
    window = state.window_spend(day, t.retention_days, idx, t.horizons)
    life = state.lifetime_spend(idx)
    figures = (
        ("in_window", window > 0),
        ("refused", not check(t, day, state).accepted),
        ("over_window", t.window_cap_micro is not None and window > t.window_cap_micro),
        ("over_lifetime", t.lifetime_cap_micro is not None and life > t.lifetime_cap_micro),
    )
    for figure, yes in figures:
        if yes:
            counts[f"{side}:{figure}"] += 1


class _PolicyFold:
    """A policy what-if's passes (under both books) and both sides' counts, device by device."""

    def __init__(
        self,
        books: tuple[PolicyBook, PolicyBook],
        sides: tuple[Terms, Terms],
        day: int,
        horizons: Mapping[str, int],
        reads: Reads,
    ) -> None:
        self._day, self._reads = day, reads
        self._retention, self._horizons = books[0].retention(), horizons
        self._sides = tuple(zip(SIDES, (_at(t, horizons) for t in sides), strict=True))
        self._passes = {
            f"{side}_{scope}": SpendPass(book)
            for side, book in zip(SIDES, books, strict=True)
            for scope in ("window", "lifetime")
        }
        self._counts: Counter[str] = Counter()

    def add(self, dk: str, state: AccountState) -> None:
        self._reads.see(dk)
        window = slot_rows(dk, window_counts(state, self._day, self._retention, self._horizons))
        lifetime = slot_rows(dk, lifetime_counts(state))
        for side in SIDES:
            self._passes[f"{side}_window"].add(window)
            self._passes[f"{side}_lifetime"].add(lifetime)
        for side, t in self._sides:
            _count_side(self._counts, side, t, self._day, state)

    def finish(self) -> Sums:
        return Sums({n: p.finish() for n, p in self._passes.items()}, self._counts)


class PolicyWhatIf:
    """The measure of a policy what-if: ``use_case``'s current terms against ``proposed``.

    ``proposed`` are the policies proposed together (the use case's first), ``rows`` their
    versions as a write would make them against ``book``, the book now
    (:meth:`~dp_governor.policies.repository.PolicyStore.proposed`).
    """

    def __init__(
        self,
        book: PolicyBook,
        use_case: str,
        proposed: Sequence[PolicyCreate],
        rows: Sequence[Policy],
        route: RouteCheck | None = None,
    ) -> None:
        self.use_case, self._rows, self.reads = use_case, tuple(rows), Reads(route)
        self._spec: dict[str, Any] = {
            "kind": "policy",
            "use_case": use_case,
            "proposed": [p.model_dump(mode="json") for p in proposed],
        }
        self.name = PREFIX + self.key(book)

    def after(self, book: PolicyBook) -> PolicyBook:
        """``book`` with the proposed versions added."""
        return PolicyBook.build(
            [*book.versions, *self._rows], book.horizons, book.device, book.device_window
        )

    def key(self, book: PolicyBook) -> str:
        """The digest of the versions, the device-wide budget in force and the proposal."""
        return _digest(book, self._spec)

    def windows(self, book: PolicyBook) -> dict[str, frozenset[int]]:
        """Every window length the functions read, over each use case (module docstring)."""
        sides = (book.terms[self.use_case], self.after(book).terms[self.use_case])
        return {u: frozenset(_lengths(sides, u) | {keep}) for u, keep in book.retention().items()}

    def books(self, book: PolicyBook) -> dict[str, PolicyBook]:
        """Each pass's book by its name."""
        after = self.after(book)
        return {
            f"{side}_{scope}": b
            for side, b in zip(SIDES, (book, after), strict=True)
            for scope in ("window", "lifetime")
        }

    def fold(self, book: PolicyBook, day: int, horizons: Mapping[str, int]) -> Fold:
        """An empty sum of the devices' values on ``day`` with ``horizons``."""
        after = self.after(book)
        sides = (book.terms[self.use_case], after.terms[self.use_case])
        return _PolicyFold((book, after), sides, day, horizons, self.reads)

    def spec(self) -> dict[str, Any]:
        """The proposal, stored with the sums (:func:`advance_what_ifs` rebuilds from it)."""
        return self._spec


class _DeviceFold:
    """A device-wide budget what-if's refusals per use case, side and budget, device by device."""

    def __init__(self, sides: list[tuple[str, str, Terms]], day: int, reads: Reads) -> None:
        self._sides, self._day, self._reads = sides, day, reads
        self._counts: Counter[str] = Counter()

    def add(self, dk: str, state: AccountState) -> None:
        self._reads.see(dk)
        for name, side, t in self._sides:
            decision = check(t, self._day, state)
            if not decision.accepted:
                self._counts[f"{name}\t{side}\t{decision.refused_by}"] += 1

    def finish(self) -> Sums:
        return Sums({}, self._counts)


class DeviceWhatIf:
    """The measure of a device-wide budget what-if: every active use case, with ``proposed``."""

    def __init__(
        self, book: PolicyBook, proposed: DeviceBudgetCreate, route: RouteCheck | None = None
    ) -> None:
        self._proposed, self.reads = proposed, Reads(route)
        self._spec: dict[str, Any] = {
            "kind": "device",
            "proposed": proposed.model_dump(mode="json"),
        }
        self.name = PREFIX + self.key(book)

    def _sides(self, book: PolicyBook, horizons: Mapping[str, int]) -> list[tuple[str, str, Terms]]:
        """``(use case, side, terms)``: each active use case with the budget now and proposed."""
        version = (book.device.version + 1) if book.device else 1
        after = limits_of(DeviceBudgetVersion.of(self._proposed, version, "what-if"))
        return [
            (name, side, _at(t, horizons))
            for name, terms in sorted(book.terms.items())
            for side, t in zip(
                SIDES, (terms, dataclasses.replace(terms, device=after)), strict=True
            )
        ]

    def key(self, book: PolicyBook) -> str:
        """The digest of the versions, the device-wide budget in force and the proposal."""
        return _digest(book, self._spec)

    def windows(self, book: PolicyBook) -> dict[str, frozenset[int]]:
        """Every window length the functions read, over each use case (module docstring)."""
        sides = [t for _, _, t in self._sides(book, book.horizons)]
        return {u: frozenset(_lengths(sides, u)) for u in book.latest}

    def books(self, book: PolicyBook) -> dict[str, PolicyBook]:
        """Each pass's book by its name."""
        return {}

    def fold(self, book: PolicyBook, day: int, horizons: Mapping[str, int]) -> Fold:
        """An empty sum of the devices' values on ``day`` with ``horizons``."""
        return _DeviceFold(self._sides(book, horizons), day, self.reads)

    def spec(self) -> dict[str, Any]:
        """The proposal, stored with the sums (:func:`advance_what_ifs` rebuilds from it)."""
        return self._spec


def _keep_recent(ledger: Ledger) -> None:
    """Delete the stored what-ifs but the :data:`KEPT` most recently computed.

    A database that refuses the write (a read-only replica) keeps them; the figures computed
    are exact either way.
    """
    c = _SUMMARIES.c
    stored = select(c.name).where(c.name.startswith(PREFIX)).order_by(c.computed_at.desc(), c.name)
    with ledger.engine.connect() as conn:
        older = [str(n) for (n,) in conn.execute(stored)][KEPT:]
    if older:
        _delete(ledger, older)


def _delete(ledger: Ledger, names: list[str]) -> None:
    """Delete the stored what-ifs ``names`` (a read-only database keeps them)."""
    try:
        with writer(ledger.engine).begin() as conn:
            conn.execute(delete(_SUMMARIES).where(_SUMMARIES.c.name.in_(names)))
    except DBAPIError as exc:
        log.warning("stored what-ifs were not deleted: %s", exc.orig)


def what_if_sums(
    ledger: Ledger, measure: Measure, *, now: datetime, full: bool = False
) -> tuple[PolicyBook, Sums]:
    """A what-if's sums at ``now`` from its stored summary when it can be, and the book now.

    :func:`~dp_governor.budget.reporting.summary.summed` (else, or with ``full``, every
    account read), keeping at most :data:`KEPT` what-ifs stored.
    """
    out = summed(ledger, measure, now=now, chunk=CHUNK, full=full)
    _keep_recent(ledger)
    return out


def forwarded_sums(
    ledger: Ledger, measure: PolicyWhatIf | DeviceWhatIf, *, now: datetime
) -> tuple[PolicyBook, Sums] | None:
    """A what-if's sums at ``now`` from its stored summary brought forward; ``None``: none fits.

    With a route check (the measure's), it sees the devices that changed and the smallest and
    largest key held, each once, and is marked partial: only a full pass sees every device.
    """
    reads = measure.reads
    ends = [] if reads.route is None else key_ends(ledger.engine)
    for key in ends[:1]:  # the smallest first and the largest last, as the devices come
        reads.see(key)
    forward = brought_forward(ledger, now=now, measure=measure)
    if forward is None:
        return None
    if reads.route is not None:
        reads.route.partial = True
        for key in ends[-1:]:
            reads.see(key)
    _keep_recent(ledger)
    return forward[0], forward[1].sums


def _rebuilt(ledger: Ledger, book: PolicyBook, spec: dict[str, Any]) -> Measure | None:
    """The measure ``spec`` describes against ``book`` (``None``: a write would refuse it now)."""
    try:
        if spec["kind"] == "device":
            return DeviceWhatIf(book, DeviceBudgetCreate.model_validate(spec["proposed"]))
        proposed = [PolicyCreate.model_validate(p) for p in spec["proposed"]]
        with ledger.engine.connect() as conn:
            rows = ledger.policies.proposed(conn, proposed)
        return PolicyWhatIf(book, str(spec["use_case"]), proposed, rows)
    except (KeyError, ValueError):  # PolicyConflict, or the model's own validation
        return None


def advance_what_ifs(ledger: Ledger, *, now: datetime) -> int:
    """Bring every stored what-if to ``now``; how many were. The purge runs this first.

    A what-if stored under another book (a policy edit since), or that a write would now
    refuse, can never be brought up to date (the book only grows): it is deleted.
    """
    book = ledger.book()
    advanced, dropped = 0, []
    for name, spec in stored_specs(ledger.engine, PREFIX):
        measure = _rebuilt(ledger, book, spec)
        if measure is None or measure.name != name:
            dropped.append(name)
        elif advance(ledger, measure, now=now):
            advanced += 1
    if dropped:
        _delete(ledger, dropped)
    return advanced
