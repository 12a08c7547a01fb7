"""Shuffled batches as published, and the central ``(epsilon, delta)`` they give, per use case.

The inbox flush records each batch it publishes in ``shuffled_batches``: its use case, the UTC
day it was published, the days its reports were charged on, the number of distinct devices
``n``, the reports, the most reports one device has in it, the per-layer device counts and the
largest local epsilon of its reports. No device identifier, pseudonym or report id. A batch
holds one parameter set and its reports are stored under one day, so the batch is what hides
each of its reports; batches published before revision 0009 were stored in parts by charge day
and parameters, and those that may have had several (``split``) count as unamplified: each of
their reports is a sub-batch of one device, at its local epsilon.

A batch is dated by the day it was published, not by its reports' charge days: a day's privacy
claims are appended once the day has ended and never change (``claims.py``), so a batch
published later (a day's tail that joined the next day's reports, or reports the flush reached
after midnight) must count on the day it appeared, or a claim already published would leave it
out. The report's lines list each batch's charge days when they differ.

A device with ``j`` reports in one batch: the published multiset is a post-processing (the
union) of ``k`` sub-batches, sub-batch ``i`` holding the ``i``-th report of every device with
at least ``i`` reports (``layers[i - 1]`` devices, one report each). Each sub-batch is an
FMT21-amplified shuffle of one report per device, and the device's reports are randomized with
independent coins, so its loss in the batch is the composition of its sub-batches' losses
(sequential composition; dp-accounting PLD,
:func:`dp_governor.budget.privacy.amplification.compose_shuffled`).

Across batches: a batch that holds none of a device's reports does not depend on its data
(which batch a report lands in depends on when it arrived, not on what it says), so a device
that sent ``R`` reports is in at most ``R`` sub-batches. Every sub-batch with fewer devices is
a dominating pair of one with more (the missing clones are independent fair coins added
afterwards), so composing the ``R`` smallest sub-batches of a horizon, each at the horizon's
largest local epsilon, bounds every device of the use case that sent at most ``R`` reports
(``R`` = the policy's reports per day times the days the batches' reports were charged on).
Sizes are rounded down to a grid of ``2^(1/8)`` steps (never up: smaller ``n`` is weaker) so
a year of batches composes a few distinct pairs, memoized.

Every figure says what it is (``kind``): ``one batch`` (a batch's own bound);
``fixed schedule`` (the ``R`` smallest sub-batches composed: the PLD of their FMT21 pairs, tight
for a schedule fixed in advance up to the grid, and valid when which batches a device's reports
land in and how large they are does not depend on what was published); ``running total`` (the
same, for the reports one device actually sent); ``valid under adaptive choices`` (``R`` copies
of the horizon's smallest sub-batch composed: each of a device's at most ``R`` reports, ``R``
capped by the gate, is dominated by that one pair whatever was chosen after seeing earlier
outputs, so the adaptive composition of dominating pairs applies; Zhu, Dong and Wang,
"Optimal accounting of differential privacy via characteristic function", AISTATS 2022).

A batch's record is checked before it counts (``layers`` positive and non-increasing, as many
as ``max_per_device``, the first equal to ``devices``, their sum plus ``untagged`` equal to
``reports``): a record that fails (a damaged or hand-edited row) hides nobody, and each of its
reports counts as a sub-batch of one device, with a note.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import orjson
from sqlalchemy import Engine, select

from dp_governor.budget.clock import day_date
from dp_governor.budget.privacy.display import fmt_up
from dp_governor.budget.privacy.sub_batches import compose_sizes
from dp_governor.budget.storage.tables import ShuffledBatch
from dp_governor.policies.model import Policy, from_micro

__all__ = [
    "ADAPTIVE",
    "DAYS_PER_YEAR",
    "FIXED_SCHEDULE",
    "MAX_BATCHES_SHOWN",
    "ONE_BATCH",
    "PRECONDITIONS",
    "RUNNING_TOTAL",
    "BatchFigure",
    "CentralLine",
    "CentralLoss",
    "DayFigure",
    "batch_central",
    "central_figures",
    "central_line",
    "central_lines",
    "consistent",
    "read_batches",
    "render_central",
]

DAYS_PER_YEAR: Final = 365
PRECONDITIONS: Final = (
    "Central figures hold only if: the shuffler is honest (it strips identities and order, and"
    " the adversary sees neither its input nor any link from a stored report to a device); n"
    " counts distinct devices the adversary does not control (devices it controls or whose"
    " inputs it knows hide no one, so subtract them); each report is randomized with fresh"
    " coins and is epsilon-per-report-LDP; which batch a report lands in does not depend on its"
    " content. A device with several reports in a batch is accounted layer by layer (sub-batch"
    " i holds every device's i-th report). The local epsilon per report holds whatever happens."
)
MAX_BATCHES_SHOWN: Final = 24  # a day's batches listed one by one (frequent flushes make many)
ONE_BATCH: Final = "one batch"
FIXED_SCHEDULE: Final = "fixed schedule"
RUNNING_TOTAL: Final = "running total"
ADAPTIVE: Final = "valid under adaptive choices"
KIND_NOTES: Final = {
    ONE_BATCH: "one batch's own bound, its layers composed",
    FIXED_SCHEDULE: "the smallest sub-batches composed as a schedule fixed in advance (PLD of"
    " their FMT21 pairs): valid when the batches a device's reports land in, and their sizes,"
    " do not depend on published outputs",
    RUNNING_TOTAL: "the reports this device sent, composed over as many of the smallest"
    " sub-batches as a schedule fixed in advance",
    ADAPTIVE: "the policy's cap of reports, each at the smallest sub-batch of the horizon:"
    " valid however batches, policies and reports are chosen after seeing earlier outputs",
}


@dataclass(frozen=True, slots=True)
class CentralLoss:
    """A central ``(epsilon, delta)`` and how it was composed (``method``), with what it covers."""

    epsilon: float
    delta: float
    sub_batches: int
    reports_per_device: int
    method: str
    note: str
    kind: str = FIXED_SCHEDULE


@dataclass(frozen=True, slots=True)
class BatchFigure:
    """One batch as published and its own central bound (a device with ``max_per_device``)."""

    published: str
    first_day: str
    last_day: str
    devices: int
    reports: int
    max_per_device: int
    layers: list[int]
    untagged: int
    epsilon_per_report: float
    min_batch_devices: int
    central: CentralLoss | None


@dataclass(frozen=True, slots=True)
class DayFigure:
    """The batches published on one UTC day and their composition for one device.

    ``batches`` lists at most :data:`MAX_BATCHES_SHOWN` of them, the smallest first (those
    bound the figure); ``published`` counts them all, ``devices`` and ``reports`` sum them.
    """

    day: str
    published: int
    devices: int
    reports: int
    batches: list[BatchFigure]
    composed: CentralLoss | None


@dataclass(frozen=True, slots=True)
class CentralLine:
    """One use case's central figures: per day, over the retention window and over a year."""

    use_case: str
    epsilon_per_report: float
    reports_per_day: int
    min_batch_devices: int
    delta: float
    days: list[DayFigure]
    window: CentralLoss | None
    year: CentralLoss | None
    preconditions: str = PRECONDITIONS
    notes: list[str] = field(default_factory=list)
    window_adaptive: CentralLoss | None = None
    year_adaptive: CentralLoss | None = None


