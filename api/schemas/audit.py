"""The wire models of the audit routes: the effective-epsilon report, timelines, what-ifs.

Each mirrors a result of the read side (:mod:`dp_governor.budget.reporting`), converted by
:mod:`dp_governor.api.wire`; the API promises these, whatever the read side's objects become.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel
from pydantic import Field as PydField

from dp_governor.api.schemas.budgets import DeviceOdometer

__all__ = [
    "BatchFigure",
    "Bound",
    "CentralLine",
    "CentralLoss",
    "DayFigure",
    "DeviceLoss",
    "DeviceTotals",
    "Distribution",
    "EffectiveEpsilonReport",
    "EpsilonAdvice",
    "Kind",
    "LossSpread",
    "Method",
    "PrivacyLoss",
    "Series",
    "SketchAdvice",
    "Spread",
    "Timeline",
    "UseCaseLine",
    "WhatIf",
]

Method = Literal["basic", "optimal-rr", "pld"]
Bound = Literal[
    "exact optimal",
    "PLD upper bound",
    "basic sum",
    "upper bound (dominating schedule)",
    "upper bound (group privacy)",
]
Kind = Literal["fixed schedule", "running total"]
RUNNING_BASIC_NOTE = (
    "the sum of what the device actually sent (delta 0): a valid privacy filter for pure epsilon, "
    "and what the gate enforces"
)
PRECONDITIONS = (
    "Central figures hold only if: the shuffler is honest (it strips identities and order, and "
    "the adversary sees neither its input nor any link from a stored report to a device); n "
    "counts distinct devices the adversary does not control (devices it controls or whose inputs "
    "it knows hide no one, so subtract them); each report is randomized with fresh coins and is "
    "epsilon-per-report-LDP; which batch a report lands in does not depend on its content. A "
    "device with several reports in a batch is accounted layer by layer (sub-batch i holds every "
    "device's i-th report). The local epsilon per report holds whatever happens."
)


class PrivacyLoss(BaseModel):
    """Cumulative loss of one ledger, with how it was computed (to recompute it offline).

    ``epsilon`` is the smaller valid bound at ``delta``; ``epsilon_basic`` is the pure sum;
    ``bound`` names what ``epsilon`` is, ``kind`` what it is a bound of, and ``note`` says what
    that means for the reader (see the module docstring).
    """

    events: int = PydField(description="Charges composed.")
    epsilon_basic: float = PydField(
        description="The plain sum of the charges' epsilons (a valid bound at delta 0)."
    )
    epsilon: float = PydField(description="The smaller valid epsilon at `delta` (see `bound`).")
    delta: float = PydField(description="The delta `epsilon` holds at (0 for the basic sum).")
    method: Method = PydField(description="How `epsilon` was composed (`basic`, `rdp`, `pld`...).")
    group_size: int = PydField(description="Group-privacy factor applied (devices per person).")
    accountant: str = PydField(description="The accountant and library version that computed it.")
    bound: Bound = PydField(
        default="basic sum", description="What `epsilon` is: `basic sum` or the tight bound's name."
    )
    kind: Kind = PydField(
        default="fixed schedule",
        description=(
            "`running total` (what was actually sent) or `worst case` (the caps' schedule)."
        ),
    )
    note: str = PydField(
        default="", description="In a sentence, what the figure guarantees and what it does not."
    )


class Spread(BaseModel):
    """Maximum, p99 and median of per-device epsilon sums, over ``devices`` devices.

    Basic sums of what each device actually sent (delta 0): running totals, and valid ones.
    """

    devices: int = PydField(description="Devices counted.")
    max: float = PydField(description="The largest per-device sum.")
    p99: float = PydField(description="The 99th percentile per-device sum.")
    median: float = PydField(description="The median per-device sum.")
    bound: Bound = PydField(
        default="basic sum", description="What `epsilon` is: `basic sum` or the tight bound's name."
    )
    kind: Kind = PydField(
        default="running total",
        description=(
            "`running total` (what was actually sent) or `worst case` (the caps' schedule)."
        ),
    )
    note: str = PydField(
        default=RUNNING_BASIC_NOTE,
        description="In a sentence, what the figure guarantees and what it does not.",
    )


class LossSpread(BaseModel):
    """Each device's own (epsilon, delta) bound at ``delta``: maximum, p99 and median.

    ``bounds`` counts the devices by what their figure is; ``basic_max`` is the largest basic
    sum, for comparison. Running totals (see ``note``).
    """

    devices: int = PydField(description="Devices counted.")
    distinct_ledgers: int = PydField(
        description="Distinct charge histories composed (devices alike share one)."
    )
    delta: float = PydField(description="The delta each device's bound holds at.")
    max: float = PydField(description="The largest device's epsilon at `delta`.")
    p99: float = PydField(description="The 99th percentile device's epsilon at `delta`.")
    median: float = PydField(description="The median device's epsilon at `delta`.")
    basic_max: float = PydField(description="The largest basic sum, for comparison.")
    bounds: dict[str, int] = PydField(
        description="Devices by what their figure is (the bound's name)."
    )
    kind: Kind = PydField(
        description="`running total` (what was actually sent) or `worst case` (the caps' schedule)."
    )
    note: str = PydField(
        description="In a sentence, what the figure guarantees and what it does not."
    )


class SketchAdvice(BaseModel):
    """One sketch's variance against the best known frequency oracle at the same epsilon."""

    part: str = PydField(description="`report`, or SFP's `word` or `fragment`.")
    mechanism: str = PydField(description="`cms` or `hcms`.")
    epsilon: float = PydField(description="The sketch's epsilon per report.")
    variance: float = PydField(
        description="Exact per-report variance of a rare item's estimate (mechanisms.variance)."
    )
    optimal_variance: float = PydField(
        description="The best known oracle's per-report variance at the same epsilon."
    )
    ratio: float = PydField(description="variance / optimal_variance.")
    epsilon_same_accuracy: float = PydField(
        description="The epsilon at which the best known oracle matches it."
    )


