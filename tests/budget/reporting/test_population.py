"""The report's population figures streamed in chunks equal one pass, and merge exactly."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from dp_governor.budget import Ledger
from dp_governor.budget.reporting.loss import effective_epsilon_basis, lifetime_rows, window_rows
from dp_governor.budget.reporting.population import SpendPass
from dp_governor.budget.reporting.views import what_if
from dp_governor.policies import PolicyCreate, PolicyUpdate
from dp_governor.policies.model import from_micro
from tests.budget.reporting.test_report import NOW, seed


@pytest.fixture
def seeded(ledger: Ledger) -> Ledger:
    """The report tests' ledger, with a group-size policy and a lowered cap for variety."""
    ledger.policies.update("health-types", PolicyUpdate(group_size=3))
    seed(ledger)
    for i in range(5):
        ledger.charge(f"d{i}", "health-types", now=NOW)
    ledger.policies.update("emoji", PolicyUpdate(window_epsilon_cap=8.0))
    return ledger


def test_a_tiny_chunk_gives_the_single_pass_figures(seeded: Ledger) -> None:
    whole = effective_epsilon_basis(seeded, now=NOW, chunk=10**6)
    for chunk in (1, 2, 7):
        assert effective_epsilon_basis(seeded, now=NOW, chunk=chunk) == whole
    assert whole.spent_window.devices == 30


def test_the_figures_equal_a_reference_from_the_raw_rows(seeded: Ledger) -> None:
    """Each use case's window spread and every device total, recomputed with plain dicts."""
    basis = effective_epsilon_basis(seeded, now=NOW, chunk=3)
    per_use_case: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    totals: dict[str, int] = defaultdict(int)
    for dk, use_case, eps, group, n, _ in window_rows(seeded, now=NOW):
        per_use_case[use_case][dk] += eps * n
        totals[dk] += eps * group * n
    for line in basis.lines:
        values = np.array(sorted(per_use_case[line.use_case].values()) or [0])
        spread = line.spent_window
        assert spread.devices == len(per_use_case[line.use_case])
        assert spread.max == from_micro(int(values.max()))
        assert spread.p99 == from_micro(int(np.quantile(values, 0.99, method="inverted_cdf")))
        assert spread.median == from_micro(int(np.quantile(values, 0.5, method="inverted_cdf")))
    emoji = next(line for line in basis.lines if line.use_case == "emoji")
    over = sum(v > 8_000_000 for v in per_use_case["emoji"].values())
    assert emoji.devices_over_window_cap == over > 0
    assert basis.spent_window.max == from_micro(max(totals.values()))


def test_passes_over_disjoint_devices_merge_exactly(seeded: Ledger) -> None:
    book = seeded.book()
    rows = list(lifetime_rows(seeded))
    whole = SpendPass(book).add(rows).finish()
    keys = sorted({r[0] for r in rows})
    for cut in (0, 1, len(keys) // 2, len(keys)):
        low = SpendPass(book).add(r for r in rows if r[0] < keys[min(cut, len(keys) - 1)])
        high = SpendPass(book).add(r for r in rows if r[0] >= keys[min(cut, len(keys) - 1)])
        merged = high.merge(low)  # either order: histograms add
        assert merged.use_case == whole.use_case and merged.budget == whole.budget
        assert merged.totals == whole.totals and merged.ledgers == whole.ledgers


def test_a_stream_out_of_device_order_is_refused(seeded: Ledger) -> None:
    rows = list(lifetime_rows(seeded))
    with pytest.raises(ValueError, match="grouped by device in key order"):
        SpendPass(seeded.book()).add(iter(sorted(rows, reverse=True)))


def test_what_if_answers_from_its_one_scan(seeded: Ledger) -> None:
    current = seeded.policies.get("emoji")
    fields = current.model_dump(include=set(PolicyCreate.model_fields))
    proposed = PolicyCreate.model_validate({**fields, "max_reports_per_day": 2})
    answer = what_if(seeded, "emoji", proposed, now=NOW)
    assert answer.devices_in_window["current"] == 30
    assert answer.effective_epsilon["epsilon_per_day"] == {"current": 4.0, "proposed": 8.0}
