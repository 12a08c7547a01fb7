"""Exact LDP by enumerating the implementation's output distribution, and sampling against it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dp_governor.mechanisms import CMS, HCMS, HashFamily

EPSILONS = [0.5, 1.0, 2.0, 4.0, 8.0]


def _pair_hashing_differently(mech: CMS | HCMS) -> tuple[str, str]:
    """Two inputs whose hashes differ in every row, so the worst case is reachable in each."""
    fam = mech.hash_family
    for i in range(10_000):
        a, b = f"a{i}", f"b{i}"
        h = fam.matrix([a, b], mech.k, mech.m)
        if np.all(h[:, 0] != h[:, 1]):
            return a, b
    raise AssertionError("no pair found")


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_cms_max_log_ratio_equals_epsilon(epsilon: float) -> None:
    mech = CMS(epsilon=epsilon, k=2, m=8, hash_family=HashFamily(1))
    a, b = _pair_hashing_differently(mech)
    pa, pb = mech.output_distribution(a), mech.output_distribution(b)
    assert pa.shape == (2, 256)
    assert math.isclose(pa.sum(), 1.0, abs_tol=1e-12)
    log_ratio = np.abs(np.log(pa) - np.log(pb))
    assert abs(log_ratio.max() - epsilon) < 1e-9


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_hcms_max_log_ratio_equals_epsilon(epsilon: float) -> None:
    mech = HCMS(epsilon=epsilon, k=8, m=64, hash_family=HashFamily(2))
    a, b = _pair_hashing_differently(mech)
    pa, pb = mech.output_distribution(a), mech.output_distribution(b)
    assert pa.shape == (8, 64, 2)
    assert math.isclose(pa.sum(), 1.0, abs_tol=1e-12)
    log_ratio = np.abs(np.log(pa) - np.log(pb))
    assert abs(log_ratio.max() - epsilon) < 1e-9


def test_same_hash_in_every_row_means_no_loss() -> None:
    mech = CMS(epsilon=4.0, k=2, m=8)
    pa = mech.output_distribution("same")
    np.testing.assert_array_equal(pa, mech.output_distribution("same"))


def _chisquare_p(observed: np.ndarray, expected_prob: np.ndarray) -> float:
    expected = expected_prob * observed.sum()
    return float(stats.chisquare(observed, expected).pvalue)


def test_cms_batch_privatize_matches_the_enumerated_distribution() -> None:
    mech = CMS(epsilon=2.0, k=2, m=4, hash_family=HashFamily(3))
    n = 200_000
    reports = mech.privatize(["v"] * n, rng=np.random.default_rng(0))
    y = reports.bits[:, 0] >> 4  # the 4 bits, big-endian, as an integer in [0, 16)
    observed = np.bincount(reports.j * 16 + y, minlength=32)
    probs = np.zeros(32)
    full = mech.output_distribution("v")  # (2, 16)
    probs[:] = full.reshape(-1)
    assert _chisquare_p(observed, probs) > 1e-6


def test_hcms_batch_privatize_matches_the_enumerated_distribution() -> None:
    mech = HCMS(epsilon=1.0, k=2, m=4, hash_family=HashFamily(3))
    n = 200_000
    reports = mech.privatize(["v"] * n, rng=np.random.default_rng(0))
    observed = np.bincount((reports.j * 4 + reports.l) * 2 + (reports.bit > 0), minlength=16)
    assert _chisquare_p(observed, mech.output_distribution("v").reshape(-1)) > 1e-6


def test_cms_single_reports_match_the_enumerated_distribution() -> None:
    mech = CMS(epsilon=2.0, k=2, m=4, hash_family=HashFamily(4))
    n = 20_000
    reports = [mech.privatize_one("v") for _ in range(n)]
    observed = np.bincount([r.j * 16 + (r.bits[0] >> 4) for r in reports], minlength=32)
    assert _chisquare_p(observed, mech.output_distribution("v").reshape(-1)) > 1e-6


def test_hcms_single_reports_match_the_enumerated_distribution() -> None:
    mech = HCMS(epsilon=1.0, k=2, m=4, hash_family=HashFamily(4))
    n = 20_000
    reports = [mech.privatize_one("v") for _ in range(n)]
    codes = [(r.j * 4 + r.l) * 2 + (r.bit > 0) for r in reports]
    observed = np.bincount(codes, minlength=16)
    assert _chisquare_p(observed, mech.output_distribution("v").reshape(-1)) > 1e-6


def test_flip_probabilities_are_exact() -> None:
    # Flip probabilities 1/(1+e^(eps/2)) and 1/(1+e^eps), to 10 digits.
    table = {
        1: (0.3775406688, 0.2689414214),
        2: (0.2689414214, 0.1192029220),
        4: (0.1192029220, 0.0179862100),
        6: (0.0474258732, 0.0024726232),
        8: (0.0179862100, 0.0003353501),
    }
    for eps, (p_cms, p_hcms) in table.items():
        cms = CMS(epsilon=eps, k=4, m=8)
        hcms = HCMS(epsilon=eps, k=4, m=8)
        assert abs(cms.flip_probability - p_cms) < 1e-10
        assert abs(hcms.flip_probability - p_hcms) < 1e-10
        assert math.isclose(cms.flip_probability, 1 / (1 + math.exp(eps / 2)), rel_tol=1e-15)
        assert math.isclose(hcms.flip_probability, 1 / (1 + math.exp(eps)), rel_tol=1e-15)
        assert math.isclose(1 - 2 * cms.flip_probability, 1 / cms.c, rel_tol=1e-14)
        assert math.isclose(1 - 2 * hcms.flip_probability, 1 / hcms.c, rel_tol=1e-14)
