"""The effective-epsilon report Tang et al. (2017) ask for, computed from ledger rows.

For each active use case, what its policy allows (epsilon per report, reports per day, and the
effective epsilon per day, per retention window and per year, for individuals and for groups of
the policy's size, and whether any cap bounds the lifetime loss), beside what devices actually
spent (maximum, p99 and median over the devices that reported, in the window and over their
lifetime). Across use cases: what the policies allow one device per day, window and year (the
caps' worst case, :mod:`dp_governor.budget.privacy.allowance`, composed as a schedule fixed in
advance), and what devices spent (basic sums, and each device's own (epsilon, delta) bound, memoized
by its ledger's multiset, as max, p99 and median). Every (epsilon, delta) figure names what it is
(``bound``: exact optimal, PLD upper bound or basic sum) and of what (``kind``: a fixed schedule
or a device's running total); see docs/accounting.md.

The report is a pure function of the policies (the latest version of every use case, retired
ones included), the as-of day and two streams of ``(device key, use case, micro-epsilon, group
size, count)`` rows (the window's charges and the lifetime totals), so the same function runs on
the live ledger and on an exported one (:mod:`dp_governor.budget.reporting.export`) and must give
the same numbers.
Retired use cases have no line, but their spend counts in every device total, so a population
figure never goes down when a use case is retired. It is built in two steps:
:func:`prepare_report` reads the rows once into a delta-free :class:`ReportBasis` (spreads, and
the histogram of per-device ledgers), and :func:`finish_report` composes it at one delta, over
the distinct ledgers only.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from operator import itemgetter
from typing import Any, Final

from dp_governor import __version__
from dp_governor.budget.clock import day_date
from dp_governor.budget.privacy.accountant import NOTES, Accountant, Bound, Kind, PrivacyLoss
from dp_governor.budget.privacy.allowance import Caps, allowance, max_reports
from dp_governor.budget.privacy.display import fmt_up
from dp_governor.budget.privacy.epsilon_advisor import (
    EpsilonAdvice,
    advise,
)
from dp_governor.budget.reporting.central import CentralLine
from dp_governor.budget.reporting.population import Events, Row, SpendPass
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.policies.model import Policy, budget_key, from_micro, to_micro

__all__ = [
    "EffectiveEpsilonReport",
    "LossSpread",
    "ReportBasis",
    "Row",
    "Spread",
    "basis_of",
    "build_report",
    "finish_report",
    "prepare_report",
]

DAYS_PER_YEAR: Final = 365
Ledger = Events
DOMINATED: Final[Bound] = "upper bound (dominating schedule)"


@dataclass(frozen=True, slots=True)
class Spread:
    """Maximum, p99 and median of per-device epsilon sums, over ``devices`` devices.

    Basic sums of what each device actually sent (delta 0): running totals, and valid ones.
    """

    devices: int
    max: float
    p99: float
    median: float
    bound: Bound = "basic sum"
    kind: Kind = "running total"
    note: str = NOTES[("running total", "basic sum")]


@dataclass(frozen=True, slots=True)
class LossSpread:
    """Each device's own (epsilon, delta) bound at ``delta``: maximum, p99 and median.

    ``bounds`` counts the devices by what their figure is; ``basic_max`` is the largest basic
    sum, for comparison. Running totals (see ``note``).
    """

    devices: int
    distinct_ledgers: int
    delta: float
    max: float
    p99: float
    median: float
    basic_max: float
    bounds: dict[str, int]
    kind: Kind
    note: str


@dataclass(frozen=True, slots=True)
class UseCaseLine:
    """One use case's line of the report."""

    use_case: str
    policy_version: int
    mechanism: str
    budget: str
    shares_budget_with: list[str]
    epsilon_per_report: float
    reports_per_day: int
    retention_days: int
    group_size: int
    epsilon_per_day: float
    epsilon_per_window: float
    epsilon_per_year: float
    group_epsilon_per_day: float
    window_cap: float | None
    lifetime_cap: float | None
    lifetime_bounded: bool
    lifetime_bound: float | None
    lifetime_note: str
    spent_window: Spread
    spent_lifetime: Spread
    spent_budget_lifetime_max: float = 0.0
    devices_over_lifetime_cap: int = 0
    spent_budget_window_max: float = 0.0
    devices_over_window_cap: int = 0
    window_note: str = ""
    epsilon_advice: EpsilonAdvice | None = None


