"""Spend follows the device through every policy edit: the reproductions that once broke it.

Each test is an ordinary operation (a group move, a retention edit, a group-size edit, a
retirement) after which the service once enforced or showed a false figure; run on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from dp_governor.budget import Ledger
from dp_governor.budget.reporting.export import export_ledger, read_export, report_from_export
from dp_governor.budget.reporting.loss import device_loss, effective_epsilon
from dp_governor.policies import PolicyBase, PolicyCreate, PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def _status(ledger: Ledger, device: str, use_case: str, now: datetime = NOW) -> object:
    return {s.use_case: s for s in ledger.status(device, now=now)}[use_case]


def _clone(ledger: Ledger, source: str, **fields: object) -> None:
    data = ledger.policies.get(source).model_dump(include=set(PolicyBase.model_fields))
    ledger.policies.create(PolicyCreate.model_validate({**data, **fields}))


def test_moving_into_a_group_keeps_the_caps_spent(ledger: Ledger) -> None:
    ledger.policies.update("emoji", PolicyUpdate(lifetime_epsilon_cap=4.0))
    assert ledger.charge("dev", "emoji", now=NOW).accepted
    assert ledger.charge("dev", "emoji", now=NOW).reason == "daily_cap"
    ledger.policies.update("emoji", PolicyUpdate(budget_group="keyboard"))
    assert ledger.charge("dev", "emoji", now=NOW).reason == "daily_cap"  # same day
    later = NOW + timedelta(days=1)
    assert ledger.charge("dev", "emoji", now=later).reason == "lifetime_cap"
    status = _status(ledger, "dev", "emoji", later)
    assert status.budget == "keyboard"  # type: ignore[attr-defined]
    assert status.epsilon_lifetime == 4.0 and status.lifetime_remaining == 0.0  # type: ignore[attr-defined]


def test_a_window_cap_counts_history_from_before_a_move(ledger: Ledger) -> None:
    _clone(ledger, "emoji", name="words", window_epsilon_cap=12.0, lifetime_epsilon_cap=20.0)
    for day in range(3):
        assert ledger.charge("dev", "words", now=NOW + timedelta(days=day)).accepted
    ledger.policies.update("words", PolicyUpdate(budget_group="typing"))
    assert ledger.charge("dev", "words", now=NOW + timedelta(days=3)).reason == "window_cap"
    ledger.policies.update("words", PolicyUpdate(budget_group=None))  # and out again
    assert ledger.charge("dev", "words", now=NOW + timedelta(days=3)).reason == "window_cap"
    accepted = sum(
        ledger.charge("dev", "words", now=NOW + timedelta(days=d)).accepted for d in range(3, 400)
    )
    assert accepted == 2  # the lifetime cap of 20 holds across every move: 5 reports of 4


def test_a_use_case_leaving_a_group_leaves_its_spend_on_the_group(ledger: Ledger) -> None:
    shared = {"budget_group": "pair", "lifetime_epsilon_cap": 8.0, "max_reports_per_day": 2}
    _clone(ledger, "emoji", name="left", **shared)
    _clone(ledger, "emoji", name="right", **shared)
    assert ledger.charge("dev", "left", now=NOW).accepted
    assert ledger.charge("dev", "right", now=NOW).accepted
    assert ledger.charge("dev", "left", now=NOW).reason == "daily_cap"
    ledger.policies.update("right", PolicyUpdate(budget_group=None), allow_loosen=True)
    # the same day: the group still holds both reports; right's own budget holds its one
    assert ledger.charge("dev", "left", now=NOW).reason == "daily_cap"
    assert ledger.charge("dev", "right", now=NOW).accepted
    assert ledger.charge("dev", "right", now=NOW).reason == "daily_cap"
    later = NOW + timedelta(days=1)
    # the group counts what was charged under it (8 of 8); right's own budget its history (8)
    assert _status(ledger, "dev", "left", later).epsilon_lifetime == 8.0  # type: ignore[attr-defined]
    assert _status(ledger, "dev", "right", later).epsilon_lifetime == 8.0  # type: ignore[attr-defined]
    assert ledger.charge("dev", "left", now=later).reason == "lifetime_cap"
    assert ledger.charge("dev", "right", now=later).reason == "lifetime_cap"
    ledger.policies.update("right", PolicyUpdate(budget_group="pair"))  # and back in
    assert ledger.charge("dev", "right", now=later).reason == "lifetime_cap"  # 12 > 8
    assert _status(ledger, "dev", "right", later).epsilon_lifetime == 12.0  # type: ignore[attr-defined]


def test_renaming_a_group_or_retiring_and_recreating_frees_nothing(ledger: Ledger) -> None:
    shared = {"budget_group": "old", "lifetime_epsilon_cap": 8.0, "max_reports_per_day": 2}
    _clone(ledger, "emoji", name="first", **shared)
    _clone(ledger, "emoji", name="second", **shared)
    assert ledger.charge("dev", "first", now=NOW).accepted
    assert ledger.charge("dev", "second", now=NOW).accepted
    later = NOW + timedelta(days=1)
    renamed = [
        PolicyUpdate(budget_group="new").apply_to(ledger.policies.get(name))
        for name in ("first", "second")
    ]
    ledger.policies.write_all(renamed)  # the group renamed: every member at once
    assert ledger.charge("dev", "first", now=later).reason == "lifetime_cap"
    ledger.policies.delete("first")
    assert ledger.charge("dev", "second", now=later).reason == "lifetime_cap"  # retired counts
    data = ledger.policies.get("second").model_dump(include=set(PolicyBase.model_fields))
    ledger.policies.create(PolicyCreate.model_validate({**data, "name": "first"}))
    assert ledger.charge("dev", "first", now=later).reason == "lifetime_cap"


def test_lowering_then_raising_retention_keeps_the_true_window(ledger: Ledger) -> None:
    _clone(ledger, "emoji", name="windowed", max_reports_per_day=1, epsilon_per_report=1.0)
    for day in range(90):
        assert ledger.charge("dev", "windowed", now=NOW + timedelta(days=day)).accepted
    end = NOW + timedelta(days=89)
    ledger.policies.update("windowed", PolicyUpdate(retention_days=30))
    ledger.purge(now=end)
    assert _status(ledger, "dev", "windowed", end).epsilon_window == 30.0  # type: ignore[attr-defined]
    ledger.policies.update("windowed", PolicyUpdate(retention_days=90))
    ledger.purge(now=end)
    assert _status(ledger, "dev", "windowed", end).epsilon_window == 90.0  # type: ignore[attr-defined]


def test_raising_retention_past_its_longest_counts_deleted_days_from_above(
    ledger: Ledger,
) -> None:
    _clone(ledger, "emoji", name="brief", retention_days=5, epsilon_per_report=1.0)
    for day in range(20):
        assert ledger.charge("dev", "brief", now=NOW + timedelta(days=day)).accepted
    end = NOW + timedelta(days=19)
    ledger.purge(now=end)  # deletes days up to end - 5
    ledger.policies.update("brief", PolicyUpdate(retention_days=30))
    # the 30-day window holds all 20 reports; 15 of them on days no longer held: counted
    assert _status(ledger, "dev", "brief", end).epsilon_window == 20.0  # type: ignore[attr-defined]
    assert device_loss(ledger, "dev", now=end).window["brief"].epsilon_basic == 20.0
    # once the window no longer reaches the deleted days, it is exact again
    later = end + timedelta(days=25)
    assert _status(ledger, "dev", "brief", later).epsilon_window == 5.0  # type: ignore[attr-defined]


def test_each_charge_counts_at_the_group_size_it_was_made_with(ledger: Ledger) -> None:
    ledger.policies.update("emoji", PolicyUpdate(group_size=5))
    assert ledger.charge("dev", "emoji", now=NOW).accepted
    ledger.policies.update("emoji", PolicyUpdate(group_size=1), allow_loosen=True)
    assert ledger.charge("dev", "emoji", now=NOW + timedelta(days=1)).accepted
    loss = device_loss(ledger, "dev", now=NOW + timedelta(days=1))
    assert loss.lifetime["emoji"].epsilon_basic == 24.0  # 4 x 5 + 4 x 1


def test_retiring_a_use_case_never_lowers_a_population_lifetime_figure(
    ledger: Ledger, tmp_path: Path
) -> None:
    for device in ("a", "b"):
        assert ledger.charge(device, "quicktype", now=NOW).accepted
    assert ledger.charge("a", "emoji", now=NOW).accepted
    before = effective_epsilon(ledger, now=NOW).totals
    ledger.policies.delete("quicktype")
    after = effective_epsilon(ledger, now=NOW)
    assert after.totals.spent_lifetime == before.spent_lifetime
    assert after.totals.spent_window == before.spent_window
    path = tmp_path / "ledger.jsonl"
    with path.open("w", encoding="utf-8") as out:
        export_ledger(ledger, out, fmt="jsonl", now=NOW)
    assert report_from_export(read_export(path)).to_dict() == after.to_dict()
