"""Audit views on the ledger: one device's timeline, a use case's distribution, what-if.

All read-only but for the what-if's stored sums (figures kept to be brought up to date,
:mod:`dp_governor.budget.reporting.what_if_summary`). A device's timeline is built from the
charges still held (the retention window) plus its purge-proof lifetime totals: whatever a
purge removed is carried into the lifetime line as a starting value, so the cumulative curve
ends at the true lifetime spend.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from dp_governor.budget.clock import day_date, utc_day
from dp_governor.budget.errors import InvalidRequest
from dp_governor.budget.ledger import Ledger
from dp_governor.budget.privacy.accountant import PrivacyLoss
from dp_governor.budget.reporting.central import (
    DAYS_PER_YEAR,
    CentralLine,
    central_line,
    read_batches,
)
from dp_governor.budget.reporting.loss import (
    DeviceLoss,
    device_loss,
    lifetime_rows,
    window_rows,
)
from dp_governor.budget.reporting.population import SpendPass, Sums
from dp_governor.budget.reporting.report import UseCaseLine, basis_of, finish_report
from dp_governor.budget.reporting.routing import RouteCheck
from dp_governor.budget.reporting.what_if_summary import (
    SIDES,
    DeviceWhatIf,
    PolicyWhatIf,
    what_if_sums,
)
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.loosening import loosenings
from dp_governor.budget.rule.standing import DeviceOdometer, device_odometer
from dp_governor.budget.rule.state import AccountState, lifetime_counts
from dp_governor.budget.storage.tables import ShuffledBatch
from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.model import Policy, PolicyCreate, from_micro

__all__ = [
    "Distribution",
    "SpendSpread",
    "Timeline",
    "WhatIf",
    "device_timeline",
    "device_what_if_of",
    "distribution",
    "distribution_of",
    "policy_measure",
    "spend_quantiles",
    "spend_spread",
    "what_if",
    "what_if_device_budget",
    "what_if_of",
]

MAX_TIMELINE_DAYS = 400


@dataclass(frozen=True, slots=True)
class Series:
    """One use case's (or the total's) daily series, aligned with :attr:`Timeline.days`."""

    reports: list[int]
    epsilon: list[float]
    window: list[float]
    lifetime: list[float]


@dataclass(frozen=True, slots=True)
class Timeline:
    """A device's charges per day and its cumulative epsilon, per use case and in total.

    ``loss`` composes what the device sent as if its schedule had been fixed in advance;
    ``odometer`` is its running total valid however the reports were chosen (docs/odometer.md
    says which to quote when).
    """

    days: list[str]
    use_cases: dict[str, Series]
    total: Series
    loss: DeviceLoss
    odometer: DeviceOdometer
    central: list[CentralLine] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def device_timeline(ledger: Ledger, device_id: str, *, now: datetime) -> Timeline:
    """The timeline of ``device_id`` up to ``now`` (at most :data:`MAX_TIMELINE_DAYS` days)."""
    if not isinstance(device_id, str) or not 1 <= len(device_id) <= 256:
        raise InvalidRequest("device_id", "must be 1 to 256 characters")
    dk = ledger.device_key(device_id)
    today = utc_day(now)
    book = ledger.book()
    policies = book.latest
    per_day: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    lifetime: dict[str, int] = defaultdict(int)
    sent: dict[str, int] = defaultdict(int)  # reports ever, per use case (bounds the year's)
    with ledger.engine.connect() as conn:
        state = ledger.state_of(conn, dk) or AccountState()
    for use_case, spends in state.daily().items():
        if use_case in policies:
            for day, (n, eps) in spends.items():
                if book.horizon(use_case) < day <= today:
                    per_day[use_case][day][0] += n
                    per_day[use_case][day][1] += eps
    for (use_case, eps, _, _), n in lifetime_counts(state).items():
        lifetime[use_case] += eps * n
        sent[use_case] += n
    first = min((d for days in per_day.values() for d in days), default=today)
    first = max(first, today - MAX_TIMELINE_DAYS + 1)
    days = list(range(first, today + 1))
    series: dict[str, Series] = {}
    total_window = np.zeros(len(days), dtype=np.int64)
    total_life = np.zeros(len(days), dtype=np.int64)
    for use_case in sorted(set(per_day) | set(lifetime)):
        policy = policies.get(use_case)
        retention = policy.retention_days if policy else 1
        daily = per_day.get(use_case, {})
        # the window at day d sums days d - retention + 1 .. d: start the sums early enough
        extended = range(first - retention + 1, today + 1)
        cumulative = np.cumsum(np.array([daily.get(d, [0, 0])[1] for d in extended], np.int64))
        shifted = np.concatenate(
            [np.zeros(retention, np.int64), cumulative[: len(cumulative) - retention]]
        )
        window = (cumulative - shifted)[retention - 1 :]
        # a window reaching back past the purge's horizon holds spend no day does (an upper
        # bound: all the use case's spend not held, as the gate counts it)
        horizon = book.horizon(use_case)
        undated = lifetime.get(use_case, 0) - sum(e for _, e in daily.values())
        if undated > 0:
            at = np.array(days, dtype=np.int64)
            window = window + np.where((at - retention < horizon) & (horizon <= at), undated, 0)
        # the lifetime at day d: today's lifetime total less what was charged after d
        later = np.array([sum(e for x, (_, e) in daily.items() if x > d) for d in days], np.int64)
        life = lifetime.get(use_case, 0) - later
        total_window += window
        total_life += life
        series[use_case] = Series(
            [daily.get(d, [0, 0])[0] for d in days],
            [from_micro(daily.get(d, [0, 0])[1]) for d in days],
            [from_micro(int(v)) for v in window],
            [from_micro(int(v)) for v in life],
        )
    total_reports = [sum(s.reports[i] for s in series.values()) for i in range(len(days))]
    total_eps = [sum(s.epsilon[i] for s in series.values()) for i in range(len(days))]
    total = Series(
        total_reports,
        total_eps,
        [from_micro(int(v)) for v in total_window],
        [from_micro(int(v)) for v in total_life],
    )
    return Timeline(
        [day_date(d).isoformat() for d in days],
        series,
        total,
        device_loss(ledger, device_id, now=now),
        device_odometer(state),
        _device_central(ledger, per_day, sent, today),
    )


def _device_central(
    ledger: Ledger, per_day: dict[str, dict[int, list[int]]], sent: dict[str, int], today: int
) -> list[CentralLine]:
    """The central figures of each use case the device reported to, for its own report counts.

    A batch published in a horizon may hold reports charged before it (a report waits in the
    inbox until its batch is full), so the device's reports that may be in a horizon's
    batches are its charges since the first day any of those batches' reports were charged
    on; where that day is no longer held (purged), every report it ever sent. Composed over
    as many of the use case's smallest sub-batches.
    """
    book = ledger.book()
    versions: dict[str, list[Policy]] = defaultdict(list)
    for p in book.versions:
        versions[p.name].append(p)
    batches = read_batches(ledger.engine, today - DAYS_PER_YEAR + 1)
    out = []
    for use_case in sorted(set(per_day) | set(sent)):
        if use_case not in versions:
            continue
        policy = max(versions[use_case], key=lambda p: p.version)
        held = per_day.get(use_case, {})
        ever, horizon = sent.get(use_case, 0), book.horizon(use_case)
        mine = [b for b in batches if b.use_case == use_case]
        window = _reports_in(mine, today - policy.retention_days, held, ever, horizon)
        year = _reports_in(mine, today - DAYS_PER_YEAR, held, ever, horizon)
        own = (window, max(year, window))
        out.append(central_line(policy, versions[use_case], batches, today, reports=own))
    return out


def _reports_in(
    batches: Sequence[ShuffledBatch],
    after: int,
    held: dict[int, list[int]],
    ever: int,
    horizon: int,
) -> int:
    """A device's reports that may be in ``batches`` published after day ``after``.

    Its charges since the first day those batches' reports were charged on; where that day is
    no longer held (on or before the purge's ``horizon``), every report it ever sent.
    """
    published = [b for b in batches if b.day > after]
    if not published:
        return 0
    first = min(b.first_day for b in published)
    if first <= horizon:
        return ever
    return sum(n for d, (n, _) in held.items() if d >= first)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Histogram and quantiles of per-device cumulative epsilon for one use case."""

    use_case: str
    scope: str
    devices: int
    quantiles: dict[str, float]
    bin_edges: list[float]
    counts: list[int]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def _spends(ledger: Ledger, use_case: str, scope: str, now: datetime) -> dict[str, int]:
    """Per-device micro-epsilon of one use case, in its window or over the lifetime."""
    out: dict[str, int] = defaultdict(int)
    if scope == "window":
        rows = window_rows(ledger, now=now, use_case=use_case)
    else:
        rows = lifetime_rows(ledger, use_case)
    for dk, _, eps, _, n, _ in rows:
        out[dk] += eps * n
    return out


@dataclass(frozen=True, slots=True)
class SpendSpread:
    """One reading of a use case's per-device spends: any histogram of it, without the ledger.

    ``values`` are the devices' micro-epsilon, sorted; ``eps`` the same in epsilon; the
    quantiles do not depend on the bins. What :func:`distribution` computes from, and what the
    service keeps between requests (``dp_governor.api._caches``).
    """

    use_case: str
    scope: str
    eps: np.ndarray
    quantiles: dict[str, float]


def _check_scope(scope: object) -> None:
    if scope not in ("window", "lifetime"):
        raise InvalidRequest("scope", f"must be 'window' or 'lifetime', got {scope!r}")


def _check_bins(bins: object) -> None:
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 200:
        raise InvalidRequest("bins", "must be an integer from 1 to 200")


def spend_spread(ledger: Ledger, use_case: str, *, now: datetime, scope: str) -> SpendSpread:
    """Read the per-device spends of ``use_case`` (devices with at least one charge) once."""
    _check_scope(scope)
    ledger.policies.get(use_case)  # UnknownUseCase for a name never defined or retired
    values = np.array(sorted(_spends(ledger, use_case, scope, now).values()), dtype=np.int64)
    if values.size == 0:
        return SpendSpread(use_case, scope, np.zeros(0), {})
    return SpendSpread(use_case, scope, values / 1_000_000, spend_quantiles(values))


def spend_quantiles(values: np.ndarray) -> dict[str, float]:
    """p50, p90, p99 and max of sorted per-device micro-epsilon (each one device's own spend)."""
    qs = np.percentile(values, [50, 90, 99, 100], method="inverted_cdf")
    return {k: from_micro(int(v)) for k, v in zip(("p50", "p90", "p99", "max"), qs, strict=True)}


def distribution_of(spread: SpendSpread, bins: int) -> Distribution:
    """The histogram of ``bins`` equal bins over a reading, in ``O(bins log n)``.

    The bins of ``numpy.histogram`` (from the least to the largest spend, the last bin closed),
    counted by binary search in the sorted spends instead of a pass over them.
    """
    _check_bins(bins)
    eps = spread.eps
    if eps.size == 0:
        return Distribution(spread.use_case, spread.scope, 0, {}, [], [])
    edges = np.histogram_bin_edges(eps[[0, -1]], bins=bins)  # numpy's edges: from min and max
    below = np.searchsorted(eps, edges[:-1], side="left")  # spends under each bin's left edge
    counts = np.diff(np.append(below, eps.size))
    return Distribution(
        spread.use_case,
        spread.scope,
        int(eps.size),
        dict(spread.quantiles),
        [float(e) for e in edges],
        [int(c) for c in counts],
    )


def distribution(
    ledger: Ledger, use_case: str, *, now: datetime, scope: str = "window", bins: int = 20
) -> Distribution:
    """Where the devices of ``use_case`` stand (devices with at least one charge)."""
    _check_scope(scope)
    _check_bins(bins)
    return distribution_of(spend_spread(ledger, use_case, now=now, scope=scope), bins)


@dataclass(frozen=True, slots=True)
class WhatIf:
    """What a proposed policy would do on the live ledger today; nothing is changed."""

    use_case: str
    current_version: int
    devices_in_window: dict[str, int]  # each side's devices, on the budget it draws from
    refused_next_report_today: dict[str, int]
    over_window_cap: dict[str, int]
    over_lifetime_cap: dict[str, int]
    effective_epsilon: dict[str, dict[str, Any]]
    totals_allowed_per_day: dict[str, PrivacyLoss]
    loosens: list[str] = field(default_factory=list)  # what writing it needs allow_loosen for

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


def policy_measure(
    ledger: Ledger,
    use_case: str,
    proposed: PolicyCreate,
    *,
    alongside: Sequence[PolicyCreate] = (),
    route: RouteCheck | None = None,
) -> PolicyWhatIf:
    """The what-if of ``proposed`` against ``ledger``'s policies, checked as a write checks it.

    Raises :class:`UnknownUseCase`, :class:`InvalidRequest` (a name other than ``use_case``)
    and :class:`PolicyConflict` (:meth:`dp_governor.policies.repository.PolicyStore.proposed`)
    as applying it would. ``route`` sees every device key its sums read.
    """
    ledger.policies.get(use_case)
    if proposed.name != use_case:
        raise InvalidRequest("name", f"must be {use_case!r}, the use case asked about")
    together = [proposed, *(p for p in alongside if p.name != use_case)]
    with ledger.engine.connect() as conn:
        rows = ledger.policies.proposed(conn, together)
    return PolicyWhatIf(ledger.book(), use_case, together, rows, route)


def what_if_of(
    ledger: Ledger, measure: PolicyWhatIf, book: PolicyBook, sums: Sums, *, now: datetime
) -> WhatIf:
    """The what-if's figures from its sums over devices under ``book`` (one database's or more).

    The device counts and passes are the sums'; the effective-epsilon lines and what loosens
    follow from the policies alone.
    """
    use_case, day = measure.use_case, utc_day(now)
    after_book = measure.after(book)
    counts, passes = sums.counts, sums.passes

    def line_and_total(
        b: PolicyBook, spend: tuple[SpendPass, SpendPass]
    ) -> tuple[UseCaseLine, PrivacyLoss]:
        basis = basis_of(b, day, *spend)
        report = finish_report(basis, accountant=ledger.accountant)
        line = next(x for x in report.use_cases if x.use_case == use_case)
        return line, report.totals.allowed_per_day

    before, before_total = line_and_total(
        book, (passes["current_window"], passes["current_lifetime"])
    )
    after, after_total = line_and_total(
        after_book, (passes["proposed_window"], passes["proposed_lifetime"])
    )

    def sides(figure: str) -> dict[str, int]:
        return {side: counts.get(f"{side}:{figure}", 0) for side in SIDES}

    keys = ("epsilon_per_day", "epsilon_per_window", "epsilon_per_year", "lifetime_bounded")
    return WhatIf(
        use_case=use_case,
        current_version=book.latest[use_case].version,
        devices_in_window=sides("in_window"),
        refused_next_report_today=sides("refused"),
        over_window_cap=sides("over_window"),
        over_lifetime_cap=sides("over_lifetime"),
        effective_epsilon={
            k: {"current": getattr(before, k), "proposed": getattr(after, k)} for k in keys
        },
        totals_allowed_per_day={"current": before_total, "proposed": after_total},
        loosens=loosenings(book, after_book),
    )


def what_if(
    ledger: Ledger,
    use_case: str,
    proposed: PolicyCreate,
    *,
    now: datetime,
    alongside: Sequence[PolicyCreate] = (),
    full: bool = False,
) -> WhatIf:
    """Compare the current policy of ``use_case`` with ``proposed`` on today's ledger.

    ``alongside`` are other policies proposed in the same change (a policy file's, or the
    other members of a group whose shared terms change together). Each side decides every
    device's next report through the gate's own rule (:func:`dp_governor.budget.rule.decide.check`)
    on the budget it would draw from, with that budget's members as they would be; a change that a
    write would refuse raises as applying it would (:func:`policy_measure`). The device counts
    and passes come from the stored what-if brought up to date by what changed when it can be,
    else (or with ``full``) from every account
    (:mod:`dp_governor.budget.reporting.what_if_summary`; the same figures either way).
    """
    measure = policy_measure(ledger, use_case, proposed, alongside=alongside)
    book, sums = what_if_sums(ledger, measure, now=now, full=full)
    return what_if_of(ledger, measure, book, sums, now=now)


def device_what_if_of(book: PolicyBook, sums: Sums) -> dict[str, dict[str, dict[str, int]]]:
    """Per use case and side, the devices refused by each budget, from a device what-if's sums."""
    out: dict[str, dict[str, dict[str, int]]] = {
        name: {side: {} for side in SIDES} for name in sorted(book.terms)
    }
    for key, devices in sorted(sums.counts.items()):
        name, side, refused_by = key.split("\t")
        out[name][side][refused_by] = devices
    return out


def what_if_device_budget(
    ledger: Ledger,
    proposed: DeviceBudgetCreate,
    *,
    now: datetime,
    full: bool = False,
) -> dict[str, dict[str, dict[str, int]]]:
    """Per active use case, the devices whose next report would be refused now, by which budget.

    ``{use_case: {"current": {refused_by: devices}, "proposed": {...}}}``, each device decided
    through the gate's own rule (:func:`dp_governor.budget.rule.decide.check`) with the device-wide
    budget in force and with ``proposed``; a device with no history is never refused and is left
    out. Nothing is written but the stored what-if, brought up to date by what changed when it
    can be, else (or with ``full``) counted from every account
    (:mod:`dp_governor.budget.reporting.what_if_summary`).
    """
    measure = DeviceWhatIf(ledger.book(), proposed)
    return device_what_if_of(*what_if_sums(ledger, measure, now=now, full=full))
