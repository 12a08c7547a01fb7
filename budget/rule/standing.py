"""A device's standing against the device-wide budget: spent and remaining, then per use case.

The figures are the rule's own (:func:`dp_governor.budget.rule.device.device_spend`): basic
composition of group-scaled epsilon (a report of ``eps`` at group size ``g`` counts ``g eps``),
today, over the device window and over the lifetime, with the quota of each use case that has one;
and the device's running odometer reading beside it (:func:`device_odometer`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dp_governor.budget.privacy.odometer import OdometerState, running_epsilon
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.budget.rule.device import device_spend
from dp_governor.budget.rule.state import AccountState
from dp_governor.policies.model import from_micro

__all__ = ["DeviceOdometer", "DeviceWide", "QuotaStatus", "device_odometer", "device_wide"]


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """One use case's spend against its share of the device-wide budget (``None``: no limit)."""

    use_case: str
    share: float | None
    epsilon_today: float
    epsilon_window: float
    epsilon_lifetime: float
    today_remaining: float | None
    window_remaining: float | None
    lifetime_remaining: float | None


@dataclass(frozen=True, slots=True)
class DeviceWide:
    """The device-wide budget in force and what the device has spent of it.

    ``figure`` says what the numbers are: basic (pure, delta 0) composition of each report's
    epsilon times its group size, which holds for any adaptively chosen sequence.
    """

    version: int
    figure: str
    epsilon_per_day: float | None
    window_days: int | None
    window_epsilon: float | None
    lifetime_epsilon: float | None
    epsilon_today: float
    epsilon_window: float
    epsilon_lifetime: float
    today_remaining: float | None
    window_remaining: float | None
    lifetime_remaining: float | None
    use_cases: list[QuotaStatus]
    window_filter_epsilon: float | None = None
    window_filter_delta: float | None = None
    lifetime_filter_epsilon: float | None = None
    lifetime_filter_delta: float | None = None


FIGURE = "basic composition of epsilon x group_size (pure DP, delta 0; valid under adaptivity)"


def _left(cap: int | None, spent: int) -> float | None:
    return None if cap is None else from_micro(max(0, cap - spent))


def _float(micro: int | None) -> float | None:
    return None if micro is None else from_micro(micro)


def device_wide(book: PolicyBook, state: AccountState, day: int) -> DeviceWide | None:
    """The device's standing on ``day`` (``None``: no device-wide budget in force)."""
    device = book.device
    if device is None:
        return None
    window = device.window_days or 1
    names = sorted({str(s[0]) for s in state.slots} | {p.name for p in book.active})
    overall = device_spend(state, day, window, "", book.horizons)
    today = sum(r[1] for r in overall.rows_all if r[0] == day)
    in_window = sum(r[1] for r in overall.rows_all) if device.window_days else 0
    lines = []
    for name in names:
        own = device_spend(state, day, window, name, book.horizons)
        t = sum(r[1] for r in own.rows_mine if r[0] == day)
        w = sum(r[1] for r in own.rows_mine) if device.window_days else 0
        share = device.quotas.get(name)
        lines.append(
            QuotaStatus(
                use_case=name,
                share=None if share is None else from_micro(share),
                epsilon_today=from_micro(t),
                epsilon_window=from_micro(w),
                epsilon_lifetime=from_micro(own.lifetime_mine),
                today_remaining=_left(device.quota_cap(name, device.day_micro), t),
                window_remaining=_left(device.quota_cap(name, device.window_micro), w),
                lifetime_remaining=_left(
                    device.quota_cap(name, device.lifetime_micro), own.lifetime_mine
                ),
            )
        )
    return DeviceWide(
        version=device.version,
        figure=FIGURE,
        epsilon_per_day=_float(device.day_micro),
        window_days=device.window_days,
        window_epsilon=_float(device.window_micro),
        lifetime_epsilon=_float(device.lifetime_micro),
        epsilon_today=from_micro(today),
        epsilon_window=from_micro(in_window),
        epsilon_lifetime=from_micro(overall.lifetime_all),
        today_remaining=_left(device.day_micro, today),
        window_remaining=_left(device.window_micro, in_window),
        lifetime_remaining=_left(device.lifetime_micro, overall.lifetime_all),
        use_cases=lines,
        window_filter_epsilon=_float(device.window_filter_micro),
        window_filter_delta=device.window_filter_delta,
        lifetime_filter_epsilon=_float(device.lifetime_filter_micro),
        lifetime_filter_delta=device.lifetime_filter_delta,
    )


@dataclass(frozen=True, slots=True)
class DeviceOdometer:
    """A device's lifetime running totals and the figures valid under full adaptivity.

    ``basic_epsilon`` is the sum of each report's ``g x eps`` (pure, delta 0);
    ``odometer_epsilon`` the mixture odometer's reading at ``delta``
    (:func:`dp_governor.budget.privacy.odometer.running_epsilon`, never above the basic sum), valid
    at every time at once however the reports were chosen. Both are computed from the row's lifetime
    slots (each slot's epsilon, group size and count: a sufficient statistic, docs/odometer.md,
    "Storage"), in time proportional to the slots, whatever the number of reports.
    """

    reports: int
    basic_epsilon: float
    odometer_epsilon: float
    delta: float
    figure: str


ODOMETER_DELTA = 1e-9


def device_odometer(state: AccountState, delta: float = ODOMETER_DELTA) -> DeviceOdometer:
    """The odometer of the running totals ``n``, ``S1``, ``S2`` of group-scaled epsilons."""
    n, s1, s2 = state.scaled_lifetime(list(range(len(state.slots))))
    totals = OdometerState(n, s1, s2)
    return DeviceOdometer(
        reports=n,
        basic_epsilon=totals.epsilon_sum,
        odometer_epsilon=running_epsilon(totals, delta),
        delta=delta,
        figure=(
            "lifetime, every use case, epsilon x group_size: basic sum (delta 0) and the"
            " mixture odometer at delta (Whitehouse, Ramdas, Rogers, Wu 2023), both valid"
            " under full adaptivity"
        ),
    )
