"""Wang et al.'s variation-ratio pair: exact evaluation, published figures, and why it is not used.

The pair's own ``delta`` is checked against a term-by-term sum over its counts; the published
figures against the authors' reference code; the reduction itself against the exact shuffled
batch of small randomizers, enumerated (the counterexample that keeps it out of the service).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from dp_governor.budget.privacy.amplification import shuffle_delta
from dp_governor.budget.privacy.variation_ratio import (
    VariationParameters,
    clone_margin,
    variation_ratio_delta,
    variation_ratio_epsilon,
)
from dp_governor.mechanisms import CMS, HCMS, HashFamily

FloatArray = npt.NDArray[np.float64]
ROUNDING = 1e-14  # float noise of the term-by-term sums below

# a binary randomizer with the (p, beta, q)-variation property: R(x0) = (0.55, 0.45), R(x1) =
# (0.30, 0.70); p = 0.55 / 0.30, beta = 0.25, q = p, so gamma = 0.15 > 0
COUNTER = ((0.55, 0.45), (0.30, 0.70))


def pair_delta(params: VariationParameters, n: int, eps: float) -> float:
    """The pair's ``delta(eps)``, summed over every observation ``(a, b)`` (small ``n``)."""
    p, alpha, gamma, r = params.p, params.alpha, params.leftover, params.r

    def others(i: int, j: int) -> float:
        if i < 0 or j < 0 or i + j > n - 1:
            return 0.0
        ways = math.comb(n - 1, i) * math.comb(n - 1 - i, j)
        return ways * r ** (i + j) * (1.0 - 2.0 * r) ** (n - 1 - i - j)

    total = 0.0
    for a in range(n + 1):
        for b in range(n + 1 - a):
            first, second, rest = others(a - 1, b), others(a, b - 1), others(a, b)
            big = p * alpha * first + alpha * second + gamma * rest
            small = alpha * first + p * alpha * second + gamma * rest
            total += max(0.0, big - math.exp(eps) * small)
    return total


def histograms(rows: list[FloatArray]) -> dict[tuple[int, ...], float]:
    """Law of the shuffled batch (the histogram of outputs) of independent devices."""
    law: dict[tuple[int, ...], float] = {(0,) * rows[0].size: 1.0}
    for row in rows:
        step: dict[tuple[int, ...], float] = {}
        for hist, mass in law.items():
            for y in np.flatnonzero(row):
                key = (*hist[:y], hist[y] + 1, *hist[y + 1 :])
                step[key] = step.get(key, 0.0) + mass * float(row[y])
        law = step
    return law


def shuffled_delta(
    table: FloatArray, pair: tuple[int, int], others: tuple[int, ...], eps: float
) -> float:
    """Exact ``delta(eps)`` of the shuffled batch, device 1's input ``pair[0]`` vs ``pair[1]``."""
    rest = [table[x] for x in others]
    p = histograms([table[pair[0]], *rest])
    q = histograms([table[pair[1]], *rest])
    return math.fsum(max(0.0, p.get(k, 0.0) - math.exp(eps) * q.get(k, 0.0)) for k in p)


@pytest.mark.parametrize(
    "params",
    [
        VariationParameters.generic(1.0),
        VariationParameters.generic(4.0),
        VariationParameters.cms(4.0),
        VariationParameters.hcms(2.0),
        VariationParameters.hcms(8.0),
        VariationParameters.of_distributions(COUNTER),
    ],
    ids=["generic-1", "generic-4", "cms-4", "hcms-2", "hcms-8", "counter"],
)
@pytest.mark.parametrize("n", [1, 2, 3, 10, 40, 150])
def test_evaluation_is_the_pairs_delta_from_above(params: VariationParameters, n: int) -> None:
    for eps in (0.0, 0.05, 0.3, 1.0):
        exact = pair_delta(params, n, eps)
        bound = variation_ratio_delta(params, n, eps)
        assert bound >= exact - ROUNDING
        assert bound <= exact * (1.0 + 1e-5) + 1e-12  # only the rounding allowance above it


# amplificationUB(p, beta, q, q, n, 1e-6, T=20) of github.com/wangsw/PrivacyAmplification
# (unifiedamplification.py): the upper end of its bisection, about 1e-6 above its crossing
REFERENCE = [
    (1.0, 10**5, VariationParameters.generic, 0.012431144714355469),
    (1.0, 10**5, VariationParameters.cms, 0.008792877197265625),
    (1.0, 10**5, VariationParameters.hcms, 0.008517265319824219),
]