class EpsilonAdvice(BaseModel):
    """A use case's mechanism against the best known frequency oracle: the epsilon it wastes."""

    use_case: str = PydField(description="The use case.")
    mechanism: str = PydField(description="`cms`, `hcms` or `sfp`.")
    epsilon_per_report: float = PydField(description="Local epsilon per report.")
    sketches: list[SketchAdvice] = PydField(
        description="Each sketch the use case publishes (SFP: word and fragment)."
    )
    epsilon_same_accuracy: float = PydField(
        description="The epsilon at which the best known frequency oracle is as accurate"
        " (summed over the sketches)."
    )
    wasted_fraction: float = PydField(description="1 - epsilon_same_accuracy / epsilon_per_report.")
    warning: str | None = PydField(
        description="Set when more than a quarter of the epsilon is wasted."
    )
    reference: str = PydField(description="The oracle compared against, and its variance.")


class UseCaseLine(BaseModel):
    """One use case's line of the report."""

    use_case: str = PydField(description="The use case.")
    policy_version: int = PydField(description="The policy version in force.")
    mechanism: str = PydField(description="`cms`, `hcms` or `sfp`.")
    budget: str = PydField(description="The budget its caps count against.")
    shares_budget_with: list[str] = PydField(description="The other use cases of its budget group.")
    epsilon_per_report: float = PydField(description="Epsilon charged per report.")
    reports_per_day: int = PydField(description="The daily cap (reports per device and UTC day).")
    retention_days: int = PydField(description="The retention window, in days.")
    group_size: int = PydField(description="Group-privacy factor (devices per person).")
    epsilon_per_day: float = PydField(
        description="Epsilon one device may spend per day under the caps."
    )
    epsilon_per_window: float = PydField(
        description="Epsilon one device may spend per window under the caps."
    )
    epsilon_per_year: float = PydField(
        description="Epsilon one device may spend per year under the caps."
    )
    group_epsilon_per_day: float = PydField(
        description="Per day for a person with `group_size` devices."
    )
    window_cap: float | None = PydField(description="The window epsilon cap; null: none.")
    lifetime_cap: float | None = PydField(description="The lifetime epsilon cap; null: none.")
    lifetime_bounded: bool = PydField(description="Whether a cap bounds a device's lifetime spend.")
    lifetime_bound: float | None = PydField(
        description=(
            "The lifetime loss bound stated: the larger of the lifetime cap and the most any "
            "device spent on what the budget counts (null: none)."
        )
    )
    lifetime_note: str = PydField(
        description="What bounds (or fails to bound) the lifetime spend, in a sentence."
    )
    spent_window: Spread = PydField(description="What devices actually spent in the window.")
    spent_lifetime: Spread = PydField(
        description="What devices actually spent over their lifetimes."
    )
    spent_budget_lifetime_max: float = PydField(
        default=0.0,
        description=(
            "The most any device spent on what its budget's caps count (its members' history and "
            "every charge made under it)."
        ),
    )
    devices_over_lifetime_cap: int = PydField(
        default=0,
        description=(
            "Devices that spent more than the lifetime cap before it was lowered: it admits "
            "nothing more to them."
        ),
    )
    spent_budget_window_max: float = PydField(
        default=0.0,
        description="The most any device holds in the window on what its budget's caps count.",
    )
    devices_over_window_cap: int = PydField(
        default=0,
        description=(
            "Devices whose window holds more than the window cap (spent before it was lowered): "
            "it admits nothing more to them until enough leaves."
        ),
    )
    window_note: str = PydField(
        default="",
        description="Empty, or why some devices hold more than the window cap, in a sentence.",
    )
    epsilon_advice: EpsilonAdvice | None = PydField(
        default=None,
        description="The mechanism against the best known frequency oracle at equal epsilon, and"
        " the epsilon that would give the same accuracy.",
    )


