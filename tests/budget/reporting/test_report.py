"""The effective-epsilon report: the policies' figures, the devices' spend, and the export."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dp_governor.budget import Ledger
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.reporting.export import (
    export_ledger,
    read_export,
    recompute,
    report_from_export,
)
from dp_governor.budget.reporting.loss import (
    device_loss,
    effective_epsilon,
    effective_epsilon_basis,
    population_window_loss,
)
from dp_governor.budget.reporting.report import finish_report
from dp_governor.budget.reporting.report_text import render_text
from dp_governor.policies import PolicyCreate, PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def seed(ledger: Ledger) -> None:
    """Three days of reports from 30 devices, one of them busier; an old, purged-away day."""
    ledger.charge("d1", "emoji", now=NOW - timedelta(days=200))  # out of every window
    for back in (2, 1, 0):  # in date order, as a ledger records charges
        when = NOW - timedelta(days=back)
        items = [BatchItem(f"d{i}", "emoji") for i in range(30)]
        items += [BatchItem(f"d{i}", "quicktype") for i in range(10) for _ in range(2)]
        items += [BatchItem("d0", "safari-energy-domains"), BatchItem("d0", "safari-crash-domains")]
        charge_batch(ledger.gate, items, now=when)


def test_policy_figures_for_apples_defaults(ledger: Ledger) -> None:
    report = effective_epsilon(ledger, now=NOW)
    lines = {line.use_case: line for line in report.use_cases}
    emoji, quicktype = lines["emoji"], lines["quicktype"]
    assert (emoji.epsilon_per_day, emoji.epsilon_per_window, emoji.epsilon_per_year) == (
        4.0,
        360.0,
        1460.0,
    )
    assert (quicktype.epsilon_per_day, quicktype.epsilon_per_window) == (16.0, 1440.0)
    assert not emoji.lifetime_bounded and "nothing bounds" in emoji.lifetime_note
    assert lines["safari-energy-domains"].shares_budget_with == ["safari-crash-domains"]
    # per day across use cases: the shared Safari budget counts once (2 x 4, not 4 x 4)
    assert report.totals.allowed_per_day.epsilon_basic == 16 + 4 + 8 + 8 + 16 + 2
    assert report.totals.allowed_per_window.epsilon_basic == 54 * 90
    assert report.totals.allowed_per_year.method in ("pld", "optimal-rr", "basic")
    assert report.totals.allowed_per_year.epsilon <= 54 * 365
    assert report.provenance["policy_versions"]["emoji"] == 1
    assert report.provenance["accountant"].startswith("dp-governor optimal-rr / dp-accounting")


def test_caps_bound_the_figures_and_say_so(ledger: Ledger) -> None:
    ledger.policies.update("emoji", PolicyUpdate(window_epsilon_cap=100.0), allow_loosen=True)
    ledger.policies.create(
        PolicyCreate.model_validate(
            {
                "name": "capped",
                "mechanism": "cms",
                "k": 16,
                "m": 64,
                "epsilon_per_report": 1.0,
                "max_reports_per_day": 2,
                "lifetime_epsilon_cap": 50.0,
                "group_size": 3,
            }
        ),
        allow_loosen=True,
    )
    lines = {line.use_case: line for line in effective_epsilon(ledger, now=NOW).use_cases}
    assert lines["emoji"].epsilon_per_window == 100.0
    # 25 reports a window, front-loaded: 4 full windows and the year's last 5 days (not 5 x 25)
    assert lines["emoji"].epsilon_per_year == 4.0 * (4 * 25 + 5)
    assert "renews every 90 days" in lines["emoji"].lifetime_note
    capped = lines["capped"]
    assert capped.lifetime_bounded and capped.epsilon_per_year == 50.0
    assert capped.group_epsilon_per_day == 6.0


def test_spend_spreads_over_devices(ledger: Ledger) -> None:
    seed(ledger)
    report = effective_epsilon(ledger, now=NOW)
    lines = {line.use_case: line for line in report.use_cases}
    emoji = lines["emoji"]
    assert emoji.spent_window.devices == 30
    assert (emoji.spent_window.max, emoji.spent_window.median) == (12.0, 12.0)  # 3 days x 4
    assert emoji.spent_lifetime.max == 16.0  # d1's old report is purge-proof
    assert lines["quicktype"].spent_window.max == 3 * 2 * 8.0
    assert lines["health-types"].spent_window.devices == 0
    # d0: 12 emoji + 48 quicktype + 6 x 4 safari in the window
    assert report.totals.spent_window.max == 12 + 48 + 24
    tight = report.totals.device_bound_window
    assert tight is not None and tight.devices == 30 and tight.kind == "running total"
    assert tight.basic_max == 84.0 and tight.max <= 84.0
    text = render_text(report)
    assert "emoji" in text and "nothing bounds the lifetime loss" in text


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_report_recomputes_from_an_export(ledger: Ledger, fmt: str, tmp_path: Path) -> None:
    seed(ledger)
    ledger.policies.update("emoji", PolicyUpdate(window_epsilon_cap=200.0), allow_loosen=True)
    live = effective_epsilon(ledger, now=NOW).to_dict()
    buffer = io.StringIO()
    n = export_ledger(ledger, buffer, fmt=fmt, now=NOW)  # type: ignore[arg-type]
    path = tmp_path / f"ledger.{fmt}"
    path.write_text(buffer.getvalue(), encoding="utf-8")
    export = read_export(path)
    assert n == 1 + len(export.policies) + len(export.charges) + len(export.lifetime)
    assert len(export.policies) == 8  # seven defaults and emoji's second version
    again = report_from_export(export, accountant=Accountant()).to_dict()
    assert again == live
    for bucket_bytes in (1 << 20, 2_000, 300):  # one bucket, a few, one or two devices each
        assert recompute(path, bucket_bytes=bucket_bytes).to_dict() == live
    assert '"d0"' not in buffer.getvalue() and ledger.device_key("d0") in buffer.getvalue()


def test_a_broken_export_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "nope"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="not a 'dp-governor ledger export v3' file"):
        read_export(bad)
    bad.write_text(
        '{"kind":"meta","format":"dp-governor ledger export v1","as_of_day":1}\n'
        '{"kind":"charge","device_key":"x"}\n',
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="record 2"):
        read_export(bad)
    with pytest.raises(ValueError, match="record 2"):
        recompute(bad)


def _policy(name: str, **fields: object) -> PolicyCreate:
    data: dict[str, object] = {
        "name": name,
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 1.0,
        "max_reports_per_day": 1,
    }
    data.update(fields)
    return PolicyCreate.model_validate(data)


def test_budget_group_members_count_with_their_own_epsilon(ledger: Ledger) -> None:
    # the example: safari-energy-domains at epsilon 8 in the shared Safari budget
    ledger.policies.update(
        "safari-energy-domains", PolicyUpdate(epsilon_per_report=8.0), allow_loosen=True
    )
    report = effective_epsilon(ledger, now=NOW)
    # quicktype 16, emoji 4, lookup-hints 8, Safari 2 x 8, autoplay 16, health 2 (not 54)
    assert report.totals.allowed_per_day.epsilon_basic == 62.0
    assert report.totals.allowed_per_window.epsilon_basic == 62.0 * 90
    assert report.totals.allowed_per_day.bound == "exact optimal"


def test_the_population_tight_figure_is_each_devices_own(ledger: Ledger) -> None:
    # the example: A sends 400 reports at 0.05 (sum 20, optimal 6.12); B two QuickType
    # reports (sum 16, optimal 16): the largest loss is B's, not that of the largest sum
    ledger.policies.create(
        _policy("tiny", epsilon_per_report=0.05, max_reports_per_day=400), allow_loosen=True
    )
    charge_batch(ledger.gate, [BatchItem("A", "tiny") for _ in range(400)], now=NOW)
    charge_batch(ledger.gate, [BatchItem("B", "quicktype") for _ in range(2)], now=NOW)
    report = effective_epsilon(ledger, now=NOW)
    tight = report.totals.device_bound_window
    assert tight is not None and tight.devices == 2 and tight.distinct_ledgers == 2
    a = Accountant().loss({0.05: 400}, delta=1e-9)
    b = Accountant().loss({8.0: 2}, delta=1e-9)
    assert a.epsilon == pytest.approx(6.12, abs=0.01) and b.epsilon > 15.99
    assert tight.max == b.epsilon and tight.median == a.epsilon and tight.p99 == b.epsilon
    assert tight.basic_max == 20.0 and tight.kind == "running total"
    assert tight.bounds == {"exact optimal": 2}


def test_every_figure_names_what_it_is_and_none_says_tight(ledger: Ledger) -> None:
    seed(ledger)
    report = effective_epsilon(ledger, now=NOW)
    t = report.totals
    # per window the PLD bound is no smaller than the sum: the figure is the basic sum
    assert t.allowed_per_window.bound == "basic sum" and t.allowed_per_window.epsilon == 4860.0
    for loss in (t.allowed_per_day, t.allowed_per_window, t.allowed_per_year):
        assert loss.kind == "fixed schedule" and loss.note
        assert loss.bound in ("exact optimal", "PLD upper bound", "basic sum")
    assert t.spent_window.kind == "running total" and t.spent_window.bound == "basic sum"
    assert t.device_bound_lifetime is not None and "running total" in t.device_bound_lifetime.note
    text = render_text(report)
    assert "tight" not in text
    assert "allowed per window: basic sum 4,860 [fixed schedule]" in text
    device = device_loss(ledger, "d0", now=NOW)
    assert device.window_total is not None and device.window_total.kind == "running total"
    assert "adaptively" in device.window_total.note or device.window_total.bound == "basic sum"
    assert all(loss.kind == "running total" for loss in device.lifetime.values())
    population = population_window_loss(ledger, now=NOW, use_case="emoji")
    assert {loss.kind for loss in population.values()} == {"running total"}


def test_a_retired_use_case_still_counts_in_the_population(ledger: Ledger) -> None:
    seed(ledger)
    before = effective_epsilon(ledger, now=NOW).totals
    ledger.policies.delete("quicktype")
    after = effective_epsilon(ledger, now=NOW)
    assert "quicktype" not in {line.use_case for line in after.use_cases}
    assert after.totals.spent_lifetime == before.spent_lifetime
    assert after.totals.spent_window == before.spent_window
    assert after.totals.device_bound_lifetime == before.device_bound_lifetime


def test_a_group_size_that_overflows_exp_gives_finite_figures(ledger: Ledger) -> None:
    # the example: group size 89 at epsilon 8 raised OverflowError in exp
    ledger.policies.update(
        "emoji", PolicyUpdate(group_size=89, epsilon_per_report=8.0), allow_loosen=True
    )
    ledger.charge("d0", "emoji", now=NOW)
    ledger.charge("d0", "quicktype", now=NOW)
    report = effective_epsilon(ledger, now=NOW, delta=1e-12)
    assert report.totals.allowed_per_year.epsilon_basic > 0
    loss = device_loss(ledger, "d0", now=NOW)
    assert loss.lifetime_total is not None and loss.lifetime_total.epsilon_basic == 712.0 + 8.0
    assert render_text(report)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_export_carries_group_sizes_horizons_and_retired_use_cases(
    ledger: Ledger, fmt: str, tmp_path: Path
) -> None:
    seed(ledger)
    ledger.policies.delete("quicktype")
    live = effective_epsilon(ledger, now=NOW).to_dict()
    buffer = io.StringIO()
    export_ledger(ledger, buffer, fmt=fmt, now=NOW)  # type: ignore[arg-type]
    path = tmp_path / f"ledger.{fmt}"
    path.write_text(buffer.getvalue(), encoding="utf-8")
    export = read_export(path)
    assert {row[3] for row in export.lifetime} == {1}
    assert report_from_export(export, accountant=Accountant()).to_dict() == live
    # a horizon inside the window: the deleted charges can no longer be dated, so the window
    # counts them all (an upper bound); one before the window drops them from it
    newest = max(charge[4] for charge in export.charges)
    export.horizons["emoji"] = newest
    again = report_from_export(export, accountant=Accountant())
    emoji = next(line for line in again.use_cases if line.use_case == "emoji")
    assert emoji.spent_window == emoji.spent_lifetime
    export.meta["as_of_day"] = newest + 90
    later = report_from_export(export, accountant=Accountant())
    emoji = next(line for line in later.use_cases if line.use_case == "emoji")
    assert emoji.spent_window.devices == 0
    # a charge under a policy version the export does not hold is named
    export.charges.append(("x", "emoji", 99, 4_000_000, newest + 1, "emoji"))
    with pytest.raises(ValueError, match="policy version 99"):
        report_from_export(export, accountant=Accountant())


def test_a_v1_export_is_read_with_the_group_sizes_it_was_computed_with(tmp_path: Path) -> None:
    path = tmp_path / "v1.jsonl"
    path.write_text(
        '{"kind":"meta","format":"dp-governor ledger export v1","as_of_day":20000}\n'
        '{"kind":"lifetime","device_key":"k","use_case":"emoji","epsilon_micro":4000000,'
        '"count":2}\n',
        encoding="utf-8",
    )
    assert read_export(path).lifetime == [("k", "emoji", 4_000_000, 1, 2, "")]
    path.write_text(path.read_text().replace("export v1", "export v2"), encoding="utf-8")
    with pytest.raises(ValueError, match="no group_size"):
        read_export(path)
    with pytest.raises(ValueError, match="no group_size"):
        recompute(path)


def test_the_report_is_the_same_from_its_basis_at_any_delta(ledger: Ledger) -> None:
    seed(ledger)
    basis = effective_epsilon_basis(ledger, now=NOW)
    for delta in (1e-9, 1e-3, 0.9999999999999999):
        direct = effective_epsilon(ledger, now=NOW, delta=delta).to_dict()
        assert finish_report(basis, accountant=Accountant(), delta=delta).to_dict() == direct


def test_a_lifetime_filter_set_after_spend_claims_no_bound_for_it(ledger: Ledger) -> None:
    """40 reports at 1, then a lifetime filter of (5, 1e-9): a tightening, yet no claim of 5.

    A device within the target beside it changes nothing: the note counts the one past it.
    """
    fields = {"mechanism": "cms", "k": 4, "m": 8, "epsilon_per_report": 1.0}
    ledger.policies.create(
        PolicyCreate.model_validate({"name": "u", **fields, "max_reports_per_day": 100})
    )
    for _ in range(40):
        assert ledger.charge("dev", "u", now=NOW).accepted
    ledger.policies.update(
        "u", PolicyUpdate(lifetime_filter_epsilon=5.0, lifetime_filter_delta=1e-9)
    )
    line = next(x for x in effective_epsilon(ledger, now=NOW).use_cases if x.use_case == "u")
    assert not line.lifetime_bounded and line.lifetime_bound is None
    assert "does not bound the 1 device(s) that spent past it" in line.lifetime_note
    assert line.spent_lifetime.max == 40.0  # the spend the filter never saw, shown as spent
    assert not ledger.charge("dev", "u", now=NOW).accepted  # and nothing more admitted
    assert ledger.charge("fresh", "u", now=NOW).accepted
    text = render_text(effective_epsilon(ledger, now=NOW))
    assert "(5, 1e-09)-DP does not bound the 1 device(s)" in text


def test_a_lifetime_filter_in_force_from_the_start_is_stated_for_every_device(
    ledger: Ledger,
) -> None:
    fields = {"mechanism": "cms", "k": 4, "m": 8, "epsilon_per_report": 1.0}
    filtered = {"lifetime_filter_epsilon": 5.0, "lifetime_filter_delta": 1e-9}
    ledger.policies.create(
        PolicyCreate.model_validate({"name": "u", **fields, "max_reports_per_day": 100, **filtered})
    )
    accepted = sum(ledger.charge("dev", "u", now=NOW).accepted for _ in range(40))
    assert 0 < accepted < 40  # the filter stopped it
    line = next(x for x in effective_epsilon(ledger, now=NOW).use_cases if x.use_case == "u")
    assert "every device's reports are within the lifetime filter's (5, 1e-09)-DP" in (
        line.lifetime_note
    )
