"""Estimators against the analytic moments, with tolerances derived from those moments.

Every tolerance is ``Z`` standard deviations of the statistic being checked: ``sqrt(Var/T)`` for
a mean over ``T`` trials; ``Var * sqrt((kurtosis - 1)/T)`` for a sample variance (using the
sample kurtosis, because the small-``m`` estimators are heavy-tailed); ``sqrt(2 d)`` for a
chi-square statistic with ``d`` degrees of freedom.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dp_governor.mechanisms import CMS, HCMS, HashFamily, Sketch
from dp_governor.mechanisms.variance import (
    cms_variance_bound,
    cms_variance_exact,
    fixed_family_mean,
    fixed_family_variance,
    hcms_variance_bound,
    hcms_variance_exact,
)

Z = 5.0
TOY_F = np.array([400, 200, 120, 80, 60, 40, 30, 20, 15, 10, 8, 6, 4, 3, 2, 1, 1])
TOY_ITEMS = [f"toy{i}" for i in range(TOY_F.size)]
TOY_INDEX = np.repeat(np.arange(TOY_F.size), TOY_F)
TOY_N = int(TOY_F.sum())


def _f2_others(f: np.ndarray) -> np.ndarray:
    squares = f.astype(float) ** 2
    others: np.ndarray = squares.sum() - squares
    return others


def test_toy_vector_exact_variances_match_the_published_values() -> None:
    f2o = _f2_others(TOY_F)
    cms = cms_variance_exact(2.0, 4, 8, TOY_N, TOY_F, f2o)
    hcms = hcms_variance_exact(2.0, 4, 8, TOY_N, TOY_F, f2o)
    assert cms[0] == pytest.approx(3686.655, abs=1e-3)
    assert cms[9] == pytest.approx(9439.155, abs=1e-3)
    assert hcms[0] == pytest.approx(4115.570, abs=1e-3)
    assert hcms[9] == pytest.approx(10313.785, abs=1e-3)
    f2 = float((TOY_F.astype(float) ** 2).sum())
    assert cms_variance_bound(2.0, 4, 8, TOY_N, f2) == pytest.approx(10661.941, abs=1e-3)
    assert hcms_variance_bound(2.0, 4, 8, TOY_N, f2) == pytest.approx(11547.999, abs=1e-3)
    assert np.all(cms <= cms_variance_bound(2.0, 4, 8, TOY_N, f2))


def test_fixed_family_expectation_reproduces_the_documented_bias() -> None:
    h = np.random.default_rng(7).integers(0, 8, (4, 17))
    assert fixed_family_mean(TOY_F, h, 8)[9] == pytest.approx(-122.857, abs=1e-3)


def _check_mean_and_variance(samples: np.ndarray, mean: np.ndarray, var: np.ndarray) -> None:
    t = samples.shape[0]
    emp_mean = samples.mean(axis=0)
    emp_var = samples.var(axis=0, ddof=1)
    kurt = stats.kurtosis(samples, axis=0, fisher=False)
    assert np.all(np.abs(emp_mean - mean) < Z * np.sqrt(var / t)), (emp_mean, mean)
    assert np.all(np.abs(emp_var - var) < Z * var * np.sqrt((kurt - 1) / t)), (emp_var, var)


@pytest.mark.parametrize(
    ("mechanism", "variance"), [(CMS, cms_variance_exact), (HCMS, hcms_variance_exact)]
)
def test_unbiased_with_the_exact_variance_over_random_families(
    mechanism: type[CMS] | type[HCMS], variance: object
) -> None:
    # A fresh family per trial: the paper's expectation is over the coins and the family.
    trials = 10_000
    rng = np.random.default_rng(11)
    watched = [0, 9]  # f = 400 and f = 10
    samples = np.empty((trials, len(watched)))
    for t in range(trials):
        mech = mechanism(epsilon=2.0, k=4, m=8, hash_family=HashFamily(t))
        sketch: Sketch = mech.sketch()
        sketch.add(mech.privatize_indices(TOY_ITEMS, TOY_INDEX, rng=rng))
        samples[t] = sketch.estimate([TOY_ITEMS[i] for i in watched]).counts
    f = TOY_F[watched]
    exact = variance(2.0, 4, 8, TOY_N, f, _f2_others(TOY_F)[watched])  # type: ignore[operator]
    _check_mean_and_variance(samples, f.astype(float), exact)


@pytest.mark.parametrize("mechanism", [CMS, HCMS])
def test_fixed_family_mean_and_variance(mechanism: type[CMS] | type[HCMS]) -> None:
    # One deployed family: the estimate is biased by collisions exactly as E[f~ | H] says.
    mech = mechanism(epsilon=2.0, k=4, m=8, hash_family=HashFamily(123))
    h = mech.hash_family.matrix(TOY_ITEMS, 4, 8)
    mean = fixed_family_mean(TOY_F, h, 8)
    var = fixed_family_variance(mech.name, 2.0, TOY_F, h, 8)
    assert np.max(np.abs(mean - TOY_F)) > 10  # the bias is real at this size
    trials = 10_000
    rng = np.random.default_rng(5)
    samples = np.empty((trials, TOY_F.size))
    for t in range(trials):
        sketch: Sketch = mech.sketch()
        sketch.add(mech.privatize_indices(TOY_ITEMS, TOY_INDEX, rng=rng))
        samples[t] = sketch.estimate(TOY_ITEMS).counts
    _check_mean_and_variance(samples, mean, var)


def _deployment_errors(
    mech: CMS | HCMS, d: int, n: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = [f"item-{i}" for i in range(d)]
    weights = np.arange(1, d + 1, dtype=float) ** -1.1
    index = rng.choice(d, size=n, p=weights / weights.sum())
    truth = np.bincount(index, minlength=d)
    est = mech.sketch().add(mech.privatize_indices(vocab, index, rng=rng)).estimate(vocab)  # type: ignore[arg-type]
    f2o = _f2_others(truth)
    exact = mech.variance(n, truth, f2o)
    return est.counts - truth, exact, est.stderr


@pytest.mark.parametrize(
    ("mech", "d", "sd_expected"),
    [
        (CMS(epsilon=4.0, k=65536, m=1024, hash_family=HashFamily(21)), 2600, 427.0),
        (HCMS(epsilon=4.0, k=1024, m=32768, hash_family=HashFamily(22)), 250_000, 1037.3),
    ],
    ids=["emoji-cms", "safari-hcms"],
)
def test_deployment_sizes_error_and_calibrated_intervals(
    mech: CMS | HCMS, d: int, sd_expected: float
) -> None:
    n = 1_000_000
    err, exact, stderr = _deployment_errors(mech, d, n, seed=d)
    # The exact variance at small counts gives the deployment's standard deviation (Appendices A
    # and B of Apple's paper at its deployed parameters: 427 for Emoji, 1,037 for Safari).
    assert np.sqrt(np.median(exact)) == pytest.approx(sd_expected, rel=0.01)
    # Sum of squared standardized errors is chi-square with d degrees of freedom.
    chi2 = float((err**2 / exact).sum())
    assert abs(chi2 - d) < Z * np.sqrt(2 * d), (chi2, d)
    # The empirical sd over the (small-count) items matches the analytic one.
    small = exact < np.quantile(exact, 0.5)
    emp_sd = float(np.sqrt((err[small] ** 2).mean()))
    sd = float(np.sqrt(exact[small].mean()))
    assert abs(emp_sd / sd - 1) < Z / np.sqrt(2 * small.sum())
    # 95% intervals from the reported stderr cover the truth for 93-97% of the items.
    coverage = float(np.mean(np.abs(err) <= 1.959963984540054 * stderr))
    assert 0.93 <= coverage <= 0.97, coverage