class DeviceTotals(BaseModel):
    """Totals over all use cases per device: the policies' worst case and the devices' actual.

    ``allowed_*`` compose the caps' worst-case schedule (fixed in advance); ``spent_*`` are
    basic sums and ``device_bound_*`` each device's (epsilon, delta) bound, both running totals.
    """

    allowed_per_day: PrivacyLoss = PydField(
        description="What the caps allow one device per day, all use cases composed."
    )
    allowed_per_window: PrivacyLoss = PydField(
        description="What the caps allow one device per window, composed."
    )
    allowed_per_year: PrivacyLoss = PydField(
        description="What the caps allow one device per year, composed."
    )
    spent_window: Spread = PydField(
        description="What devices actually spent in the window, all use cases (basic sums)."
    )
    spent_lifetime: Spread = PydField(
        description="What devices actually spent over their lifetimes (basic sums)."
    )
    device_bound_window: LossSpread | None = PydField(
        description="Each device's own tight bound over the window; null if none."
    )
    device_bound_lifetime: LossSpread | None = PydField(
        description="Each device's own tight bound over its lifetime; null if none."
    )


class CentralLoss(BaseModel):
    """A central ``(epsilon, delta)`` and how it was composed (``method``), with what it covers."""

    epsilon: float = PydField(description="The central epsilon after shuffling, at `delta`.")
    delta: float = PydField(description="The delta it holds at.")
    sub_batches: int = PydField(description="Sub-batches composed (one report per device each).")
    reports_per_device: int = PydField(description="The reports per device the figure covers.")
    method: str = PydField(description="How the sub-batches were composed.")
    note: str = PydField(
        description="In a sentence, what the figure guarantees and what it does not."
    )
    kind: str = PydField(
        default="fixed schedule",
        description="What the figure is: `one batch`, `fixed schedule` (the smallest sub-batches"
        " composed as a schedule fixed in advance), `running total` (the same for one device's"
        " own reports) or `valid under adaptive choices`.",
    )


