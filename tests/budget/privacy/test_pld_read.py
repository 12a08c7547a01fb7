"""Regression tests for dp-accounting's two numerical traps, on the real library.

1. ``PLDAccountant`` ignores the count of a composed ``RandomizedResponseDpEvent``: 90 reports at
   epsilon 8 come out as 8.0, not 720.
2. ``get_epsilon_for_delta`` overflows to ``inf`` once the composed loss passes about 709 (89
   events of epsilon 8 are 712).

Every figure the service computes must be finite, at least the true value, and named.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime

import orjson
import pytest
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld

from dp_governor.budget.clock import utc_day
from dp_governor.budget.privacy._pld_read import epsilon_for_delta
from dp_governor.budget.privacy.accountant import Accountant, optimal_epsilon, pld_epsilon
from dp_governor.budget.privacy.amplification import BASIC_METHOD, compose_shuffled
from dp_governor.budget.privacy.sub_batches import compose_sizes
from dp_governor.budget.reporting.central import central_line
from dp_governor.budget.storage.tables import ShuffledBatch
from dp_governor.policies import PolicyCreate
from dp_governor.policies.model import Policy


def _pure(eps: float, count: int) -> pld.PrivacyLossDistribution:
    one = pld.from_privacy_parameters(
        pld_common.DifferentialPrivacyParameters(eps, 0.0), value_discretization_interval=1e-3
    )
    return one.self_compose(count)


def test_trap_randomized_response_count_ignored_at_epsilon_8() -> None:
    """The library trap, kept visible (if an upgrade fixes it, this test says so)."""
    event = dp_event.RandomizedResponseDpEvent(
        noise_parameter=2 / (1 + math.exp(8.0)), num_buckets=2
    )
    library = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=privacy_accountant.NeighboringRelation.REPLACE_ONE
    )
    library.compose(event, 90)
    assert library.get_epsilon(1e-6) == pytest.approx(8.0, abs=1e-3)  # the bug: count ignored


@pytest.mark.parametrize("max_exact_points", [2_000_000, 0])  # exact enumeration, then PLD
def test_no_path_reports_90_events_at_epsilon_8_as_8(max_exact_points: int) -> None:
    loss = Accountant(max_exact_points=max_exact_points).loss({8.0: 90}, delta=1e-6)
    assert loss.epsilon_basic == 720.0
    assert 719.0 < loss.epsilon <= 720.0 and math.isfinite(loss.epsilon)
    assert optimal_epsilon({8.0: 90}, 1e-6) > 719.0


def test_trap_get_epsilon_for_delta_overflows_past_709() -> None:
    """The library trap: finite at a loss of 704 and 800, ``inf`` at 712 and 720."""
    assert math.isfinite(epsilon_for_delta(_pure(8.0, 88), 1e-6) or math.inf)
    for count in (89, 90):
        with pytest.warns(RuntimeWarning, match="overflow"):
            assert _pure(8.0, count).get_epsilon_for_delta(1e-6) == math.inf
        assert epsilon_for_delta(_pure(8.0, count), 1e-6) is None  # read safely, no warning


@pytest.mark.parametrize("count", [88, 89, 90, 91, 100])
def test_pld_paths_fall_back_to_the_basic_sum(count: int) -> None:
    basic = 8.0 * count
    assert basic - 1.0 < pld_epsilon({8.0: count}, 1e-6) <= basic
    loss = Accountant(max_exact_points=0).loss({8.0: count}, delta=1e-6)
    assert basic - 1.0 < loss.epsilon <= basic
    assert loss.bound in ("PLD upper bound", "basic sum")
    if loss.method == "basic":
        assert loss.bound == "basic sum" and loss.epsilon == basic


@pytest.mark.parametrize("method", ["pairs", "curve", "best"])
@pytest.mark.parametrize("count", [89, 90])
def test_composed_batches_past_709_are_the_basic_sum(method: str, count: int) -> None:
    # two devices a batch: no amplification at eps0 = 8, so every batch is its local 8
    composed = compose_shuffled([(8.0, 2)] * count, 1e-6, method=method)  # type: ignore[arg-type]
    assert composed.epsilon == 8.0 * count and composed.method == BASIC_METHOD
    epsilon, how = compose_sizes(8.0, [1] * count, 1e-9)
    assert epsilon == 8.0 * count and how == BASIC_METHOD


def test_no_inf_or_nan_reaches_the_central_report() -> None:
    """QuickType-like: epsilon 8, two reports a day in batches too small to amplify, 45 days.

    90 sub-batches of epsilon 8 compose to a loss of 720, past dp-accounting's overflow.
    """
    today = utc_day(datetime(2026, 11, 22, tzinfo=UTC))
    fields = {
        "name": "quicktype",
        "mechanism": "cms",
        "k": 16,
        "m": 64,
        "epsilon_per_report": 8.0,
        "max_reports_per_day": 2,
        "retention_days": 90,
        "min_batch_devices": 2,
    }
    policy = Policy(version=1, **PolicyCreate.model_validate(fields).model_dump())
    batches = [
        ShuffledBatch(
            use_case="quicktype",
            day=today - d,
            first_day=today - d,
            last_day=today - d,
            devices=2,
            reports=4,
            max_per_device=2,
            layers=orjson.dumps([2, 2]).decode(),
            untagged=0,
            epsilon_micro=8_000_000,
            min_batch_devices=2,
        )
        for d in range(45)
    ]
    line = central_line(policy, [policy], batches, today)
    assert line.window is not None and line.window.epsilon == 8.0 * 90
    assert line.window.method == BASIC_METHOD
    # what the API sends: no inf or nan anywhere
    json.dumps(dataclasses.asdict(line), allow_nan=False)