def read_batches(engine: Engine, first_day: int) -> list[ShuffledBatch]:
    """Every batch published on or after ``first_day``, oldest first."""
    table = ShuffledBatch.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        rows = conn.execute(
            select(table).where(table.c.day >= first_day).order_by(table.c.day, table.c.id)
        ).all()
    return [ShuffledBatch.model_construct(**r._mapping) for r in rows]  # our own rows


def _worst(
    batches: Sequence[ShuffledBatch],
    reports_per_device: int,
    delta: float,
    what: str,
    kind: str = FIXED_SCHEDULE,
) -> CentralLoss | None:
    """The ``reports_per_device`` smallest sub-batches of ``batches``, composed (module doc).

    Reports whose devices were not counted (``untagged``: queued without a device pseudonym;
    every report of a ``split`` batch, whose parts were not counted) may each be a device's
    report in a sub-batch of one: each enters as a sub-batch of size 1 (no amplification, the
    local epsilon), up to ``reports_per_device`` of them a batch. ``None`` when no batch
    counted its devices: no amplification is claimed at all. With ``kind`` :data:`ADAPTIVE`,
    ``reports_per_device`` copies of the smallest sub-batch are composed instead.
    """
    if not batches or all(_uncounted(b) >= b.reports for b in batches):
        return None
    eps0 = max(from_micro(b.epsilon_micro) for b in batches)
    want = max(1, reports_per_device)
    sizes = sorted(
        [n for b in batches if _counted(b) for n in orjson.loads(b.layers)]
        + [1] * sum(min(_uncounted(b), want) for b in batches)
    )
    taken = sizes[:want] if kind != ADAPTIVE else [sizes[0]] * want
    epsilon, method = compose_sizes(eps0, taken, delta)
    alone = taken.count(1)
    why = []
    if any(b.untagged for b in batches):
        why.append("queued without a device pseudonym")
    if any(b.split for b in batches):
        why.append("of batches published in parts before revision 0009")
    if any(not b.split and not consistent(b) for b in batches):
        why.append("of batches whose records fail the check of their device counts")
    unamplified = (
        f"; {alone} of them reports {' or '.join(why)}, counted unamplified" if why else ""
    )
    which = (
        f"{len(taken)} copies of the smallest of {len(sizes)} sub-batches"
        if kind == ADAPTIVE
        else f"the {len(taken)} smallest of {len(sizes)} sub-batches"
    )
    return CentralLoss(
        epsilon=epsilon,
        delta=delta,
        sub_batches=len(taken),
        reports_per_device=reports_per_device,
        method=method,
        note=(
            f"{what}, {kind}: a device with at most {reports_per_device} report(s) in these"
            f" batches, composed over {which} (sizes {taken[0]:,}..{taken[-1]:,} devices,"
            f" rounded down), local epsilon {eps0:g} each{unamplified}; {KIND_NOTES[kind]}"
        ),
        kind=kind,
    )