class BatchFigure(BaseModel):
    """One batch as published and its own central bound (a device with ``max_per_device``)."""

    published: str = PydField(description="When the batch was published (UTC).")
    first_day: str = PydField(description="The first UTC day its reports were charged on.")
    last_day: str = PydField(description="The last UTC day its reports were charged on.")
    devices: int = PydField(description="Distinct devices in the batch.")
    reports: int = PydField(description="Reports in the batch.")
    max_per_device: int = PydField(description="The most reports one device has in it.")
    layers: list[int] = PydField(
        description="Devices with at least 1, 2, ... reports in it (the sub-batch sizes)."
    )
    untagged: int = PydField(
        description="Reports queued with no device pseudonym (each counted unamplified)."
    )
    epsilon_per_report: float = PydField(description="The largest local epsilon of its reports.")
    min_batch_devices: int = PydField(description="The policy's least devices per published batch.")
    central: CentralLoss | None = PydField(
        description="The batch's own central bound; null when none holds."
    )


class DayFigure(BaseModel):
    """The batches published on one UTC day and their composition for one device.

    ``batches`` lists at most :data:`MAX_BATCHES_SHOWN` of them, the smallest first (those
    bound the figure); ``published`` counts them all, ``devices`` and ``reports`` sum them.
    """

    day: str = PydField(description="The UTC day the batches were published.")
    published: int = PydField(description="Batches published that day.")
    devices: int = PydField(description="Devices summed over those batches.")
    reports: int = PydField(description="Reports summed over those batches.")
    batches: list[BatchFigure] = PydField(
        description="The smallest batches of the day (those bound the figure)."
    )
    composed: CentralLoss | None = PydField(
        description="The day's batches composed for one device; null when none holds."
    )


class CentralLine(BaseModel):
    """One use case's central figures: per day, over the retention window and over a year."""

    use_case: str = PydField(description="The use case.")
    epsilon_per_report: float = PydField(description="Local epsilon per report.")
    reports_per_day: int = PydField(description="The daily cap (reports per device and UTC day).")
    min_batch_devices: int = PydField(description="The policy's least devices per published batch.")
    delta: float = PydField(description="The delta of the central figures.")
    days: list[DayFigure] = PydField(description="Per UTC day with published batches, its figures.")
    window: CentralLoss | None = PydField(
        description="Composed over the retention window; null when none holds."
    )
    year: CentralLoss | None = PydField(description="Composed over a year; null when none holds.")
    preconditions: str = PydField(
        default=PRECONDITIONS,
        description="What the central figures assume (the shuffler's trust model).",
    )
    notes: list[str] = PydField(
        default_factory=list, description="Why a figure is missing or weaker, when it is."
    )
    window_adaptive: CentralLoss | None = PydField(
        default=None,
        description="Over the retention window, valid however batches, policies and reports are"
        " chosen after seeing earlier outputs; null when none holds.",
    )
    year_adaptive: CentralLoss | None = PydField(
        default=None,
        description="Over a year, valid under adaptive choices; null when none holds.",
    )


class EffectiveEpsilonReport(BaseModel):
    """The whole report, with how every figure was computed and when (``computed_at``)."""

    as_of: str = PydField(description="The UTC day the report is for.")
    use_cases: list[UseCaseLine] = PydField(description="One line per active use case.")
    totals: DeviceTotals = PydField(description="Across all use cases, per device.")
    provenance: dict[str, Any] = PydField(
        description="How it was computed: accountant, library versions, delta, settings."
    )
    central: list[CentralLine] = PydField(
        default_factory=list,
        description="Per use case, the central epsilon of its shuffled batches.",
    )
    computed_at: str = PydField(
        default="", description="When its figures were read from the ledger (UTC, ISO 8601)."
    )