@dataclass(frozen=True, slots=True)
class DeviceTotals:
    """Totals over all use cases per device: the policies' worst case and the devices' actual.

    ``allowed_*`` compose the caps' worst-case schedule (fixed in advance); ``spent_*`` are
    basic sums and ``device_bound_*`` each device's (epsilon, delta) bound, both running totals.
    """

    allowed_per_day: PrivacyLoss
    allowed_per_window: PrivacyLoss
    allowed_per_year: PrivacyLoss
    spent_window: Spread
    spent_lifetime: Spread
    device_bound_window: LossSpread | None
    device_bound_lifetime: LossSpread | None


@dataclass(frozen=True, slots=True)
class EffectiveEpsilonReport:
    """The whole report, with how every figure was computed and when (``computed_at``)."""

    as_of: str
    use_cases: list[UseCaseLine]
    totals: DeviceTotals
    provenance: dict[str, Any]
    central: list[CentralLine] = field(default_factory=list)
    computed_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Allowed:
    """One horizon's worst case across budgets: its exact sum and a schedule to compose.

    ``exact`` is False when some budget's schedule only dominates the allowed ones;
    ``value_exact`` is False when some budget's maximum is only an upper bound; ``grouped``
    is True when some member's group size is above 1 (its figure is for groups).
    """

    value_micro: int
    schedule: dict[float, int]
    exact: bool
    value_exact: bool
    grouped: bool = False


@dataclass(frozen=True, slots=True)
class ReportBasis:
    """Everything of the report that does not depend on delta, read from the rows once.

    ``window_ledgers`` and ``lifetime_ledgers`` are the histograms ``((ledger, grouped),
    devices)`` of the
    devices' group-scaled multisets, so any delta's figures cost one composition per distinct
    ledger.
    """

    as_of: str
    default_delta: float
    lines: list[UseCaseLine]
    allowed_per_day: Allowed
    allowed_per_window: Allowed
    allowed_per_year: Allowed
    spent_window: Spread
    spent_lifetime: Spread
    window_ledgers: tuple[tuple[tuple[Ledger, bool], int], ...]
    lifetime_ledgers: tuple[tuple[tuple[Ledger, bool], int], ...]
    provenance: dict[str, Any]
    central: list[CentralLine] = field(default_factory=list)
    computed_at: str = ""


def _quantiles(pairs: Iterable[tuple[float, int]]) -> tuple[int, float, float, float]:
    """``(devices, max, p99, median)`` of values with multiplicities, inverted CDF.

    The p-quantile is the smallest value whose cumulative count reaches ``p n`` (numpy's
    ``inverted_cdf``: always a value some device has), computed in integers.

    >>> _quantiles([(1.0, 98), (5.0, 1), (9.0, 1)])
    (100, 9.0, 5.0, 1.0)
    """
    ordered = sorted(pairs)
    n = sum(c for _, c in ordered)
    if not n:
        return 0, 0.0, 0.0, 0.0
    p99 = median = ordered[-1][0]
    found_p99 = found_median = False
    cum = 0
    for value, count in ordered:
        cum += count
        if not found_median and 2 * cum >= n:
            median, found_median = value, True
        if not found_p99 and 100 * cum >= 99 * n:
            p99, found_p99 = value, True
            break
    return n, ordered[-1][0], p99, median


def _spread(values: Counter[int]) -> Spread:
    """Spread of per-device micro-epsilon values, from their histogram ``{value: devices}``."""
    n, top, p99, median = _quantiles(values.items())
    return Spread(n, from_micro(int(top)), from_micro(int(p99)), from_micro(int(median)))


def _caps(policy: Policy) -> Caps:
    """The shared caps of the budget ``policy`` draws from, in micro-epsilon."""
    return Caps(
        policy.max_reports_per_day,
        policy.retention_days,
        None if policy.window_epsilon_cap is None else to_micro(policy.window_epsilon_cap),
        None if policy.lifetime_epsilon_cap is None else to_micro(policy.lifetime_epsilon_cap),
    )


def _allowed_alone(policy: Policy, days: int) -> float:
    """What a device may spend on ``policy`` alone over ``days`` days, with its caps (exact)."""
    eps = to_micro(policy.epsilon_per_report)
    return from_micro(max_reports(_caps(policy), eps, days) * eps)