def consistent(batch: ShuffledBatch) -> bool:
    """Whether a batch's record satisfies the counts the flush writes (the module docstring).

    >>> consistent(ShuffledBatch(devices=3, reports=5, max_per_device=2, layers="[3, 2]"))
    True
    >>> consistent(ShuffledBatch(devices=3, reports=5, max_per_device=2, layers="[2, 3]"))
    False
    """
    try:
        layers = orjson.loads(batch.layers)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(layers, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in layers
    ):
        return False
    if any(a < b for a, b in itertools.pairwise(layers)) or len(layers) != batch.max_per_device:
        return False
    first = layers[0] if layers else 0
    return first == batch.devices and sum(layers) + batch.untagged == batch.reports


def _counted(batch: ShuffledBatch) -> bool:
    return not batch.split and consistent(batch)


def _uncounted(batch: ShuffledBatch) -> int:
    """The batch's reports whose devices were not counted (all of a ``split`` batch's)."""
    return batch.untagged if _counted(batch) else batch.reports


def _covered_days(batches: Sequence[ShuffledBatch]) -> int:
    return max(b.last_day for b in batches) - min(b.first_day for b in batches) + 1


def batch_central(batch: ShuffledBatch, delta: float) -> CentralLoss | None:
    """A batch's own central bound: a device with ``max_per_device`` reports in it."""
    return _worst([batch], batch.max_per_device, delta, "this batch", ONE_BATCH)