class Series(BaseModel):
    """One use case's (or the total's) daily series, aligned with :attr:`Timeline.days`."""

    reports: list[int] = PydField(description="Reports charged per day.")
    epsilon: list[float] = PydField(description="Epsilon charged per day.")
    window: list[float] = PydField(
        description="Epsilon in the retention window ending each day (cumulative)."
    )
    lifetime: list[float] = PydField(
        description="Lifetime epsilon at the end of each day (cumulative)."
    )


class DeviceLoss(BaseModel):
    """One device's cumulative loss per use case and in total, over the window and lifetime.

    Every figure is a running total (``kind``) of what the device actually sent: its basic sum
    is a guarantee (and what the gate enforces); its (epsilon, delta) bound is not, against an
    adaptively chosen sequence (see docs/accounting.md).
    """

    window: dict[str, PrivacyLoss] = PydField(
        default_factory=dict, description="Per use case, the loss over the retention window."
    )
    lifetime: dict[str, PrivacyLoss] = PydField(
        default_factory=dict, description="Per use case, the loss over the device's lifetime."
    )
    window_total: PrivacyLoss | None = PydField(
        default=None, description="All use cases composed, over the window; null without charges."
    )
    lifetime_total: PrivacyLoss | None = PydField(
        default=None, description="All use cases composed, over the lifetime; null without charges."
    )


class Timeline(BaseModel):
    """A device's charges per day and its cumulative epsilon, per use case and in total.

    ``loss`` composes what the device sent as if its schedule had been fixed in advance;
    ``odometer`` is its running total valid however the reports were chosen (docs/odometer.md
    says which to quote when).
    """

    days: list[str] = PydField(
        description="The UTC days (ISO dates), oldest first; every series is aligned with them."
    )
    use_cases: dict[str, Series] = PydField(description="Per use case, its daily series.")
    total: Series = PydField(description="All use cases summed per day.")
    loss: DeviceLoss = PydField(
        description=(
            "The device's composed loss, per use case and in total, as for a schedule fixed in "
            "advance."
        )
    )
    odometer: DeviceOdometer = PydField(
        description=(
            "Its lifetime running total valid however its reports were chosen: the basic sum and "
            "the odometer reading (docs/odometer.md says which to quote when)."
        )
    )
    central: list[CentralLine] = PydField(
        default_factory=list,
        description="Per use case, the central epsilon of the shuffled batches it was in.",
    )


class Distribution(BaseModel):
    """Histogram and quantiles of per-device cumulative epsilon for one use case."""

    use_case: str = PydField(description="The use case.")
    scope: str = PydField(description="`window` (the retention window) or `lifetime`.")
    devices: int = PydField(description="Devices with at least one charge in the scope.")
    quantiles: dict[str, float] = PydField(
        description="p50, p90, p99 and max of per-device epsilon."
    )
    bin_edges: list[float] = PydField(
        description="Histogram bin edges (epsilon), one more than `counts`."
    )
    counts: list[int] = PydField(description="Devices per bin.")


class WhatIf(BaseModel):
    """What a proposed policy would do on the live ledger today; nothing is changed."""

    use_case: str = PydField(description="The use case.")
    current_version: int = PydField(description="The policy version the proposal is compared with.")
    devices_in_window: dict[str, int] = PydField(
        description="Devices with charges in the window, current and proposed."
    )
    refused_next_report_today: dict[str, int] = PydField(
        description="Devices whose next report today would be refused."
    )
    over_window_cap: dict[str, int] = PydField(
        description="Devices over the window cap, current and proposed."
    )
    over_lifetime_cap: dict[str, int] = PydField(
        description="Devices over the lifetime cap, current and proposed."
    )
    effective_epsilon: dict[str, dict[str, Any]] = PydField(
        description="The use case's report line, current and proposed."
    )
    totals_allowed_per_day: dict[str, PrivacyLoss] = PydField(
        description="All use cases composed per day, current and proposed."
    )
    loosens: list[str] = PydField(
        default_factory=list,
        description="What writing the proposal would loosen (it then needs `allow_loosen`).",
    )