def _allowed(budgets: Sequence[Sequence[Policy]], days: int) -> Allowed:
    """The worst case over ``days`` days of every budget, each with its members' epsilons."""
    value = 0
    schedule: dict[float, int] = defaultdict(int)
    exact = value_exact = True
    for members in budgets:
        costs = tuple(
            (to_micro(p.epsilon_per_report), to_micro(p.epsilon_per_report) * p.group_size)
            for p in members
        )
        found = allowance(costs, _caps(members[0]), days)
        value += found.value_micro
        exact = exact and found.exact_schedule
        value_exact = value_exact and found.exact_value
        for micro, count in found.schedule:
            schedule[from_micro(micro)] += count
    grouped = any(p.group_size > 1 for members in budgets for p in members)
    return Allowed(value, dict(schedule), exact, value_exact, grouped)


def _lifetime_statement(
    p: Policy, spent: Counter[int], past_filter: int
) -> tuple[bool, float | None, str, int]:
    """``(bounded, bound, note, devices over)`` of a use case's lifetime, checked against spend.

    A lifetime cap bounds what its budget may still admit; a device that spent more before
    the cap was lowered keeps what it spent, so the bound stated is the larger of the two.
    A lifetime filter is stated as holding every device's recorded reports within its target
    only when none is past it (``past_filter``: devices past it, having spent before it was
    set or tightened).
    """
    cap = p.lifetime_epsilon_cap
    if cap is None:
        if p.lifetime_filter_epsilon is not None:
            target = f"({fmt_up(p.lifetime_filter_epsilon)}, {p.lifetime_filter_delta:g})-DP"
            if not past_filter:
                note = (
                    "no cap bounds the lifetime's basic sum, but every device's reports are"
                    f" within the lifetime filter's {target}, and it admits none past it"
                )
            else:
                note = (
                    "no cap bounds the lifetime's basic sum, and the lifetime filter's"
                    f" {target} does not bound the {past_filter} device(s) that spent past it"
                    " before it was set (it admits nothing more to them)"
                )
        elif p.window_epsilon_cap is not None:
            window = fmt_up(p.window_epsilon_cap)
            note = (
                f"nothing bounds the lifetime loss: the window cap of {window} renews every"
                f" {p.retention_days} days"
            )
        else:
            note = "nothing bounds the lifetime loss: the daily allowance renews every day"
        return False, None, note, 0
    over = sum(n for v, n in spent.items() if v > to_micro(cap))
    if not over:
        return True, cap, f"the lifetime cap bounds the loss at {fmt_up(cap)}", 0
    top = from_micro(max(spent))
    return (
        True,
        top,
        f"the lifetime cap bounds the loss at {fmt_up(top)}: the cap of {fmt_up(cap)} admits"
        f" nothing more to the {over} device(s) that spent more before it was lowered (up to"
        f" {fmt_up(top)})",
        over,
    )


def _window_statement(p: Policy, spent: Counter[int]) -> tuple[int, str]:
    """``(devices over, note)``: devices whose window holds more than the window cap.

    They spent it before the cap was lowered (or the window reaches past a purge and counts
    what it cannot date); the cap admits nothing more to them until enough leaves the window.
    """
    cap = p.window_epsilon_cap
    if cap is None:
        return 0, ""
    over = sum(n for v, n in spent.items() if v > to_micro(cap))
    if not over:
        return 0, ""
    return over, (
        f"{over} device(s) hold up to {fmt_up(from_micro(max(spent)))} in the window, above"
        f" the window cap of {fmt_up(cap)}: spent before it was lowered, it admits nothing more"
        " to them until enough leaves the window"
    )


