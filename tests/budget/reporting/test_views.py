"""Audit views: a device's timeline, a use case's distribution, what-if on the live ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from dp_governor.budget import InvalidRequest, Ledger, PolicyConflict, UnknownUseCase
from dp_governor.budget.gate.charge import BatchItem, charge_batch
from dp_governor.budget.reporting.views import (
    SpendSpread,
    device_timeline,
    distribution,
    distribution_of,
    what_if,
)
from dp_governor.policies import PolicyBase, PolicyCreate, PolicyUpdate

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def test_timeline_cumulates_window_and_lifetime_across_a_purge(ledger: Ledger) -> None:
    emoji_policy = ledger.policies.get("emoji").model_dump(include=set(PolicyBase.model_fields))
    ledger.policies.create(PolicyCreate(**{**emoji_policy, "name": "short", "retention_days": 3}))
    for back in (10, 2, 1, 0):
        ledger.charge("dev", "short", now=NOW - timedelta(days=back))
    ledger.charge("dev", "lookup-hints", now=NOW)
    ledger.charge("dev", "lookup-hints", now=NOW)
    ledger.purge(now=NOW)  # drops the charge of 10 days ago (kept in lifetime totals)
    t = device_timeline(ledger, "dev", now=NOW)
    assert t.days[0] == "2026-11-20" and t.days[-1] == "2026-11-22"
    emoji = t.use_cases["short"]
    assert emoji.reports == [1, 1, 1]
    # three days in a 3-day window; a window reaching back past the purge's horizon (the two
    # first) also counts the purged report, which it can no longer date: an upper bound
    assert emoji.window == [8.0, 12.0, 12.0]
    assert emoji.lifetime == [8.0, 12.0, 16.0]  # the purged report is carried
    lookup = t.use_cases["lookup-hints"]
    assert lookup.reports == [0, 0, 2] and lookup.lifetime == [0.0, 0.0, 8.0]
    assert t.total.lifetime[-1] == 24.0 and t.total.window[-1] == 20.0
    assert t.loss.lifetime_total is not None and t.loss.lifetime_total.epsilon_basic == 24.0
    with pytest.raises(InvalidRequest):
        device_timeline(ledger, "", now=NOW)


def test_an_unknown_device_has_an_empty_timeline(ledger: Ledger) -> None:
    t = device_timeline(ledger, "nobody", now=NOW)
    assert t.days == ["2026-11-22"] and t.use_cases == {} and t.total.lifetime == [0.0]


def test_distribution_histogram_and_quantiles(ledger: Ledger) -> None:
    items = [BatchItem(f"d{i}", "lookup-hints") for i in range(100)]
    items += [BatchItem(f"d{i}", "lookup-hints") for i in range(10)]  # ten devices twice
    charge_batch(ledger.gate, items, now=NOW)
    d = distribution(ledger, "lookup-hints", now=NOW, bins=4)
    assert d.devices == 100 and sum(d.counts) == 100
    assert d.quantiles == {"p50": 4.0, "p90": 4.0, "p99": 8.0, "max": 8.0}
    assert d.bin_edges[0] == 4.0 and d.bin_edges[-1] == 8.0
    assert d.counts[0] == 90 and d.counts[-1] == 10
    life = distribution(ledger, "lookup-hints", now=NOW, scope="lifetime")
    assert life.devices == 100
    assert distribution(ledger, "emoji", now=NOW).devices == 0
    with pytest.raises(InvalidRequest, match="scope"):
        distribution(ledger, "emoji", now=NOW, scope="day")
    with pytest.raises(UnknownUseCase):
        distribution(ledger, "nope", now=NOW)


def test_what_if_counts_refusals_and_changes_nothing(ledger: Ledger) -> None:
    items = [
        BatchItem(f"d{i}", "lookup-hints") for i in range(20) for _ in range(2 if i < 5 else 1)
    ]
    charge_batch(ledger.gate, items, now=NOW)
    before = (ledger.audit.head(), ledger.policies.get("lookup-hints").version)
    current = ledger.policies.get("lookup-hints")
    proposed = PolicyUpdate(max_reports_per_day=1, window_epsilon_cap=6.0).apply_to(current)
    result = what_if(ledger, "lookup-hints", proposed, now=NOW)
    assert result.devices_in_window == {"current": 20, "proposed": 20}
    assert result.refused_next_report_today == {"current": 5, "proposed": 20}
    assert result.over_window_cap == {"current": 0, "proposed": 5}  # 8 > 6
    assert result.effective_epsilon["epsilon_per_day"] == {"current": 8.0, "proposed": 4.0}
    # a cap of 6 admits one report of 4 a window: 4 is what a device can reach, not 6
    assert result.effective_epsilon["epsilon_per_window"] == {"current": 720.0, "proposed": 4.0}
    assert result.totals_allowed_per_day["current"].epsilon_basic == 54.0
    assert result.totals_allowed_per_day["proposed"].epsilon_basic == 54.0 - 4.0
    assert (ledger.audit.head(), ledger.policies.get("lookup-hints").version) == before
    with pytest.raises(InvalidRequest, match="name"):
        what_if(ledger, "emoji", proposed, now=NOW)


def test_what_if_judges_a_proposal_on_the_budget_it_would_draw_from(ledger: Ledger) -> None:
    # five devices spent today's two safari-domains reports; lookup-hints was never used
    items = [BatchItem(f"d{i}", "safari-energy-domains") for i in range(5) for _ in range(2)]
    charge_batch(ledger.gate, items, now=NOW)
    current = ledger.policies.get("lookup-hints")
    joining = PolicyUpdate(budget_group="safari-domains").apply_to(current)
    result = what_if(ledger, "lookup-hints", joining, now=NOW)
    # the shared account is spent: each of the five would be refused under the proposal
    assert result.refused_next_report_today == {"current": 0, "proposed": 5}
    # the proposal draws from the shared account: its devices, not lookup-hints' none
    assert result.devices_in_window == {"current": 0, "proposed": 5}
    own = what_if(
        ledger, "lookup-hints", PolicyUpdate(max_reports_per_day=1).apply_to(current), now=NOW
    )
    assert own.refused_next_report_today == {"current": 0, "proposed": 0}


def test_what_if_refuses_a_proposal_its_budget_group_would_refuse(ledger: Ledger) -> None:
    current = ledger.policies.get("emoji")  # 1 report a day; safari-domains allows 2
    joining = PolicyUpdate(budget_group="safari-domains").apply_to(current)
    with pytest.raises(PolicyConflict, match="max_reports_per_day") as info:
        what_if(ledger, "emoji", joining, now=NOW)
    assert info.value.field == "max_reports_per_day"
    with pytest.raises(PolicyConflict, match="max_reports_per_day"):
        ledger.policies.update("emoji", PolicyUpdate(budget_group="safari-domains"))


def test_a_histogram_from_one_reading_is_numpys_for_every_bin_count() -> None:
    """``distribution_of`` counts by binary search exactly what ``numpy.histogram`` counts."""
    rng = np.random.default_rng(11)
    samples = [
        rng.integers(1, 5_000_000, 1_000),
        np.full(7, 2_000_000),  # one value: numpy's half-unit bins around it
        np.repeat(rng.integers(1, 10, 20) * 500_000, 3),  # many ties on bin edges
        np.array([1, 3_000_000]),
    ]
    for values in samples:
        values = np.sort(values.astype(np.int64))
        spread = SpendSpread("x", "window", values / 1_000_000, {})
        for bins in (1, 2, 3, 7, 20, 199, 200):
            counts, edges = np.histogram(values / 1_000_000, bins=bins)
            got = distribution_of(spread, bins)
            assert got.counts == [int(c) for c in counts], bins
            assert got.bin_edges == [float(e) for e in edges], bins
    with pytest.raises(InvalidRequest, match="bins"):
        distribution_of(SpendSpread("x", "window", np.zeros(0), {}), 0)
