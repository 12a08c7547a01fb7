"""The wire models of a device's budget: its standing per use case and against the device-wide one.

Each mirrors a result of the read side (:mod:`dp_governor.budget`), converted by
:mod:`dp_governor.api.wire`; the API promises these, whatever the read side's objects become.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from pydantic import Field as PydField

__all__ = ["BudgetStatus", "DeviceBudget", "DeviceOdometer", "DeviceWide", "QuotaStatus"]


class QuotaStatus(BaseModel):
    """One use case's spend against its share of the device-wide budget (``None``: no limit)."""

    use_case: str = PydField(description="The use case.")
    share: float | None = PydField(
        description="Its quota: the share of each device-wide limit it may use; null: no quota."
    )
    epsilon_today: float = PydField(description="Epsilon it spent today.")
    epsilon_window: float = PydField(description="Epsilon it spent in the device-wide window.")
    epsilon_lifetime: float = PydField(description="Epsilon it spent over the device's lifetime.")
    today_remaining: float | None = PydField(
        description="Epsilon left today within its quota; null: no limit."
    )
    window_remaining: float | None = PydField(
        description="Epsilon left in the window within its quota; null: no limit."
    )
    lifetime_remaining: float | None = PydField(
        description="Epsilon left for the lifetime within its quota; null: no limit."
    )


class DeviceWide(BaseModel):
    """The device-wide budget in force and what the device has spent of it.

    ``figure`` says what the numbers are: basic (pure, delta 0) composition of each report's
    epsilon times its group size, which holds for any adaptively chosen sequence.
    """

    version: int = PydField(description="The device-wide budget version in force.")
    figure: str = PydField(
        description="What the figures are: basic composition of epsilon x group size (delta 0)."
    )
    epsilon_per_day: float | None = PydField(
        description="Epsilon a device may spend per UTC day across use cases; null: none."
    )
    window_days: int | None = PydField(
        description="Length of the device-wide window in days; null: no window limit."
    )
    window_epsilon: float | None = PydField(
        description="Epsilon a device may spend per window; null: no window limit."
    )
    lifetime_epsilon: float | None = PydField(
        description="Epsilon a device may spend over its lifetime; null: no limit."
    )
    epsilon_today: float = PydField(description="Epsilon this device spent today, all use cases.")
    epsilon_window: float = PydField(
        description="Epsilon it spent in the device-wide window, all use cases."
    )
    epsilon_lifetime: float = PydField(
        description="Epsilon it spent over its lifetime, all use cases."
    )
    today_remaining: float | None = PydField(
        description="Epsilon left today; null without a daily limit."
    )
    window_remaining: float | None = PydField(
        description="Epsilon left in the window; null without a window limit."
    )
    lifetime_remaining: float | None = PydField(
        description="Epsilon left for the lifetime; null without a lifetime limit."
    )
    use_cases: list[QuotaStatus] = PydField(
        description="Each use case's spend against its quota of the device-wide budget."
    )
    window_filter_epsilon: float | None = PydField(
        default=None, description="Window (epsilon, delta) filter target: epsilon; null: none."
    )
    window_filter_delta: float | None = PydField(
        default=None, description="Window (epsilon, delta) filter target: delta; null: none."
    )
    lifetime_filter_epsilon: float | None = PydField(
        default=None, description="Lifetime (epsilon, delta) filter target: epsilon; null: none."
    )
    lifetime_filter_delta: float | None = PydField(
        default=None, description="Lifetime (epsilon, delta) filter target: delta; null: none."
    )


class DeviceOdometer(BaseModel):
    """A device's lifetime running totals and the figures valid under full adaptivity.

    ``basic_epsilon`` is the sum of each report's ``g x eps`` (pure, delta 0);
    ``odometer_epsilon`` the mixture odometer's reading at ``delta``
    (:func:`dp_governor.budget.privacy.odometer.running_epsilon`, never above the basic sum), valid
    at every time at once however the reports were chosen. Both are computed from the row's lifetime
    slots (each slot's epsilon, group size and count: a sufficient statistic, docs/odometer.md,
    "Storage"), in time proportional to the slots, whatever the number of reports.
    """

    reports: int = PydField(description="Reports the device sent over its lifetime.")
    basic_epsilon: float = PydField(
        description="Sum of each report's epsilon x group size (pure, delta 0)."
    )
    odometer_epsilon: float = PydField(
        description="The mixture odometer's running epsilon at `delta`, valid under fully adaptive "
        "composition at every time at once (never above the basic sum)."
    )
    delta: float = PydField(description="The delta the odometer's epsilon holds at.")
    figure: str = PydField(description="What the two figures are, in words.")


class BudgetStatus(BaseModel):
    """A device's standing against one use case's policy.

    Budget-level figures are shared by every use case of a budget group; ``None`` caps are not
    set.
    """

    use_case: str = PydField(description="The use case.")
    budget: str = PydField(
        description="The budget its caps count against (its budget group, else itself)."
    )
    policy_version: int = PydField(description="The policy version in force.")
    epsilon_per_report: float = PydField(description="Epsilon charged for one report.")
    max_reports_per_day: int = PydField(
        description="The daily cap: reports a device may send per UTC day."
    )
    reports_today: int = PydField(
        description="Reports this device sent today (UTC) against this budget."
    )
    reports_left_today: int = PydField(description="Reports it may still send today.")
    epsilon_today: float = PydField(description="Epsilon it spent today against this budget.")
    epsilon_window: float = PydField(
        description="Epsilon it spent in the retention window (basic sum)."
    )
    epsilon_lifetime: float = PydField(
        description="Epsilon it spent over its lifetime (basic sum)."
    )
    window_cap: float | None = PydField(
        description="Epsilon the budget allows per window; null: no window cap."
    )
    window_remaining: float | None = PydField(
        description="Epsilon left in the window; null without a window cap."
    )
    lifetime_cap: float | None = PydField(
        description="Epsilon the budget allows per lifetime; null: no lifetime cap."
    )
    lifetime_remaining: float | None = PydField(
        description="Epsilon left for the lifetime; null without a lifetime cap."
    )
    next_reset: datetime = PydField(
        description="When the daily count starts again (next UTC midnight)."
    )


class DeviceBudget(BaseModel):
    """One device's budget: the device-wide budget first (``null``: none set), then per use case."""

    device_id: str = PydField(description="The device, as in the path.")
    device: DeviceWide | None = PydField(
        default=None,
        description="The device-wide budget that every use case draws from: its limits, what"
        " the device spent and has left today, in its window and over its lifetime, and each"
        " use case against its quota (null: no device-wide budget is set).",
    )
    odometer: DeviceOdometer | None = PydField(
        default=None,
        description="The device's running (epsilon, delta) total under adaptive composition"
        " beside the basic sum (see docs/odometer.md).",
    )
    use_cases: list[BudgetStatus] = PydField(
        description="Its standing against every active use case."
    )
