"""The shuffling amplification bound against exact privacy curves and the published figures.

Exact reference: binary randomized response with ``eps0`` (report 1 with probability
``q = e^eps0 / (1 + e^eps0)`` if the input is 1). The shuffled reports are just the count of
ones, so for device 1's input flipped and ``m`` of the other ``n - 1`` devices holding a 1 the
central privacy curve is ``delta(eps) = sum_k max(0, P(k) - e^eps Q(k))`` (both directions),
with ``P, Q`` the laws of ``Bern(q or 1 - q) + Bin(m, q) + Bin(n - 1 - m, 1 - q)``. The worst
``m`` is not always at the edges (eps0 = 4, n = 100, eps = 0.4 peaks at m = 25), so we take the
max over every ``m`` for n <= 100 and over a grid of ``m`` beyond; any single pair is a lower
bound on the true curve, so the bound must dominate every one of them. ``ROUNDING`` absorbs the
exact reference's own float noise (about 1e-16 e^eps: its terms cancel where the true value is 0).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp_governor.budget.privacy.amplification import (
    CURVE_METHOD,
    METHOD,
    PAIRS_METHOD,
    AmplifiedBound,
    compose_shuffled,
    fmt21_closed_form_epsilon,
    shuffle_delta,
    shuffle_epsilon,
)

FloatArray = npt.NDArray[np.float64]
ROUNDING = 1e-14


def rr_pair(eps0: float, n: int, m: int) -> tuple[FloatArray, FloatArray]:
    """Laws of the count of ones for device 1's input 1 (P) and 0 (Q), ``m`` others at 1."""
    q = 1.0 / (1.0 + math.exp(-eps0))
    ones = stats.binom.pmf(np.arange(m + 1), m, q)
    zeros = stats.binom.pmf(np.arange(n - m), n - 1 - m, 1.0 - q)
    others = np.convolve(ones, zeros)
    shifted = np.append(0.0, others)
    same = np.append(others, 0.0)
    return q * shifted + (1.0 - q) * same, (1.0 - q) * shifted + q * same


def hockey_stick(p: FloatArray, q: FloatArray, eps: float) -> float:
    """``max`` over both directions of ``sum max(0, p - e^eps q)``."""
    forward = float(np.maximum(p - math.exp(eps) * q, 0.0).sum())
    backward = float(np.maximum(q - math.exp(eps) * p, 0.0).sum())
    return max(forward, backward)


def exact_rr_delta(eps0: float, n: int, eps: float, ms: list[int]) -> float:
    """Largest exact ``delta(eps)`` of shuffled randomized response over the given ``m``."""
    return max(hockey_stick(*rr_pair(eps0, n, m), eps) for m in ms)


