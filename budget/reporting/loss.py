"""Privacy loss on the live ledger: per device, per population, and the effective-epsilon report.

Every figure is read from the accounts (:meth:`dp_governor.budget.ledger.Ledger.accounts`) under the
policy book (:meth:`dp_governor.budget.ledger.Ledger.book`): a use case's window is its latest
version's ``retention_days`` (retired use cases included), days on or before its retention horizon
count nowhere, and each charge counts at the group size in force when it was made (a pure
epsilon-DP report is ``g x epsilon``-DP for groups of ``g``). Losses of what devices actually
sent are running totals (labelled ``kind="running total"``): their basic sum is a guarantee and
what the gate enforces; their (epsilon, delta) bound is not, against an adaptively chosen
sequence (docs/accounting.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from dp_governor.budget.clock import utc_day
from dp_governor.budget.errors import InvalidRequest, UnknownUseCase
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.privacy.accountant import Accountant, PrivacyLoss
from dp_governor.budget.reporting.central import central_figures
from dp_governor.budget.reporting.population import SpendPass, slot_rows
from dp_governor.budget.reporting.report import (
    EffectiveEpsilonReport,
    ReportBasis,
    Row,
    basis_of,
    finish_report,
)
from dp_governor.budget.reporting.routing import RouteCheck
from dp_governor.budget.reporting.summary import report_passes
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.state import AccountState, Slot, lifetime_counts, window_counts
from dp_governor.policies.model import Policy, from_micro

ACCOUNTS_CHUNK = 20_000  # accounts a read of the streaming scan

__all__ = [
    "DeviceLoss",
    "device_loss",
    "devices_loss",
    "effective_epsilon",
    "effective_epsilon_basis",
    "effective_epsilon_passes",
    "lifetime_rows",
    "population_lifetime_loss",
    "population_window_loss",
    "spend_passes",
    "spend_rows",
    "window_rows",
    "window_totals",
]

Events = tuple[tuple[float, int], ...]  # (group-scaled epsilon, count), by epsilon


@dataclass(frozen=True, slots=True)
class DeviceLoss:
    """One device's cumulative loss per use case and in total, over the window and lifetime.

    Every figure is a running total (``kind``) of what the device actually sent: its basic sum
    is a guarantee (and what the gate enforces); its (epsilon, delta) bound is not, against an
    adaptively chosen sequence (see docs/accounting.md).
    """

    window: dict[str, PrivacyLoss] = field(default_factory=dict)
    lifetime: dict[str, PrivacyLoss] = field(default_factory=dict)
    window_total: PrivacyLoss | None = None
    lifetime_total: PrivacyLoss | None = None


def _scaled(rows: Iterable[tuple[int, int, int]]) -> Events:
    """``(micro-epsilon, group size, count)`` rows as pure events at their group's epsilon.

    >>> _scaled([(2_000_000, 1, 3), (1_000_000, 2, 1)])
    ((2.0, 4),)
    """
    merged: dict[int, int] = defaultdict(int)
    for eps, group, count in rows:
        merged[int(eps) * int(group)] += int(count)
    return tuple((from_micro(e), n) for e, n in sorted(merged.items()))


def _window_counts(
    ledger: Ledger, day: int, book: PolicyBook, names: Iterable[str] | None = None
) -> Iterator[tuple[str, dict[Slot, int]]]:
    """Per device, ``{(use case, micro-epsilon, group, budget): reports}`` in each window.

    Every use case ever defined counts (retired ones in their last version's window), or
    only ``names``.
    """
    retention = book.retention()
    if names is not None:
        wanted = set(names)
        retention = {n: r for n, r in retention.items() if n in wanted}
    for dk, state in ledger.accounts():
        counts = window_counts(state, day, retention, book.horizons)
        if counts:
            yield dk, counts


def window_rows(ledger: Ledger, *, now: datetime, use_case: str | None = None) -> Iterator[Row]:
    """Each use case's charges in its own window: ``(device, use case, eps, group, n, budget)``."""
    names = None if use_case is None else [use_case]
    for dk, counts in _window_counts(ledger, utc_day(now), ledger.book(), names):
        yield from slot_rows(dk, counts)


def lifetime_rows(ledger: Ledger, use_case: str | None = None) -> Iterator[Row]:
    """The lifetime multiset: ``(device, use case, micro-epsilon, group size, count, budget)``."""
    for dk, state in ledger.accounts():
        for row in slot_rows(dk, lifetime_counts(state)):
            if use_case is None or row[1] == use_case:
                yield row


def spend_rows(ledger: Ledger, *, now: datetime) -> tuple[list[Row], list[Row]]:
    """:func:`window_rows` and :func:`lifetime_rows` of every use case, from one scan."""
    book, day = ledger.book(), utc_day(now)
    retention = book.retention()
    window: list[Row] = []
    lifetime: list[Row] = []
    for dk, state in ledger.accounts():
        window.extend(slot_rows(dk, window_counts(state, day, retention, book.horizons)))
        lifetime.extend(slot_rows(dk, lifetime_counts(state)))
    return window, lifetime


def spend_passes(
    ledger: Ledger,
    *,
    now: datetime,
    books: Sequence[PolicyBook],
    chunk: int = ACCOUNTS_CHUNK,
    observe: Callable[[AccountState], None] | None = None,
    after: str = "",
    through: str | None = None,
    route: RouteCheck | None = None,
) -> list[tuple[SpendPass, SpendPass]]:
    """One streaming scan of the accounts into a (window, lifetime) pass per book; finished.

    The accounts are read ``chunk`` at a time in key order and each device's rows folded in at
    once, so memory does not grow with the ledger (:mod:`dp_governor.budget.reporting.population`).
    The rows are :func:`window_rows` and :func:`lifetime_rows` under the ledger's own book;
    ``observe`` sees each account's state too (what-if counts its devices in the same scan);
    ``after`` and ``through`` restrict the scan to one range of device keys
    (:meth:`dp_governor.budget.ledger.Ledger.accounts`); ``route`` sees every device key (a
    shard's read checks each device routes to it, :mod:`dp_governor.budget.reporting.routing`).
    """
    book, day = ledger.book(), utc_day(now)
    retention = book.retention()
    passes = [(SpendPass(b), SpendPass(b)) for b in books]
    for dk, state in ledger.accounts(chunk=chunk, after=after, through=through):
        if route is not None:
            route.see(dk)
        window = list(slot_rows(dk, window_counts(state, day, retention, book.horizons)))
        lifetime = list(slot_rows(dk, lifetime_counts(state)))
        for in_window, ever in passes:
            in_window.add(window)
            ever.add(lifetime)
        if observe is not None:
            observe(state)
    return [(w.finish(), e.finish()) for w, e in passes]


def effective_epsilon_basis(
    ledger: Ledger, *, now: datetime, chunk: int = ACCOUNTS_CHUNK, full: bool = False
) -> ReportBasis:
    """The delta-free part of the effective-epsilon report, from the stored summary if it can be.

    The summary brought up to date by what changed since it was stored, else (or with ``full``)
    one streaming scan of the accounts, stored for the next report
    (:func:`dp_governor.budget.reporting.summary.report_passes`; the same figures either way).
    With the central figures of the shuffled batches published
    (:mod:`dp_governor.budget.reporting.central`, each at its policy's delta).
    """
    return effective_epsilon_passes(ledger, now=now, chunk=chunk, full=full)[0]


def effective_epsilon_passes(
    ledger: Ledger, *, now: datetime, chunk: int = ACCOUNTS_CHUNK, full: bool = False
) -> tuple[ReportBasis, SpendPass, SpendPass]:
    """:func:`effective_epsilon_basis` with the (window, lifetime) passes it was built from.

    The passes' per-use-case histograms are each use case's spend distribution, which the
    dashboard shows: read from the same summary, they cost nothing more.
    """
    day = utc_day(now)
    book, window, lifetime = report_passes(ledger, now=now, chunk=chunk, full=full)
    basis = basis_of(book, day, window, lifetime, computed_at=now.isoformat())
    central = central_figures(ledger.engine, book.versions, day)
    return replace(basis, central=central), window, lifetime


def effective_epsilon(
    ledger: Ledger, *, now: datetime, delta: float | None = None, full: bool = False
) -> EffectiveEpsilonReport:
    """The effective-epsilon report (:mod:`dp_governor.budget.reporting.report`) on the live ledger.

    ``delta`` defaults to the smallest active policy delta; ``full`` reads every account
    instead of bringing the stored summary up to date (:func:`effective_epsilon_basis`).
    """
    basis = effective_epsilon_basis(ledger, now=now, full=full)
    return finish_report(basis, accountant=ledger.accountant, delta=delta)


def _compose(
    accountant: Accountant,
    rows: dict[str, list[tuple[int, int, int]]],
    policies: dict[str, Policy],
    delta: float | None,
    total_delta: float,
) -> tuple[dict[str, PrivacyLoss], PrivacyLoss]:
    """Per-use-case losses and the total over use cases (each event at its group size)."""
    per_use_case: dict[str, PrivacyLoss] = {}
    merged: dict[float, int] = defaultdict(int)
    for use_case, events in rows.items():
        p = policies[use_case]
        scaled = _scaled(events)
        per_use_case[use_case] = accountant.loss(
            scaled,
            delta=delta if delta is not None else p.delta,
            kind="running total",
            grouped=any(g > 1 for _, g, n in events if n),
        )
        for eps, count in scaled:
            merged[eps] += count
    grouped = any(g > 1 for events in rows.values() for _, g, n in events if n)
    return per_use_case, accountant.loss(
        merged, delta=total_delta, kind="running total", grouped=grouped
    )


def device_loss(
    ledger: Ledger, device_id: str, *, now: datetime, delta: float | None = None
) -> DeviceLoss:
    """Window and lifetime loss per use case and in total (basic sum and bound, group-scaled).

    The total composes every use case's events at ``delta``, by default the smallest delta
    among the device's use cases.
    """
    if not isinstance(device_id, str) or not device_id:
        raise InvalidRequest("device_id", "must be a non-empty string")
    dk = ledger.device_key(device_id)
    day = utc_day(now)
    with ledger.engine.connect() as conn:
        book = ledger.gate.book(conn)
        state = ledger.state_of(conn, dk) or AccountState()
    policies = book.latest
    window: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    lifetime: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for (uc, e, g, _), n in window_counts(state, day, book.retention(), book.horizons).items():
        window[uc].append((e, g, n))
    for (uc, e, g, _), n in lifetime_counts(state).items():
        lifetime[uc].append((e, g, n))
    used = [policies[u] for u in set(window) | set(lifetime) if u in policies]
    total_delta = delta if delta is not None else min((p.delta for p in used), default=1e-9)
    accountant = ledger.accountant
    per_window, window_total = _compose(accountant, window, policies, delta, total_delta)
    per_life, lifetime_total = _compose(accountant, lifetime, policies, delta, total_delta)
    return DeviceLoss(per_window, per_life, window_total, lifetime_total)


def devices_loss(
    ledger: Ledger, device_ids: list[str], *, now: datetime, delta: float | None = None
) -> dict[str, DeviceLoss]:
    """:func:`device_loss` for a set of devices, keyed by the ids given."""
    return {d: device_loss(ledger, d, now=now, delta=delta) for d in device_ids}


def window_totals(
    ledger: Ledger, *, now: datetime, use_case: str | None = None
) -> dict[str, float]:
    """Basic window epsilon per device key (one scan of the accounts), for a use case or all.

    With ``use_case=None`` each use case's own retention window applies.
    """
    book = ledger.book()
    if use_case is not None and use_case not in book.latest:
        raise UnknownUseCase(use_case)
    names = None if use_case is None else [use_case]
    totals: dict[str, int] = {}
    for dk, counts in _window_counts(ledger, utc_day(now), book, names):
        totals[dk] = sum(e * n for (_, e, _, _), n in counts.items())
    return {dk: from_micro(v) for dk, v in totals.items()}


def population_window_loss(
    ledger: Ledger, *, now: datetime, use_case: str
) -> dict[str, PrivacyLoss]:
    """Tight window loss of every device of a use case (memoized by ledger multiset).

    Running totals (labelled so): see :class:`DeviceLoss`.
    """
    book = ledger.book()
    policy = book.latest.get(use_case)
    if policy is None:
        raise UnknownUseCase(use_case)
    return {
        dk: ledger.accountant.loss(
            _scaled((e, g, n) for (_, e, g, _), n in counts.items()),
            delta=policy.delta,
            kind="running total",
            grouped=any(g > 1 for (_, _, g, _), n in counts.items() if n),
        )
        for dk, counts in _window_counts(ledger, utc_day(now), book, [use_case])
    }


def population_lifetime_loss(ledger: Ledger, *, use_case: str) -> dict[str, PrivacyLoss]:
    """Tight lifetime loss of every device of a use case (memoized by ledger multiset).

    Running totals (labelled so): see :class:`DeviceLoss`.
    """
    policy = ledger.book().latest.get(use_case)
    if policy is None:
        raise UnknownUseCase(use_case)
    out: dict[str, PrivacyLoss] = {}
    for dk, state in ledger.accounts():
        mine = {s: n for s, n in lifetime_counts(state).items() if s[0] == use_case}
        if mine:
            out[dk] = ledger.accountant.loss(
                _scaled((e, g, n) for (_, e, g, _), n in mine.items()),
                delta=policy.delta,
                kind="running total",
                grouped=any(g > 1 for (_, _, g, _) in mine),
            )
    return out
