"""The rule: a device's next report under a use case's terms, accepted or refused, and why.

Pure code, no I/O. :func:`check` asks whether one more report of ``terms`` fits a device's
state: the daily cap (the budget's members' reports today), the window cap (their epsilon on
the days of the window, none on or before a use case's retention horizon) and the lifetime cap
(their epsilon ever), in that order; then, when a device-wide budget is in force
(``terms.device``), the device's group-scaled epsilon today, in its window and ever, each
against the device-wide limit and then against the use case's quota of it, and last its
lifetime ``(epsilon, delta)`` filter: a report is admitted if the basic sum stays within
``epsilon`` or the advanced-composition filter's ``S2`` within its cap
(:func:`budget.odometer.admit_either`, the same condition in exact integers). A refusal names the
budget that refused (``refused_by``: ``use_case``, ``group``, ``device`` or ``quota``) and when
it frees (``retry_at``; ``None``: never). :func:`decide_on` also charges the state in memory.
The gate's transaction (:mod:`budget.batch`), what-if and the tests all decide here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal, NamedTuple

from budget.book import Terms
from budget.clock import day_start
from budget.odometer import Target, filter_cap_sq
from budget.state import AccountState
from policies.device import DeviceLimits
from policies.model import from_micro

__all__ = ["Decision", "Reason", "RefusedBy", "check", "decide", "decide_on", "device_spend"]

Reason = Literal["accepted", "daily_cap", "window_cap", "lifetime_cap", "lifetime_filter"]
RefusedBy = Literal["use_case", "group", "device", "quota"]


class Decision(NamedTuple):
    """The gate's answer, with what was requested and what remains (``None``: no such cap).

    ``retry_at`` is when the next report for this budget becomes possible after a refusal
    (``None`` after a lifetime refusal: never); ``refused_by`` which budget refused: the use
    case's own caps, its group's, the device-wide budget or the use case's quota within it
    (``reason`` says which of its limits: the day's, the window's or the lifetime's). An
    immutable named tuple rather than a frozen
    dataclass: a relay's batch builds one per report, and a frozen dataclass costs five times
    as much to build (1.4 against 0.3 us).
    """

    accepted: bool
    reason: Reason
    use_case: str
    budget: str
    policy_version: int
    epsilon: float
    day: int
    charge_id: int | None = None
    retry_at: datetime | None = None
    reports_left_today: int = 0
    window_remaining: float | None = None
    lifetime_remaining: float | None = None
    replayed: bool = False
    refused_by: RefusedBy | None = None

    def to_json(self) -> str:
        """Serialise for the idempotency record."""
        data = self._asdict()
        data["retry_at"] = self.retry_at.isoformat() if self.retry_at else None
        data.pop("replayed")
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, replayed: bool = True) -> Decision:
        """Inverse of :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        if data["retry_at"] is not None:
            data["retry_at"] = datetime.fromisoformat(data["retry_at"])
        return cls(**data, replayed=replayed)


def check(terms: Terms, day: int, state: AccountState, charge_id: int | None = None) -> Decision:
    """:func:`decide` on a device's state for one more report of ``terms``; nothing changes.

    The budget's caps count the slots of its members (``terms.members``), whatever budget they
    were charged under. The charge transaction and what-if both decide here.
    """
    idx = state.members(terms.members)
    reports = state.reports_on(day, idx)
    window_rows = _no_window
    if terms.window_cap_micro is not None:

        def window_rows() -> list[tuple[int, int]]:  # with this report counted today
            rows = state.window(day, terms.retention_days, idx, terms.horizons)
            out = [(d, e) for d, e in rows if d != day]
            out.append((day, sum(e for d, e in rows if d == day) + terms.eps_micro))
            return out

    decision = decide(
        terms,
        day,
        reports_today=reports + 1 if reports < terms.max_reports_per_day else None,
        window_rows=window_rows,
        lifetime_after=state.lifetime_spend(idx) + terms.eps_micro,
        charge_id=charge_id,
    )
    if terms.device is None or not decision.accepted:
        return decision
    return _device_check(terms, terms.device, day, state) or decision


class DeviceSpend(NamedTuple):
    """A device's group-scaled micro-epsilon in the device window and over its lifetime.

    ``(day, spend)`` rows and the lifetime total, over every slot (``all``) and over one use
    case's slots (``mine``).
    """

    rows_all: list[tuple[int, int]]
    rows_mine: list[tuple[int, int]]
    lifetime_all: int
    lifetime_mine: int


def device_spend(
    state: AccountState, day: int, window: int, use_case: str, horizons: Mapping[str, int]
) -> DeviceSpend:
    """What the device-wide budget counts: each slot's reports x epsilon x group size.

    Days ``day - window + 1 .. day``; a slot's days on or before its use case's retention
    horizon count nowhere (as for every cap). Basic composition: a report of ``eps`` for a
    group of ``g`` records is ``g eps``-DP for the group (docs/ledger.md).
    """
    slots = state.slots
    weight = [int(s[1]) * int(s[2]) for s in slots]
    mine = [s[0] == use_case for s in slots]
    lows = [horizons.get(str(s[0]), -(1 << 62)) for s in slots]
    low = day - window
    rows_all: list[tuple[int, int]] = []
    rows_mine: list[tuple[int, int]] = []
    for entry in state.days:
        d = entry[0]
        if not low < d <= day:
            continue
        total = own = 0
        for i, n in enumerate(entry[1:]):
            if n and d > lows[i]:
                total += n * weight[i]
                if mine[i]:
                    own += n * weight[i]
        if total:
            rows_all.append((d, total))
        if own:
            rows_mine.append((d, own))
    life_all = life_mine = 0
    for i, s in enumerate(slots):
        spent = weight[i] * int(s[3])
        life_all += spent
        if mine[i]:
            life_mine += spent
    return DeviceSpend(rows_all, rows_mine, life_all, life_mine)


_Side = tuple[RefusedBy, list[tuple[int, int]], int, int | None, int | None, int | None]


def _device_check(
    terms: Terms, device: DeviceLimits, day: int, state: AccountState
) -> Decision | None:
    """The device-wide budget and the use case's quota of it; a refusal, or ``None``.

    Checked in order: today (device, quota), the window (device, quota), the lifetime
    (device, quota). Each counts this report in at ``eps x group_size``; a refusal whose
    limit is below that can never free (``retry_at`` ``None``).
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
        if cap is not None and sum(e for d, e in rows if d == day) + eps > cap:
            retry = day_start(day + 1) if eps <= cap else None
            return _refused(terms, day, "daily_cap", retry, refused_by=who)
    for who, rows, _, _, cap, _ in sides:
        if cap is not None and device.window_days is not None:
            spent = sum(e for _, e in rows) + eps
            if spent > cap:
                tentative = [(d, e) for d, e in rows if d != day]
                tentative.append((day, sum(e for d, e in rows if d == day) + eps))
                free = _window_retry_day(tentative, day, device.window_days, eps, cap)
                left = from_micro(max(0, cap - (spent - eps)))
                retry = day_start(free) if eps <= cap else None
                return _refused(terms, day, "window_cap", retry, window=left, refused_by=who)
    for who, _, life, _, _, cap in sides:
        if cap is not None and life + eps > cap:
            left = from_micro(max(0, cap - life))
            return _refused(terms, day, "lifetime_cap", None, lifetime=left, refused_by=who)
    if device.filter_micro is not None and device.filter_delta is not None:
        s2 = sum(int(s[3]) * (int(s[1]) * int(s[2])) ** 2 for s in state.slots)
        target = (device.filter_micro, device.filter_delta)
        if spend.lifetime_all + eps > device.filter_micro and s2 + eps * eps > _v_star(target):
            return _refused(terms, day, "lifetime_filter", None, refused_by="device")
    return None


@functools.lru_cache(maxsize=64)
def _v_star(target: tuple[int, float]) -> int:
    """The advanced-composition filter's cap on ``S2`` (micro-epsilon squared, rounded down)."""
    return filter_cap_sq(Target(from_micro(target[0]), target[1]))


def decide_on(
    terms: Terms, day: int, state: AccountState, charge_id: int | None = None
) -> Decision:
    """:func:`check`, then an acceptance charges ``state`` in memory (days past horizons cleared).

    The charge transaction (:func:`budget.batch.charge_batch`, a single report being a batch of
    one) decides every report here; it writes the state.
    """
    decision = check(terms, day, state, charge_id)
    if decision.accepted:
        state.charge(terms.name, day, terms.eps_micro, terms.group_size)
        state.prune(terms.horizons)
    return decision


def _no_window() -> list[tuple[int, int]]:
    raise AssertionError("asked for the window of a policy without a window cap")


def decide(
    terms: Terms,
    day: int,
    *,
    reports_today: int | None,
    window_rows: Callable[[], list[tuple[int, int]]],
    lifetime_after: int,
    charge_id: int | None = None,
) -> Decision:
    """The gate's verdict on one report, given the state with the report counted in.

    ``reports_today`` is today's count including this report, or ``None`` when it would pass
    the daily cap (:func:`check` counts the budget's members' reports today on the device's
    state); ``window_rows`` gives ``(day, micro-epsilon)`` spends in the window including this
    report (asked only when a window cap is set); ``lifetime_after`` is the budget's lifetime
    micro-epsilon including it; ``charge_id`` goes into an acceptance. Checks run daily,
    window, lifetime; every decision, the charge transaction's and what-if's, comes here
    through :func:`check`.
    """
    if reports_today is None:
        return _refused(terms, day, "daily_cap", day_start(day + 1))
    eps = terms.eps_micro
    window_remaining: float | None = None
    window_cap = terms.window_cap_micro
    if window_cap is not None:
        rows = window_rows()
        spent = sum(e for _, e in rows)
        if spent > window_cap:
            retry = _window_retry_day(rows, day, terms.retention_days, eps, window_cap)
            left = from_micro(window_cap - (spent - eps))
            return _refused(terms, day, "window_cap", day_start(retry), window=left)
        window_remaining = from_micro(window_cap - spent)
    lifetime_remaining: float | None = None
    lifetime_cap = terms.lifetime_cap_micro
    if lifetime_cap is not None:
        if lifetime_after > lifetime_cap:
            left = from_micro(lifetime_cap - (lifetime_after - eps))
            return _refused(terms, day, "lifetime_cap", None, lifetime=left)
        lifetime_remaining = from_micro(lifetime_cap - lifetime_after)
    return Decision(
        True, "accepted", terms.name, terms.budget, terms.version, terms.epsilon, day,
        charge_id, None, terms.max_reports_per_day - reports_today, window_remaining,
        lifetime_remaining,
    )  # fmt: skip


def _refused(
    terms: Terms,
    day: int,
    reason: Reason,
    retry_at: datetime | None,
    window: float | None = None,
    lifetime: float | None = None,
    refused_by: RefusedBy | None = None,
) -> Decision:
    if refused_by is None:
        refused_by = "use_case" if terms.budget == terms.name else "group"
    return Decision(
        False, reason, terms.name, terms.budget, terms.version, terms.epsilon, day,
        None, retry_at, 0, window, lifetime, False, refused_by,
    )  # fmt: skip


def _window_retry_day(
    rows: list[tuple[int, int]], day: int, retention: int, eps: int, cap: int
) -> int:
    """The first day a report of ``eps`` fits the window cap again, after today's attempt.

    Spends drop out of the window ``retention`` days after their day; today's tentative
    report (``eps``, counted in ``rows``) is not.
    """
    spends = sorted((d, e - (eps if d == day else 0)) for d, e in rows)
    remaining = sum(e for _, e in spends)
    for d, e in spends:
        remaining -= e
        if remaining + eps <= cap:
            return max(d + retention, day + 1)
    return day + 1