@pytest.mark.parametrize(("eps0", "n", "make", "published"), REFERENCE)
def test_reproduces_the_reference_code(eps0: float, n: int, make: object, published: float) -> None:
    assert callable(make)
    ours = variation_ratio_epsilon(make(eps0), n, 1e-6)
    assert ours == pytest.approx(published, rel=1e-3)


def test_reproduces_the_figures_quoted_at_the_reference_point() -> None:
    # eps0 = 4, n = 10^6, delta = 10^-6: about 0.034 generic, 0.030 CMS, 0.024 HCMS (issue 32)
    figures = [
        variation_ratio_epsilon(make(4.0), 10**6, 1e-6)
        for make in (VariationParameters.generic, VariationParameters.cms, VariationParameters.hcms)
    ]
    assert figures == pytest.approx([0.0343, 0.0302, 0.0236], abs=5e-4)


def test_the_reduction_fails_for_a_randomizer_with_the_property() -> None:
    """Two devices, binary outputs: the shuffled batch is further apart than the pair allows.

    Device 2 holds ``x0``. Histogram of outputs: P = (0.2025, 0.495, 0.3025) for no/one/two
    zeros, Q = (0.315, 0.52, 0.165); at eps = 0.5 only "two zeros" counts:
    0.3025 - e^0.5 * 0.165 = 0.0305. The pair gives 0.0166. FMT21 stays above.
    """
    table = np.array(COUNTER)
    params = VariationParameters.of_distributions(table)
    assert params.p == pytest.approx(0.55 / 0.30)
    assert params.beta == pytest.approx(0.25)
    assert params.leftover == pytest.approx(0.15)
    exact = shuffled_delta(table, (0, 1), (0,), 0.5)
    assert exact == pytest.approx(0.3025 - math.exp(0.5) * 0.165, rel=1e-12)
    assert variation_ratio_delta(params, 2, 0.5) < 0.6 * exact
    assert shuffle_delta(math.log(params.p), 2, 0.5) >= exact


def test_the_reduction_fails_at_ten_devices_too() -> None:
    # nine other devices at x0: the batch is the count of zeros
    a, b = COUNTER[0][0], COUNTER[1][0]
    params = VariationParameters.of_distributions(COUNTER)
    n, eps = 10, 0.5
    others = stats.binom.pmf(np.arange(n), n - 1, a)
    p = a * np.append(0.0, others) + (1.0 - a) * np.append(others, 0.0)
    q = b * np.append(0.0, others) + (1.0 - b) * np.append(others, 0.0)
    exact = float(np.maximum(p - math.exp(eps) * q, 0.0).sum())
    assert variation_ratio_delta(params, n, eps) < exact
    assert shuffle_delta(math.log(params.p), n, eps) >= exact


def test_generic_parameters_hold_on_the_same_randomizer() -> None:
    # with beta at its largest the leftover is empty; the pair then dominates here
    table = np.array(COUNTER)
    p = VariationParameters.of_distributions(table).p
    generic = VariationParameters(p, (p - 1.0) / (p + 1.0), p)
    assert generic.leftover == pytest.approx(0.0, abs=1e-12)
    for others in itertools.combinations_with_replacement(range(2), 3):
        for eps in (0.05, 0.2, 0.5):
            exact = max(
                shuffled_delta(table, (0, 1), others, eps),
                shuffled_delta(table, (1, 0), others, eps),
            )
            assert variation_ratio_delta(generic, 4, eps) >= exact - ROUNDING


def _distinct_inputs(mech: CMS | HCMS, count: int) -> list[str]:
    """``count`` inputs with distinct hashes (one row), so every pair is at the largest distance."""
    found: dict[int, str] = {}
    for i in range(10_000):
        value = f"v{i}"
        found.setdefault(int(mech.hash_family.matrix([value], 1, mech.m)[0, 0]), value)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("no inputs found")


