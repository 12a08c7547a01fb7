"""The device-wide budget's checks: the device's limits, the use case's quota of them, its filters.

Every figure counts group-scaled epsilon (a report of ``eps`` at group size ``g`` counts
``g eps``, basic composition for a group of ``g``: docs/ledger.md) over the device's slots: all
of them for the device-wide limits and filters, the use case's own for its quota. Checked in
order: today (device, quota), the device window (device, quota), the lifetime (device, quota),
then the device's window and lifetime ``(epsilon, delta)`` filters
(:mod:`dp_governor.budget.rule.filter`). Pure code; :func:`dp_governor.budget.rule.decide.check`
calls :func:`device_refusal` after the use case's own checks pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from dp_governor.budget.rule.book import Terms
from dp_governor.budget.rule.filter import filter_refusal, filters_of
from dp_governor.budget.rule.refusal import Refusal, RefusedBy, free_day, within
from dp_governor.budget.rule.state import AccountState
from dp_governor.policies.device import DeviceLimits
from dp_governor.policies.model import from_micro

__all__ = ["DeviceSpend", "device_refusal", "device_spend"]

Rows = list[tuple[int, int, int]]


class DeviceSpend(NamedTuple):
    """A device's group-scaled spend in the device window and over its lifetime.

    ``(day, S1, S2)`` rows (micro-epsilon, micro-epsilon squared) and the lifetime ``S1``,
    over every slot (``all``) and over one use case's slots (``mine``).
    """

    rows_all: Rows
    rows_mine: Rows
    lifetime_all: int
    lifetime_mine: int


def device_spend(
    state: AccountState, day: int, window: int, use_case: str, horizons: Mapping[str, int]
) -> DeviceSpend:
    """What the device-wide budget counts on days ``day - window + 1 .. day`` and ever.

    A slot's days on or before its use case's retention horizon count nowhere (as for every
    cap); lifetime counts carry no days and count always.
    """
    every = list(range(len(state.slots)))
    mine = [i for i in every if state.slots[i][0] == use_case]
    return DeviceSpend(
        state.scaled_window(day, window, every, horizons),
        state.scaled_window(day, window, mine, horizons),
        state.scaled_lifetime(every)[1],
        state.scaled_lifetime(mine)[1],
    )


_Side = tuple[RefusedBy, Rows, int, int | None, int | None, int | None]


def device_refusal(
    terms: Terms, device: DeviceLimits, day: int, state: AccountState
) -> Refusal | None:
    """The device-wide budget's refusal of one more report of ``terms``, or ``None``.

    Each check counts this report in at ``eps x group_size``; a refusal whose limit is below
    that can never free (``retry_day`` ``None``).
    """
    eps = terms.eps_micro * terms.group_size
    name = terms.name
    spend = device_spend(state, day, device.window_days or 1, name, terms.horizons)
    sides: tuple[_Side, ...] = (
        ("device", spend.rows_all, spend.lifetime_all,
         device.day_micro, device.window_micro, device.lifetime_micro),
        ("quota", spend.rows_mine, spend.lifetime_mine,
         device.quota_cap(name, device.day_micro), device.quota_cap(name, device.window_micro),
         device.quota_cap(name, device.lifetime_micro)),
    )  # fmt: skip
    for who, rows, _, cap, _, _ in sides:
        if cap is not None and sum(r[1] for r in rows if r[0] == day) + eps > cap:
            return Refusal("daily_cap", day + 1 if eps <= cap else None, who)
    for who, rows, _, _, cap, _ in sides:
        if cap is not None and device.window_days is not None:
            spent = sum(r[1] for r in rows)
            if spent + eps > cap:
                free = None
                if eps <= cap:
                    free = free_day(rows, day, device.window_days, within(cap, eps))
                return Refusal("window_cap", free, who, window_left=_left(cap, spent))
    for who, _, life, _, _, cap in sides:
        if cap is not None and life + eps > cap:
            return Refusal("lifetime_cap", None, who, lifetime_left=_left(cap, life))
    filters = filters_of(
        (device.window_filter_micro, device.window_filter_delta),
        (device.lifetime_filter_micro, device.lifetime_filter_delta),
        device.window_days,
    )
    if filters is None:
        return None
    every = list(range(len(state.slots)))
    return filter_refusal(filters, state, day, every, eps, terms.horizons, "device")


def _left(cap: int, spent: int) -> float:
    return from_micro(max(0, cap - spent))