def _figure(batch: ShuffledBatch, delta: float) -> BatchFigure:
    layers = [int(n) for n in orjson.loads(batch.layers)] if consistent(batch) else []
    return BatchFigure(
        published=day_date(batch.day).isoformat(),
        first_day=day_date(batch.first_day).isoformat(),
        last_day=day_date(batch.last_day).isoformat(),
        devices=batch.devices,
        reports=batch.reports,
        max_per_device=batch.max_per_device,
        layers=layers,
        untagged=batch.untagged,
        epsilon_per_report=from_micro(batch.epsilon_micro),
        min_batch_devices=batch.min_batch_devices,
        central=batch_central(batch, delta),
    )


def central_line(
    policy: Policy,
    versions: Sequence[Policy],
    batches: Sequence[ShuffledBatch],
    today: int,
    *,
    reports: tuple[int, int] | None = None,
    delta: float | None = None,
) -> CentralLine:
    """A use case's central figures as of ``today`` from its published ``batches``.

    ``versions`` are every version of the use case (the largest reports per day bounds a
    device's reports); ``reports`` gives one device's own report counts instead, in the window
    and over a year (the device audit); ``delta`` defaults to the policy's.
    """
    delta = policy.delta if delta is None else delta
    per_day = max(v.max_reports_per_day for v in [policy, *versions])
    mine = [b for b in batches if b.use_case == policy.name and b.day <= today]
    window = [b for b in mine if b.day > today - policy.retention_days]
    year = [b for b in mine if b.day > today - DAYS_PER_YEAR]
    by_day: dict[int, list[ShuffledBatch]] = {}
    for b in window:
        by_day.setdefault(b.day, []).append(b)
    days = []
    for day, group in sorted(by_day.items()):
        bound = per_day * _covered_days(group)
        shown = sorted(group, key=lambda b: (b.devices, b.reports))[:MAX_BATCHES_SHOWN]
        days.append(
            DayFigure(
                day=day_date(day).isoformat(),
                published=len(group),
                devices=sum(b.devices for b in group),
                reports=sum(b.reports for b in group),
                batches=[_figure(b, delta) for b in sorted(shown, key=lambda b: b.id or 0)],
                composed=_worst(group, bound, delta, "batches published this day"),
            )
        )
    notes = []
    if any(b.untagged for b in mine):
        notes.append(
            "some batches hold reports queued without a device pseudonym (by a release before"
            " every report carried one): their devices were not counted, so each"
            " such report counts as a sub-batch of one device (its local epsilon, no"
            " amplification) in the figures that include it; a batch of such reports alone"
            " has no central figure"
        )
    if any(b.split for b in mine):
        notes.append(
            "some batches were published before schema revision 0009, in parts by charge day and"
            " parameters, and a part could be smaller than its batch (as small as one report),"
            " while their records count the whole batch's devices: what hid each of their"
            " reports is not known, so each counts as a sub-batch of one device (its local"
            " epsilon, no amplification) in the figures that include it"
        )

    if any(not b.split and not consistent(b) for b in mine):
        notes.append(
            "some batch records fail the check of their device counts (layers positive and"
            " non-increasing, the first equal to the devices, their sum plus the untagged"
            " reports equal to the reports): each of their reports counts as a sub-batch of"
            " one device (its local epsilon, no amplification)"
        )

    def horizon(group: list[ShuffledBatch], what: str, own: int | None) -> CentralLoss | None:
        if not group or own == 0:
            return None
        if own is None:
            return _worst(group, per_day * _covered_days(group), delta, what)
        return _worst(group, own, delta, what, RUNNING_TOTAL)

    def adaptive(group: list[ShuffledBatch], what: str) -> CentralLoss | None:
        if not group:
            return None
        return _worst(group, per_day * _covered_days(group), delta, what, ADAPTIVE)

    window_what = f"retention window ({policy.retention_days} days)"
    year_what = f"year ({DAYS_PER_YEAR} days)"

    return CentralLine(
        use_case=policy.name,
        epsilon_per_report=policy.epsilon_per_report,
        reports_per_day=per_day,
        min_batch_devices=policy.min_batch_devices,
        delta=delta,
        days=days,
        window=horizon(window, window_what, None if reports is None else reports[0]),
        year=horizon(year, year_what, None if reports is None else reports[1]),
        notes=notes,
        window_adaptive=adaptive(window, window_what),
        year_adaptive=adaptive(year, year_what),
    )


