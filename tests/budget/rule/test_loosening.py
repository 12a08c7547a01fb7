"""What loosens a policy: each way a reviewer found to let a device spend more without the flag.

Every case is an edit sequence that once went through without ``allow_loosen`` and let some
device be admitted more than under the policies before it; plus the read-side statements that
must hold after a tightening, and the cost of the check itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from dp_governor.budget import Ledger, PolicyConflict
from dp_governor.budget.privacy.allowance import allowance
from dp_governor.budget.reporting.loss import effective_epsilon
from dp_governor.budget.reporting.series import cumulative_series
from dp_governor.budget.reporting.views import device_timeline
from dp_governor.policies import PolicyBase, PolicyCreate, PolicyUpdate
from dp_governor.policies.device import DeviceBudgetCreate
from dp_governor.policies.errors import PolicyLoosens

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def _policy(name: str, **fields: Any) -> PolicyCreate:
    data: dict[str, Any] = {
        "name": name,
        "mechanism": "cms",
        "k": 4,
        "m": 8,
        "epsilon_per_report": 5.0,
        "max_reports_per_day": 1,
        "retention_days": 10,
    }
    return PolicyCreate.model_validate({**data, **fields})


def _fields(ledger: Ledger, name: str) -> dict[str, Any]:
    return ledger.policies.get(name, None).model_dump(include=set(PolicyBase.model_fields))


def test_retiring_and_recreating_looser_is_a_loosening(ledger: Ledger) -> None:
    ledger.policies.create(_policy("solo", lifetime_epsilon_cap=10.0))
    assert ledger.charge("dev", "solo", now=NOW).accepted
    ledger.policies.delete("solo")
    looser = _policy("solo", epsilon_per_report=20.0, max_reports_per_day=1000)
    with pytest.raises(PolicyLoosens, match="`lifetime_epsilon_cap` removed"):
        ledger.policies.create(looser)
    ledger.policies.create(_policy("solo", lifetime_epsilon_cap=10.0))  # as it was: no flag


def test_a_cap_raised_is_a_loosening_when_another_new_cap_holds_the_allowance(
    ledger: Ledger,
) -> None:
    """A device at the daily count with cheap reports is admitted under a larger count."""
    ledger.policies.create(_policy("cheap", epsilon_per_report=1.0, max_reports_per_day=2))
    assert all(ledger.charge("dev", "cheap", now=NOW).accepted for _ in range(2))
    ledger.policies.apply(_policy("cheap", epsilon_per_report=2.0, max_reports_per_day=2),
                          allow_loosen=True)  # fmt: skip
    assert not ledger.charge("dev", "cheap", now=NOW).accepted  # held by the count
    # a day allows 4 before and 3 after, but this device spent 2 and 2 + 1 > 3 only at eps 2
    tighter_overall = _policy(
        "cheap", epsilon_per_report=1.0, max_reports_per_day=3, window_epsilon_cap=3.0
    )
    with pytest.raises(PolicyLoosens, match="`max_reports_per_day` raised from 2 to 3"):
        ledger.policies.apply(tighter_overall)
    assert not ledger.charge("dev", "cheap", now=NOW).accepted
    ledger.policies.apply(_policy("cheap", epsilon_per_report=2.0, window_epsilon_cap=6.0))
    with pytest.raises(PolicyLoosens, match="`window_epsilon_cap` raised to 8"):
        ledger.policies.apply(
            _policy("cheap", epsilon_per_report=2.0, max_reports_per_day=1, window_epsilon_cap=8.0)
        )


def test_retiring_a_whole_group_and_recreating_it_apart_is_a_loosening(ledger: Ledger) -> None:
    energy, crash = "safari-energy-domains", "safari-crash-domains"
    both = {n: _fields(ledger, n) for n in (energy, crash)}
    for name in both:
        ledger.policies.delete(name)
    with pytest.raises(PolicyLoosens, match="no longer count safari-crash-domains's spend"):
        ledger.policies.create(PolicyCreate.model_validate({**both[energy], "budget_group": None}))


def test_shortening_a_window_cap_is_a_loosening_however_the_cap_is_scaled(
    ledger: Ledger,
) -> None:
    ledger.policies.create(_policy("win", max_reports_per_day=2, window_epsilon_cap=50.0))
    for day in range(5):
        for _ in range(2):
            assert ledger.charge("dev", "win", now=NOW + timedelta(days=day)).accepted
    scaled = PolicyUpdate(retention_days=1, window_epsilon_cap=10.0)  # 50 in 5 days, still
    with pytest.raises(PolicyLoosens, match="window cap's window shortens from 10 to 1 days"):
        ledger.policies.update("win", scaled)
    later = NOW + timedelta(days=5)
    assert ledger.charge("dev", "win", now=later).reason == "window_cap"  # nothing written


def test_an_sfp_part_cannot_be_raised_through_another_mechanism(ledger: Ledger) -> None:
    sfp = _fields(ledger, "quicktype")
    as_cms = {**sfp, "mechanism": "cms", "k": 16, "m": 64}
    for key in ("k_fragment", "m_fragment", "epsilon_word", "epsilon_fragment"):
        as_cms[key] = None
    with pytest.raises(PolicyLoosens, match="`epsilon_word` raised from 2 to 8"):
        ledger.policies.apply(PolicyCreate.model_validate(as_cms))


def test_a_check_compares_only_what_the_change_can_move(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(40):  # forty groups whose members differ in epsilon (the solver's case)
        for j, eps in enumerate((1.0, 2.0)):
            member = _policy(f"g{i}-{j}", budget_group=f"group-{i}", epsilon_per_report=eps)
            ledger.policies.create(member, allow_loosen=True)  # the second raises the group's
    calls: list[object] = []

    def counting(*args: Any) -> Any:
        calls.append(args)
        return allowance(*args)

    monkeypatch.setattr("dp_governor.budget.rule.loosening.allowance", counting)
    ledger.policies.update("g7-0", PolicyUpdate(description="only words"))
    assert len(calls) <= 2 * 2 * 4  # the group's two members, before and after, four spans


def test_a_collision_left_by_an_earlier_release_stays_editable(ledger: Ledger) -> None:
    ledger.policies.create(_policy("x"))
    row = _policy("y", budget_group="x").model_dump()
    with ledger.engine.begin() as conn:  # as an earlier release could have stored it
        cols = ", ".join(row) + ", version, active, created_at, actor"
        marks = ", ".join(f":{k}" for k in row) + ", 1, true, :at, 'legacy'"
        conn.execute(text(f"INSERT INTO policies ({cols}) VALUES ({marks})"), {**row, "at": NOW})
    ledger.policies.update("x", PolicyUpdate(max_reports_per_day=1, description="tighter"))
    ledger.policies.update("y", PolicyUpdate(description="tighter"))
    ledger.policies.delete("y")
    ledger.policies.delete("x")
    with pytest.raises(PolicyConflict, match="budget_group"):
        ledger.policies.create(_policy("z", budget_group="x"))  # a new collision still refused


def test_a_group_member_that_no_longer_validates_names_its_field(ledger: Ledger) -> None:
    terms = _fields(ledger, "safari-energy-domains")
    from dp_governor.policies.model import GroupTerms
    from dp_governor.policies.repository import GROUP_FIELDS

    shared = {f: terms[f] for f in GROUP_FIELDS} | {"window_epsilon_cap": 1.0}
    with pytest.raises(PolicyConflict) as found:
        ledger.policies.update_group("safari-domains", GroupTerms.model_validate(shared))
    assert found.value.field == "window_epsilon_cap"


def test_the_device_wide_budget_refuses_loosening_and_unknown_quotas(ledger: Ledger) -> None:
    ledger.set_device_budget(DeviceBudgetCreate(epsilon_per_day=8.0))
    with pytest.raises(PolicyLoosens, match="epsilon_per_day"):
        ledger.set_device_budget(DeviceBudgetCreate(epsilon_per_day=1000.0))
    with pytest.raises(PolicyConflict, match="quotas"):
        ledger.set_device_budget(
            DeviceBudgetCreate(epsilon_per_day=8.0, quotas={"safari-domains": 0.5})
        )
    ledger.set_device_budget(DeviceBudgetCreate(epsilon_per_day=1000.0), allow_loosen=True)


def test_every_window_view_counts_what_it_cannot_date(ledger: Ledger) -> None:
    ledger.policies.create(_policy("brief", epsilon_per_report=1.0))
    for day in range(30):
        assert ledger.charge("dev", "brief", now=NOW + timedelta(days=day)).accepted
    end = NOW + timedelta(days=29)
    ledger.purge(now=end)
    ledger.policies.update("brief", PolicyUpdate(retention_days=90))
    timeline = device_timeline(ledger, "dev", now=end)
    assert timeline.use_cases["brief"].window[-1] == 30.0  # 10 held, 20 undated
    assert cumulative_series(ledger, "brief", now=end).max[-1] == 30.0


def test_a_lowered_window_cap_and_a_lifetime_filter_are_stated_as_they_hold(
    ledger: Ledger,
) -> None:
    ledger.policies.create(_policy("capped", epsilon_per_report=1.0, window_epsilon_cap=50.0))
    for day in range(9):
        ledger.charge("dev", "capped", now=NOW + timedelta(days=day))
    ledger.policies.update("capped", PolicyUpdate(window_epsilon_cap=5.0))
    ledger.policies.create(
        _policy(
            "filtered",
            epsilon_per_report=1.0,
            lifetime_filter_epsilon=10.0,
            lifetime_filter_delta=1e-9,
        )
    )
    ledger.policies.create(_policy("huge", epsilon_per_report=1.0, lifetime_epsilon_cap=1234564.0))
    report = effective_epsilon(ledger, now=NOW + timedelta(days=8))
    lines = {line.use_case: line for line in report.use_cases}
    capped = lines["capped"]
    assert capped.devices_over_window_cap == 1 and capped.spent_budget_window_max == 9.0
    assert "hold up to 9 in the window, above the window cap of 5" in capped.window_note
    assert "(10, 1e-09)-DP" in lines["filtered"].lifetime_note
    assert "bounds the loss at 1.23457e+06" in lines["huge"].lifetime_note  # rounded up