def prepare_report(
    book: PolicyBook,
    day: int,
    window_rows: Iterable[Row],
    lifetime_rows: Iterable[Row],
    *,
    computed_at: str | None = None,
) -> ReportBasis:
    """Read the rows once into the delta-free part of the report (see the module docstring).

    ``book`` holds every policy version (retired use cases have ``active=False``) and the
    retention horizons; ``window_rows`` are each use case's charges in its own window (days
    ``day - retention + 1 .. day``, and the spend a window reaching back past a horizon can no
    longer date: :meth:`dp_governor.budget.rule.state.AccountState.unheld`), with the group size and
    budget each charge was made under. ``computed_at`` is the instant the rows were read (ISO 8601;
    default: the day's start). Rows streamed (an iterator) must come grouped by device in key
    order, as the accounts are read (:class:`dp_governor.budget.reporting.population.SpendPass`);
    a sequence, in memory already, may come in any order.
    """
    window, lifetime = SpendPass(book), SpendPass(book)
    for spend, rows in ((window, window_rows), (lifetime, lifetime_rows)):
        if isinstance(rows, Sequence):  # in memory already: any order
            rows = sorted(rows, key=itemgetter(0))
        spend.add(rows).finish()
    return basis_of(book, day, window, lifetime, computed_at=computed_at)


def basis_of(
    book: PolicyBook,
    day: int,
    window: SpendPass,
    lifetime: SpendPass,
    *,
    computed_at: str | None = None,
) -> ReportBasis:
    """The report's delta-free part from finished passes over the window and lifetime rows."""
    active = book.active
    by_budget: dict[str, list[Policy]] = defaultdict(list)
    for p in active:
        by_budget[budget_key(p)].append(p)
    budgets = [by_budget[b] for b in sorted(by_budget)]

    lines = []
    for p in active:
        budget = budget_key(p)
        spent = lifetime.budget.get(budget, Counter())
        past = lifetime.past_filter.get(budget, 0)
        bounded, bound, note, over = _lifetime_statement(p, spent, past)
        in_window = window.budget.get(budget, Counter())
        window_over, window_note = _window_statement(p, in_window)
        per_day = _allowed_alone(p, 1)
        lines.append(
            UseCaseLine(
                use_case=p.name,
                policy_version=p.version,
                mechanism=p.mechanism,
                budget=budget,
                shares_budget_with=[m.name for m in by_budget[budget] if m.name != p.name],
                epsilon_per_report=p.epsilon_per_report,
                reports_per_day=p.max_reports_per_day,
                retention_days=p.retention_days,
                group_size=p.group_size,
                epsilon_per_day=per_day,
                epsilon_per_window=_allowed_alone(p, p.retention_days),
                epsilon_per_year=_allowed_alone(p, DAYS_PER_YEAR),
                group_epsilon_per_day=from_micro(to_micro(per_day) * p.group_size),
                window_cap=p.window_epsilon_cap,
                lifetime_cap=p.lifetime_epsilon_cap,
                lifetime_bounded=bounded,
                lifetime_bound=bound,
                lifetime_note=note,
                spent_window=_spread(window.use_case.get(p.name, Counter())),
                spent_lifetime=_spread(lifetime.use_case.get(p.name, Counter())),
                spent_budget_lifetime_max=from_micro(max(spent, default=0)),
                devices_over_lifetime_cap=over,
                spent_budget_window_max=from_micro(max(in_window, default=0)),
                devices_over_window_cap=window_over,
                window_note=window_note,
                epsilon_advice=advise(p),
            )
        )
    max_retention = max((p.retention_days for p in active), default=1)
    provenance = {
        "dp_governor": __version__,
        "policy_versions": {p.name: p.version for p in active},
        "window": "each use case's charges on days as_of - retention_days + 1 .. as_of",
        "lifetime": "the accounts' lifetime multisets (kept through retention purges)",
        "retired": "retired use cases have no line; their spend counts in every device total",
        "quantiles": "over devices with at least one charge; inverted CDF (a device's value)",
        "per_window_and_year": "the most the caps allow: exact under the daily cap, the sliding"
        " window cap and the lifetime cap (a budget group's members each with their own"
        " epsilon and group size)",
        "device_total_window": f"the longest retention window, {max_retention} days",
        "device_totals": "every use case's events scaled by the group size they were charged"
        " under (group privacy), composed; a budget group's shared caps counted once",
        "device_bounds": "each device's own bound, memoized by its ledger's multiset: max, p99,"
        " median",
    }
    return ReportBasis(
        as_of=day_date(day).isoformat(),
        computed_at=computed_at or f"{day_date(day).isoformat()}T00:00:00+00:00",
        default_delta=min((p.delta for p in active), default=1e-9),
        lines=lines,
        allowed_per_day=_allowed(budgets, 1),
        allowed_per_window=_allowed(budgets, max_retention),
        allowed_per_year=_allowed(budgets, DAYS_PER_YEAR),
        spent_window=_spread(window.totals),
        spent_lifetime=_spread(lifetime.totals),
        window_ledgers=tuple(sorted(window.ledgers.items())),
        lifetime_ledgers=tuple(sorted(lifetime.ledgers.items())),
        provenance=provenance,
    )