def others_grid(n: int) -> list[int]:
    """Every ``m`` for small ``n``; otherwise the edges and a grid (both halves, by symmetry)."""
    if n <= 100:
        return list(range(n))
    return sorted({0, 1, 2, n // 64, n // 16, n // 8, n // 4, (n - 1) // 2, n - 2, n - 1})


def clones_delta(eps0: float, n: int, eps: float) -> float:
    """FMT21 Theorem 3.2's pair enumerated term by term (no closed form, no blocks)."""
    q = 1.0 / (1.0 + math.exp(-eps0))
    weights = stats.binom.pmf(np.arange(n), n - 1, math.exp(-eps0))
    total = 0.0
    for c in np.flatnonzero(weights > 1e-30):  # the rest weighs < n * 1e-30 in all
        weight = float(weights[c])
        a = stats.binom.pmf(np.arange(c + 1), c, 0.5)
        p = q * np.append(0.0, a) + (1.0 - q) * np.append(a, 0.0)
        qq = q * np.append(a, 0.0) + (1.0 - q) * np.append(0.0, a)
        total += weight * hockey_stick(p, qq, eps)
    return total


@pytest.mark.parametrize("n", [10, 100, 1000, 3000])
@pytest.mark.parametrize("eps0", [0.5, 1.0, 2.0, 4.0, 8.0])
def test_bound_never_below_exact_randomized_response(eps0: float, n: int) -> None:
    ms = others_grid(n)
    amplified = shuffle_epsilon(eps0, n, 1e-6)
    # the certified epsilon holds for the exact curve
    assert exact_rr_delta(eps0, n, amplified.epsilon, ms) <= 1e-6 + ROUNDING
    scale = amplified.epsilon if amplified.amplified else eps0
    for eps in sorted({0.0, 0.25 * scale, 0.5 * scale, scale, 0.5 * eps0, 0.9 * eps0}):
        exact = exact_rr_delta(eps0, n, eps, ms)
        noise = ROUNDING * math.exp(eps)
        assert shuffle_delta(eps0, n, eps) >= exact * (1 - 1e-9) - noise, (eps0, n, eps)


@settings(max_examples=25, deadline=None)
@given(
    eps0=st.floats(0.05, 6.0),
    n=st.integers(1, 60),
    fraction=st.floats(0.0, 1.0),
)
def test_bound_dominates_every_neighbouring_pair(eps0: float, n: int, fraction: float) -> None:
    eps = fraction * eps0
    exact = exact_rr_delta(eps0, n, eps, list(range(n)))
    assert shuffle_delta(eps0, n, eps) >= exact * (1 - 1e-9) - ROUNDING * math.exp(eps)


@pytest.mark.parametrize(("eps0", "n"), [(0.5, 20), (1.0, 200), (4.0, 300), (8.0, 2000)])
def test_closed_form_matches_theorem_enumerated(eps0: float, n: int) -> None:
    """The O(1)-per-c closed form equals the theorem's pair summed term by term."""
    for eps in (0.0, 0.1 * eps0, 0.3 * eps0, 0.7 * eps0):
        reference = clones_delta(eps0, n, eps)
        bound = shuffle_delta(eps0, n, eps)
        assert reference * (1 - 1e-9) - ROUNDING <= bound <= reference * (1 + 1e-6) + ROUNDING


def test_reference_point_lands_on_fmt21_numerical_figure() -> None:
    """eps0 = 4, n = 10^6, delta = 10^-6: FMT21's numerical method reports 0.049-0.050.

    The closed form of the same paper gives about 0.2 and tighter 2023-era analyses about
    0.034; this method evaluates FMT21 Theorem 3.2 exactly, so it lands on 0.049-0.050.
    """
    bound = shuffle_epsilon(4.0, 10**6, 1e-6)
    assert 0.034 <= bound.epsilon <= 0.051
    assert 0.048 <= bound.epsilon <= 0.0505
    assert bound.amplified
    assert bound.delta == 1e-6
    assert bound.method == METHOD
    assert shuffle_delta(4.0, 10**6, bound.epsilon) <= 1e-6
    closed = fmt21_closed_form_epsilon(4.0, 10**6, 1e-6)
    assert closed is not None and 0.19 <= closed <= 0.21


@pytest.mark.parametrize("eps0", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("n", [10**4, 10**5, 10**7])
def test_tighter_than_closed_form(eps0: float, n: int) -> None:
    closed = fmt21_closed_form_epsilon(eps0, n, 1e-6)
    bound = shuffle_epsilon(eps0, n, 1e-6)
    if closed is not None:
        assert bound.epsilon <= closed


def test_monotone_in_epsilon_n_and_eps0() -> None:
    deltas = [shuffle_delta(2.0, 5000, e) for e in np.linspace(0.0, 2.0, 41)]
    assert deltas == sorted(deltas, reverse=True)
    by_n = [shuffle_epsilon(2.0, n, 1e-6).epsilon for n in (10**3, 10**4, 10**5, 10**6)]
    assert by_n == sorted(by_n, reverse=True)
    by_eps0 = [shuffle_epsilon(e, 10**5, 1e-6).epsilon for e in (0.5, 1.0, 2.0, 4.0)]
    assert by_eps0 == sorted(by_eps0)


def test_no_amplification_returns_the_local_epsilon() -> None:
    alone = shuffle_epsilon(2.0, 1, 1e-6)
    few = shuffle_epsilon(8.0, 10**4, 1e-6)
    largest = shuffle_epsilon(100.0, 10**8, 1e-6)
    for bound in (alone, few, largest):
        assert bound == AmplifiedBound(
            epsilon=bound.eps0,
            delta=0.0,
            n=bound.n,
            eps0=bound.eps0,
            method=METHOD,
            amplified=False,
            note=bound.note,
        )
        assert "no amplification" in bound.note
    assert shuffle_delta(3.0, 100, 3.0) == 0.0


def test_results_are_cached() -> None:
    assert shuffle_epsilon(1.0, 10**8, 1e-6) is shuffle_epsilon(1.0, 10**8, 1e-6)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0.0, 10, 1e-6), "eps0"),
        ((-1.0, 10, 1e-6), "eps0"),
        ((math.inf, 10, 1e-6), "eps0"),
        ((math.nan, 10, 1e-6), "eps0"),
        ((100.5, 10, 1e-6), "eps0"),
        ((True, 10, 1e-6), "eps0"),
        (("1", 10, 1e-6), "eps0"),
        ((1.0, 0, 1e-6), "n"),
        ((1.0, 10.0, 1e-6), "n"),
        ((1.0, True, 1e-6), "n"),
        ((1.0, 10, 0.0), "delta"),
        ((1.0, 10, 1.0), "delta"),
        ((1.0, 10, math.nan), "delta"),
        ((1.0, 10, "0.1"), "delta"),
    ],
)
def test_bad_input_names_the_argument(args: tuple[object, object, object], name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}`"):
        shuffle_epsilon(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("epsilon", [-0.1, math.inf, math.nan])
def test_shuffle_delta_rejects_bad_epsilon(epsilon: float) -> None:
    with pytest.raises(ValueError, match="`epsilon`"):
        shuffle_delta(1.0, 10, epsilon)


def test_compose_pairs_one_batch_and_a_year() -> None:
    one = compose_shuffled([(4.0, 10**6)], 1e-6, method="pairs")
    assert one.method == PAIRS_METHOD
    assert one.batches[0].epsilon > shuffle_epsilon(4.0, 10**6, 1e-6).epsilon
    assert one.epsilon >= one.batches[0].epsilon
    year = compose_shuffled([(4.0, 10**6)] * 365, 1e-6, method="pairs")
    assert len(year.batches) == 365
    batch = year.batches[0]
    # the batch's own guarantee composed 365 times: above one batch, below the basic sum
    assert batch.epsilon < year.epsilon < 365 * batch.epsilon
    assert 365 * batch.delta <= year.delta
    # mixed batches: a pure (not amplified) one composes as (eps0, 0)
    mixed = compose_shuffled([(4.0, 10**6), (8.0, 10**4)], 1e-6, method="pairs")
    assert not mixed.batches[1].amplified
    assert mixed.epsilon >= 8.0


def test_compose_curve_is_tighter_over_a_year() -> None:
    one = compose_shuffled([(4.0, 10**6)], 1e-6, method="curve")
    own = shuffle_epsilon(4.0, 10**6, 1e-6).epsilon
    assert one.method == CURVE_METHOD
    assert own <= one.epsilon <= own * 1.01  # same theorem, PLD rounding on top
    pairs = compose_shuffled([(4.0, 10**6)] * 90, 1e-6, method="pairs")
    best = compose_shuffled([(4.0, 10**6)] * 90, 1e-6)
    assert best.method == CURVE_METHOD
    assert best.epsilon < pairs.epsilon / 3


def optimistic_exact_composition(eps0: float, n: int, m: int, k: int, delta: float) -> float:
    """A lower bound on ``epsilon`` of ``k`` shuffled randomized-response batches composed."""
    p, q = rr_pair(eps0, n, m)
    keep = (p > 0) & (q > 0)
    upper = {i: math.log(v) for i, v in enumerate(p[keep])}
    lower = {i: math.log(v) for i, v in enumerate(q[keep])}
    # optimistic rounding and dropping masses below e^-60 keep it a lower bound; dp-accounting
    # overflows harmlessly in logsumexp on the far tails
    with np.errstate(over="ignore", divide="ignore"):
        exact = pld.from_two_probability_mass_functions(
            lower,
            upper,
            pessimistic_estimate=False,
            value_discretization_interval=1e-4,
            log_mass_truncation_bound=-60.0,
        )
        return float(exact.self_compose(k).get_epsilon_for_delta(delta))


@pytest.mark.parametrize(("eps0", "n", "k"), [(1.0, 100, 30), (2.0, 300, 10), (4.0, 1000, 8)])
def test_composition_never_below_exact_randomized_response(eps0: float, n: int, k: int) -> None:
    ms = (0, n // 4, n // 2, n - 1)  # any pair gives a lower bound; these include the worst seen
    floor = max(optimistic_exact_composition(eps0, n, m, k, 1e-6) for m in ms)
    for method in ("pairs", "curve"):
        composed = compose_shuffled([(eps0, n)] * k, 1e-6, method=method)
        assert composed.epsilon >= floor, method


def test_compose_huge_losses_stay_valid() -> None:
    """90 days of eps0 = 8 at 10^5 devices: finite, below the basic sum, and no warning.

    dp-accounting overflows (to a pessimistic inf) on some splits of delta; that is silenced.
    """
    window = compose_shuffled([(8.0, 10**5)] * 90, 1e-6, discretization=1e-3)
    assert window.batches[0].epsilon < window.epsilon < 90 * 8.0


def test_benchmark_prints_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import amplification as bench

    bench.main(["--sizes", "4", "--eps0", "1", "--no-compose"])
    out = capsys.readouterr().out
    assert "| 1 | 10^4 | 0.05" in out