def central_lines(
    latest: Mapping[str, Policy],
    versions: Mapping[str, Sequence[Policy]],
    batches: Sequence[ShuffledBatch],
    today: int,
) -> list[CentralLine]:
    """:func:`central_line` of every active use case with a batch published in the last year."""
    published = {b.use_case for b in batches if today - DAYS_PER_YEAR < b.day <= today}
    return [
        central_line(p, versions.get(name, []), batches, today)
        for name, p in sorted(latest.items())
        if p.active and name in published
    ]


def central_figures(engine: Engine, versions: Sequence[Policy], today: int) -> list[CentralLine]:
    """Every active use case's central figures from the batches of the last year."""
    by_name: dict[str, list[Policy]] = {}
    for p in versions:
        by_name.setdefault(p.name, []).append(p)
    latest = {name: max(ps, key=lambda p: p.version) for name, ps in by_name.items()}
    batches = read_batches(engine, today - DAYS_PER_YEAR + 1)
    return central_lines(latest, by_name, batches, today)


def _loss(loss: CentralLoss | None) -> str:
    return "n/a" if loss is None else f"({fmt_up(loss.epsilon, 4)}, {loss.delta:g})"


def _charged(batch: BatchFigure) -> str:
    """The days a batch's reports were charged on, when not only the day it was published.

    >>> from dataclasses import replace
    >>> one = BatchFigure("2026-11-27", "2026-11-26", "2026-11-26", 1, 1, 1, [1], 0, 4.0, 1, None)
    >>> _charged(one), _charged(replace(one, last_day="2026-11-27"))
    ('; charged 2026-11-26', '; charged 2026-11-26 to 2026-11-27')
    """
    if batch.first_day == batch.last_day == batch.published:
        return ""
    if batch.first_day == batch.last_day:
        return f"; charged {batch.first_day}"
    return f"; charged {batch.first_day} to {batch.last_day}"


def render_central(lines: Sequence[CentralLine]) -> list[str]:
    """The central figures as plain-text lines (the report's text form)."""
    if not lines:
        return []
    out = [
        "",
        "Central (epsilon, delta) after shuffling (FMT21 Theorem 3.2 per sub-batch, composed"
        " with dp-accounting PLD), per use case:",
    ]
    for line in lines:
        method = line.window.method if line.window else "no batch published"
        out.append(
            f"  {line.use_case}: local {line.epsilon_per_report:g} per report, at most"
            f" {line.reports_per_day}/day, batches of >= {line.min_batch_devices} devices;"
            f" window {_loss(line.window)}, year {_loss(line.year)}"
            f" [{line.window.kind if line.window else 'n/a'}; {method}];"
            f" {ADAPTIVE}: window {_loss(line.window_adaptive)},"
            f" year {_loss(line.year_adaptive)}"
        )
        for day in line.days:
            sizes = ", ".join(
                f"{b.devices:,} devices/{b.reports:,} reports (k<={b.max_per_device}{_charged(b)})"
                for b in day.batches
            )
            more = (
                f" (the {len(day.batches)} smallest of {day.published})"
                if day.published > len(day.batches)
                else ""
            )
            out.append(f"    {day.day}: {sizes}{more}; composed {_loss(day.composed)}")
        out += [f"    note: {n}" for n in line.notes]
    out.append("  " + PRECONDITIONS)
    return out