@pytest.mark.parametrize(
    ("mech", "expected"),
    [
        (CMS(epsilon=4.0, k=1, m=4, hash_family=HashFamily(3)), VariationParameters.cms(4.0)),
        (CMS(epsilon=2.0, k=1, m=4, hash_family=HashFamily(3)), VariationParameters.cms(2.0)),
        (HCMS(epsilon=4.0, k=1, m=4, hash_family=HashFamily(3)), VariationParameters.hcms(4.0)),
        (HCMS(epsilon=1.0, k=1, m=4, hash_family=HashFamily(3)), VariationParameters.hcms(1.0)),
    ],
    ids=["cms-4", "cms-2", "hcms-4", "hcms-1"],
)
def test_sketch_parameters_are_the_closed_forms(
    mech: CMS | HCMS, expected: VariationParameters
) -> None:
    table = np.array([mech.output_distribution(v).ravel() for v in _distinct_inputs(mech, 4)])
    found = VariationParameters.of_distributions(table)
    assert found.p == pytest.approx(expected.p, rel=1e-9)
    assert found.beta == pytest.approx(expected.beta, rel=1e-9)
    assert found.q == pytest.approx(expected.q, rel=1e-9)


@pytest.mark.parametrize(
    ("mech", "params", "eps", "pair", "exact"),
    [
        (
            CMS(epsilon=4.0, k=1, m=4, hash_family=HashFamily(3)),
            VariationParameters.cms(4.0),
            3.8,
            0.0083,
            0.109,
        ),
        (
            HCMS(epsilon=2.0, k=1, m=4, hash_family=HashFamily(3)),
            VariationParameters.hcms(2.0),
            1.73,
            0.0062,
            0.0456,
        ),
    ],
    ids=["cms-4", "hcms-2"],
)
def test_the_reduction_fails_for_the_services_sketches(
    mech: CMS | HCMS, params: VariationParameters, eps: float, pair: float, exact: float
) -> None:
    """Two devices both at ``x0``, one hash row: the batch is 13x (CMS) and 7x (HCMS) the pair.

    The tables are the mechanisms' own output distributions (``output_distribution``), whose
    ``(p, beta, q)`` are the closed forms (test above); FMT21 stays above the exact value.
    """
    table = np.array([mech.output_distribution(v).ravel() for v in _distinct_inputs(mech, 4)])
    found = shuffled_delta(table, (0, 1), (0,), eps)
    assert found == pytest.approx(exact, rel=0.01)
    assert variation_ratio_delta(params, 2, eps) == pytest.approx(pair, rel=0.02)
    assert shuffle_delta(mech.epsilon, 2, eps) >= found


@pytest.mark.parametrize(
    "mech",
    [
        CMS(epsilon=4.0, k=1, m=4, hash_family=HashFamily(3)),
        CMS(epsilon=2.0, k=2, m=4, hash_family=HashFamily(5)),
        HCMS(epsilon=4.0, k=1, m=4, hash_family=HashFamily(3)),
        HCMS(epsilon=1.0, k=2, m=4, hash_family=HashFamily(5)),
    ],
    ids=["cms-4", "cms-2-k2", "hcms-4", "hcms-1-k2"],
)
def test_sketches_miss_the_generic_pairs_clone_condition(mech: CMS | HCMS) -> None:
    # where both candidates agree on a bit the third input does not, it has e^-eps of their
    # probability, short of the 2 / (e^eps + 1) the leftover-free decomposition needs
    table = np.array([mech.output_distribution(v).ravel() for v in _distinct_inputs(mech, 3)])
    expected = (math.exp(mech.epsilon) + 1.0) / (2.0 * math.exp(mech.epsilon))
    assert clone_margin(table) == pytest.approx(expected, rel=1e-9)
    assert clone_margin(table) < 1.0