def _allowed_loss(allowed: Allowed, accountant: Accountant, delta: float) -> PrivacyLoss:
    """Compose a horizon's worst-case schedule (fixed in advance), labelled for what it is."""
    loss = accountant.loss(allowed.schedule, delta=delta, grouped=allowed.grouped)
    basic = from_micro(allowed.value_micro)
    if allowed.exact:
        return loss
    if loss.epsilon >= basic:
        return replace(
            loss,
            epsilon_basic=basic,
            epsilon=basic,
            method="basic",
            bound="basic sum",
            note=NOTES[("fixed schedule", "basic sum")]
            + ("" if allowed.value_exact else " (the sum is itself an upper bound)"),
        )
    return replace(
        loss,
        epsilon_basic=basic,
        bound=DOMINATED,
        note="a budget group's members differ in epsilon or group size: this composes a"
        " schedule that dominates every allowed one, so it is an upper bound (the basic sum"
        " is the exact worst case's)",
    )


def _loss_spread(
    ledgers: tuple[tuple[tuple[Ledger, bool], int], ...], accountant: Accountant, delta: float
) -> LossSpread | None:
    """Each distinct ledger's running-total bound, weighted by its devices."""
    if not ledgers:
        return None
    losses = [
        (accountant.loss(ev, delta=delta, kind="running total", grouped=grouped), n)
        for (ev, grouped), n in ledgers
    ]
    n, top, p99, median = _quantiles((loss.epsilon, k) for loss, k in losses)
    bounds: dict[str, int] = defaultdict(int)
    for loss, k in losses:
        bounds[loss.bound] += k
    return LossSpread(
        devices=n,
        distinct_ledgers=len(ledgers),
        delta=delta,
        max=top,
        p99=p99,
        median=median,
        basic_max=max(loss.epsilon_basic for loss, _ in losses),
        bounds=dict(sorted(bounds.items())),
        kind="running total",
        note="each device's (epsilon, delta) of what it actually sent, composed as if fixed in"
        " advance: a running total, not a guarantee against an adaptively chosen sequence"
        " (Rogers-Roth-Ullman-Vadhan 2016); the basic sums (spent_*) are, and are what the gate"
        " enforces",
    )


def finish_report(
    basis: ReportBasis, *, accountant: Accountant, delta: float | None = None
) -> EffectiveEpsilonReport:
    """Compose the basis at ``delta`` (default: the smallest active policy delta)."""
    delta = delta if delta is not None else basis.default_delta
    totals = DeviceTotals(
        allowed_per_day=_allowed_loss(basis.allowed_per_day, accountant, delta),
        allowed_per_window=_allowed_loss(basis.allowed_per_window, accountant, delta),
        allowed_per_year=_allowed_loss(basis.allowed_per_year, accountant, delta),
        spent_window=basis.spent_window,
        spent_lifetime=basis.spent_lifetime,
        device_bound_window=_loss_spread(basis.window_ledgers, accountant, delta),
        device_bound_lifetime=_loss_spread(basis.lifetime_ledgers, accountant, delta),
    )
    provenance = {
        "accountant": accountant.name,
        "delta": delta,
        "pld_discretization": accountant.pld_discretization,
        "max_exact_points": accountant.max_exact_points,
        **basis.provenance,
    }
    return EffectiveEpsilonReport(
        basis.as_of, basis.lines, totals, provenance, basis.central, basis.computed_at
    )


def build_report(
    book: PolicyBook,
    day: int,
    window_rows: Iterable[Row],
    lifetime_rows: Iterable[Row],
    *,
    accountant: Accountant,
    delta: float | None = None,
    computed_at: str | None = None,
) -> EffectiveEpsilonReport:
    """The report for ``book`` as of UTC ``day`` (see the module docstring).

    ``delta`` defaults to the smallest active policy delta.
    """
    basis = prepare_report(book, day, window_rows, lifetime_rows, computed_at=computed_at)
    return finish_report(basis, accountant=accountant, delta=delta)
