"""Sub-batches of a shuffled batch: layers for k reports a device, their bounds composed.

Exact reference for k reports per device: binary randomized response, every report of a device
randomizing the device's one bit with fresh coins. The shuffled batch is the count of ones, so
the central curve for device 1's bit flipped is exact: ``P`` and ``Q`` are the laws of device
1's ``k`` reports plus the other devices' reports (``Bin`` sums for each group of others with
the same number of reports and the same bit). The layered bound (one FMT21 bound per sub-batch,
composed) must never be below it at its own ``epsilon``.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp_governor.budget.privacy.amplification import clear_caches, shuffle_epsilon
from dp_governor.budget.privacy.sub_batches import _compose, batch_layers, compose_sizes
from tests.budget.privacy.test_amplification import exact_rr_delta, others_grid

FloatArray = npt.NDArray[np.float64]
ROUNDING = 1e-14
DELTA = 1e-6


def _others(q: float, groups: list[tuple[int, int, int]]) -> FloatArray:
    """Law of the ones sent by other devices: ``(devices, reports each, ones-bit devices)``."""
    law = np.ones(1)
    for devices, reports, ones in groups:
        law = np.convolve(law, stats.binom.pmf(np.arange(ones * reports + 1), ones * reports, q))
        zeros = (devices - ones) * reports
        law = np.convolve(law, stats.binom.pmf(np.arange(zeros + 1), zeros, 1.0 - q))
    return np.asarray(law, dtype=np.float64)


def exact_delta(eps0: float, k: int, groups: list[tuple[int, int, int]], epsilon: float) -> float:
    """Exact ``delta(epsilon)`` of the count of ones, device 1 (``k`` reports) flipped."""
    q = 1.0 / (1.0 + math.exp(-eps0))
    others = _others(q, groups)
    mine_1 = stats.binom.pmf(np.arange(k + 1), k, q)
    mine_0 = stats.binom.pmf(np.arange(k + 1), k, 1.0 - q)
    p, r = np.convolve(others, mine_1), np.convolve(others, mine_0)
    forward = float(np.maximum(p - math.exp(epsilon) * r, 0.0).sum())
    backward = float(np.maximum(r - math.exp(epsilon) * p, 0.0).sum())
    return max(forward, backward)


@pytest.mark.parametrize("eps0", [1.0, 2.0, 4.0])
@pytest.mark.parametrize(("n", "twos"), [(20, 20), (100, 2), (100, 50), (400, 400), (400, 10)])
def test_layered_bound_never_below_exact_two_reports(eps0: float, n: int, twos: int) -> None:
    """A device with 2 reports among ``n`` devices of which ``twos`` (itself included) sent 2."""
    epsilon, _ = compose_sizes(eps0, [n, twos], DELTA)
    assert epsilon <= 2 * eps0 + 1e-9  # never worse than the local guarantee of two reports
    singles = n - twos
    for frac_one in (0.0, 0.25, 0.5, 1.0):
        for frac_two in (0.0, 0.5, 1.0):
            groups = [
                (singles, 1, round(frac_one * singles)),
                (twos - 1, 2, round(frac_two * (twos - 1))),
            ]
            exact = exact_delta(eps0, 2, groups, epsilon)
            assert exact <= DELTA + ROUNDING * math.exp(epsilon), (groups, epsilon, exact)


@settings(max_examples=15)
@given(
    eps0=st.sampled_from([0.5, 1.0, 3.0]),
    k=st.integers(1, 3),
    n=st.integers(5, 120),
    data=st.data(),
)
def test_layered_bound_never_below_exact_random_batches(
    eps0: float, k: int, n: int, data: st.DataObject
) -> None:
    """Random report counts (device 1 has ``k``) and bits: the layered bound dominates."""
    counts = [k, *data.draw(st.lists(st.integers(1, k), min_size=n - 1, max_size=n - 1))]
    bits = data.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    layers = batch_layers(counts)
    epsilon, _ = compose_sizes(eps0, layers, DELTA)
    groups = [(1, c, int(b)) for c, b in zip(counts[1:], bits, strict=True)]
    exact = exact_delta(eps0, k, groups, epsilon)
    assert exact <= DELTA + ROUNDING * math.exp(epsilon)


@pytest.mark.parametrize("delta", [1e-3, 1e-9])
@pytest.mark.parametrize(("eps0", "n"), [(1.0, 300), (2.0, 1000), (4.0, 3000), (0.5, 50)])
def test_certified_epsilon_holds_exactly_at_other_deltas(eps0: float, n: int, delta: float) -> None:
    """At the service's delta (1e-9) and a loose one: the exact RR curve is within delta."""
    bound = shuffle_epsilon(eps0, n, delta)
    assert exact_rr_delta(eps0, n, bound.epsilon, others_grid(n)) <= delta + 1e-14 * math.exp(
        bound.epsilon
    )


def test_one_layer_is_the_plain_bound_and_rounding_only_weakens() -> None:
    plain = shuffle_epsilon(4.0, 10**6, DELTA).epsilon
    rounded, method = compose_sizes(4.0, [10**6], DELTA)
    assert rounded >= plain and rounded < 1.05 * plain  # 10^6 rounds down by < 9%
    assert "FMT21" in method
    assert compose_sizes(4.0, [12], DELTA)[0] == shuffle_epsilon(4.0, 12, DELTA).epsilon


def test_layers_count_devices_with_at_least_i_reports() -> None:
    assert batch_layers([]) == []
    assert batch_layers([1, 1, 1]) == [3]
    assert batch_layers([2, 1, 3, 2]) == [4, 3, 1]
    with pytest.raises(ValueError, match="sizes"):
        compose_sizes(4.0, [], DELTA)


def test_a_year_of_daily_batches_is_composed_once_then_cached() -> None:
    """365 batches of 10^6 at eps0 = 4 compose once; the same schedule again is a cache hit.

    Its speed (under 2 s on a first call): ``python -m benchmarks.amplification``.
    """
    clear_caches()
    _compose.cache_clear()
    year = compose_sizes(4.0, [10**6] * 365, 1e-6)
    misses = _compose.cache_info().misses
    assert compose_sizes(4.0, [10**6] * 365, 1e-6) == year
    assert _compose.cache_info().misses == misses and _compose.cache_info().hits >= 1
    assert 1.0 < year[0] < 1.3 and "FMT21 pair" in year[1]