def test_binary_randomized_response_meets_the_clone_condition() -> None:
    # two inputs only: the third input is one of the two candidates, the FMT23 setting
    e = math.exp(2.0)
    table = np.array([[e, 1.0], [1.0, e]]) / (e + 1.0)
    assert clone_margin(table) >= 1.0 - 1e-12


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"p": 1.0, "beta": 0.1, "q": 2.0}, "`p`"),
        ({"p": math.inf, "beta": 0.1, "q": 2.0}, "`p`"),
        ({"p": 3.0, "beta": 0.6, "q": 3.0}, "`beta`"),
        ({"p": 3.0, "beta": 0.0, "q": 3.0}, "`beta`"),
        ({"p": 3.0, "beta": 0.5, "q": 0.5}, "`q`"),
        ({"p": 3.0, "beta": "0.5", "q": 3.0}, "`beta`"),
    ],
)
def test_bad_parameters_are_refused_by_name(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        VariationParameters(**kwargs)  # type: ignore[arg-type]


def test_bad_arguments_are_refused_by_name() -> None:
    params = VariationParameters.generic(2.0)
    with pytest.raises(ValueError, match="`n`"):
        variation_ratio_delta(params, 0, 0.1)
    with pytest.raises(ValueError, match="`epsilon`"):
        variation_ratio_delta(params, 10, -0.1)
    with pytest.raises(ValueError, match="`delta`"):
        variation_ratio_epsilon(params, 10, 1.0)
    with pytest.raises(ValueError, match="`rows`"):
        VariationParameters.of_distributions([[0.5, 0.5], [1.0, 0.0]])


def rr_curve(eps0: float, n: int, m: int, eps: float) -> float:
    """Exact ``delta(eps)`` of shuffled binary randomized response, ``m`` other devices at 1."""
    q = 1.0 / (1.0 + math.exp(-eps0))
    others = np.convolve(
        stats.binom.pmf(np.arange(m + 1), m, q),
        stats.binom.pmf(np.arange(n - m), n - 1 - m, 1.0 - q),
    )
    shifted, same = np.append(0.0, others), np.append(others, 0.0)
    p_law = q * shifted + (1.0 - q) * same
    q_law = (1.0 - q) * shifted + q * same
    return float(np.maximum(p_law - math.exp(eps) * q_law, 0.0).sum())


@pytest.mark.parametrize("eps0", [1.0, 4.0])
@pytest.mark.parametrize("n", [10, 100, 1000, 3000])
def test_generic_pair_dominates_shuffled_randomized_response(eps0: float, n: int) -> None:
    """Where its condition holds (clone margin 1), the generic pair is above the exact curve."""
    params = VariationParameters.generic(eps0)
    ms = sorted({0, 1, n // 4, n // 2, (3 * n) // 4, n - 2, n - 1} & set(range(n)))
    for eps in (0.05, 0.2, 0.5, 1.0):
        if eps >= eps0:
            continue
        exact = max(rr_curve(eps0, n, m, eps) for m in ms)
        assert variation_ratio_delta(params, n, eps) >= exact - ROUNDING


def revealed_leftover_delta(params: VariationParameters, n: int, eps: float) -> float:
    """``(1 - gamma)`` times FMT21's pair with clone probability ``2 r`` (term by term)."""
    p, rate = params.p, 2.0 * params.r
    total = 0.0
    for c in range(n):
        fair = stats.binom.pmf(np.arange(-1, c + 2), c, 0.5)  # B(a - 1) and B(a), a = 0..c + 1
        p_law = (p * fair[:-1] + fair[1:]) / (p + 1.0)
        q_law = (fair[:-1] + p * fair[1:]) / (p + 1.0)
        gap = float(np.maximum(p_law - math.exp(eps) * q_law, 0.0).sum())
        total += float(stats.binom.pmf(c, n - 1, rate)) * gap
    return (1.0 - params.leftover) * total


def test_revealing_the_leftover_gives_a_pair_that_holds() -> None:
    """The pair docs/amplification.md proves, on every counterexample to the count pair."""
    cases: list[tuple[FloatArray, VariationParameters, tuple[int, ...], float]] = [
        (np.array(COUNTER), VariationParameters.of_distributions(COUNTER), (0,), 0.5),
    ]
    for mech, params, eps in (
        (CMS(epsilon=4.0, k=1, m=4, hash_family=HashFamily(3)), VariationParameters.cms(4.0), 3.8),
        (
            HCMS(epsilon=2.0, k=1, m=4, hash_family=HashFamily(3)),
            VariationParameters.hcms(2.0),
            1.73,
        ),
    ):
        table = np.array([mech.output_distribution(v).ravel() for v in _distinct_inputs(mech, 4)])
        cases.append((table, params, (0,), eps))
        cases.append((table, params, (2, 3), eps / 2.0))
    for table, params, others, eps in cases:
        exact = shuffled_delta(table, (0, 1), others, eps)
        n = len(others) + 1
        assert revealed_leftover_delta(params, n, eps) >= exact - ROUNDING
        assert variation_ratio_delta(params, n, eps) <= revealed_leftover_delta(params, n, eps)


def test_benchmark_prints_fmt21_beside_the_pair(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import amplification as bench

    bench.main(["--variation", "--sizes", "4", "--eps0", "4"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 4 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    fmt21, generic, cms, hcms = (float(cell) for cell in cells[2:6])
    assert fmt21 == pytest.approx(0.601, abs=1e-3)  # the "Figures" table of amplification.md
    assert fmt21 > generic > cms > hcms
