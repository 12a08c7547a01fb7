"""Apple's default policies: their batch minimums follow the rule stated in policies/defaults.py."""

from __future__ import annotations

import pytest

from dp_governor.budget.privacy.amplification import shuffle_epsilon
from dp_governor.policies import PolicyCreate
from dp_governor.policies.defaults import default_policies

SERIES = [m * 10**e for e in range(3, 8) for m in (1, 2, 5)]  # 1,000, 2,000, 5,000, ...


@pytest.mark.parametrize("policy", default_policies(), ids=lambda p: p.name)
def test_each_minimum_is_the_smallest_that_halves_the_local_epsilon(policy: PolicyCreate) -> None:
    eps0, delta, minimum = policy.epsilon_per_report, policy.delta, policy.min_batch_devices
    assert minimum in SERIES
    assert shuffle_epsilon(eps0, minimum, delta).epsilon <= eps0 / 2
    smaller = [n for n in SERIES if n < minimum]
    if smaller:
        assert shuffle_epsilon(eps0, smaller[-1], delta).epsilon > eps0 / 2


def test_the_figures_the_docstring_states() -> None:
    by_name = {p.name: p.min_batch_devices for p in default_policies()}
    assert by_name == {
        "quicktype": 200_000,
        "emoji": 5_000,
        "lookup-hints": 5_000,
        "safari-energy-domains": 5_000,
        "safari-crash-domains": 5_000,
        "safari-autoplay": 200_000,
        "health-types": 1_000,
    }
