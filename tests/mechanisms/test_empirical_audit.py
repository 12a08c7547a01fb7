"""The empirical privacy audit: the deployed randomizers pass, broken variants are caught."""

from __future__ import annotations

import numpy as np
import pytest

from dp_governor.mechanisms import CMS, HCMS
from dp_governor.mechanisms.empirical_audit import audit, clopper_pearson
from dp_governor.mechanisms.hashing import factorize
from dp_governor.mechanisms.hcms import HcmsReports
from dp_governor.mechanisms.randomness import bernoulli
from dp_governor.policies import default_policies, mechanism_for

POLICIES = {p.name: p for p in default_policies()}
SAMPLES = 200_000  # the fast CI variant; `dpgov selftest` runs 2,000,000 per input


def test_clopper_pearson_known_values() -> None:
    lo, hi = clopper_pearson(5, 10, 0.05)
    assert lo == pytest.approx(0.187086, abs=1e-6) and hi == pytest.approx(0.812914, abs=1e-6)
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0 and clopper_pearson(10, 10, 0.05)[1] == 1.0
    with pytest.raises(ValueError):
        clopper_pearson(11, 10, 0.05)


@pytest.mark.parametrize(
    "name", ["emoji", "safari-energy-domains", "quicktype", "health-types", "safari-autoplay"]
)
def test_each_deployed_randomizer_leaks_what_it_is_charged(name: str) -> None:
    policy = POLICIES[name]
    result = audit(
        mechanism_for(policy),
        "alpha-word",
        "zulu-entry",
        epsilon=policy.epsilon_per_report,
        samples=SAMPLES,
        rng=np.random.default_rng(20261122),
    )
    assert result.passed, result
    assert result.lower <= policy.epsilon_per_report <= result.upper


def _emoji() -> CMS:
    mech = mechanism_for(POLICIES["emoji"])
    assert isinstance(mech, CMS)
    return mech


def test_a_randomizer_at_epsilon_plus_a_quarter_is_caught() -> None:
    mech = _emoji()
    leaky = CMS(4.25, mech.k, mech.m, mech.hash_family)
    result = audit(
        mech,
        "a",
        "b",
        epsilon=4.0,
        samples=SAMPLES,
        rng=np.random.default_rng(1),
        privatize=lambda values, g: leaky.privatize(values, rng=g),
    )
    assert result.leaks_more and not result.passed, result


def test_cms_flipping_at_epsilon_instead_of_half_is_caught() -> None:
    mech = _emoji()
    # CMS(2 eps) flips each bit with 1 / (1 + e^eps): the bug of using eps where eps/2 belongs
    wrong = CMS(8.0, mech.k, mech.m, mech.hash_family)
    result = audit(
        mech,
        "a",
        "b",
        epsilon=4.0,
        samples=SAMPLES,
        rng=np.random.default_rng(2),
        privatize=lambda values, g: wrong.privatize(values, rng=g),
    )
    assert result.leaks_more, result


def test_hcms_ignoring_the_hash_row_is_caught() -> None:
    mech = mechanism_for(POLICIES["safari-energy-domains"])
    assert isinstance(mech, HCMS)

    def row_zero(values: np.ndarray, g: np.random.Generator) -> HcmsReports:
        distinct, inverse = factorize(values)
        fp = mech.hash_family.fingerprint(distinct).take(inverse)
        n = len(inverse)
        j = g.integers(0, mech.k, size=n, dtype=np.int64)
        col = g.integers(0, mech.m, size=n, dtype=np.int64)
        flips = bernoulli(mech.flip_probability, n, rng=g)
        return HcmsReports(j, col, mech._bits(fp, np.zeros(n, np.int64), col, flips))

    result = audit(
        mech,
        "a",
        "b",
        epsilon=4.0,
        samples=SAMPLES,
        rng=np.random.default_rng(3),
        privatize=row_zero,
    )
    assert not result.reaches and not result.passed, result


def test_samples_are_drawn_a_chunk_at_a_time_and_reported() -> None:
    calls: list[tuple[int, int]] = []
    result = audit(
        _emoji(),
        "a",
        "b",
        epsilon=4.0,
        samples=1000,
        rng=np.random.default_rng(3),
        chunk=300,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(n, 2000) for n in (300, 600, 900, 1000, 1300, 1600, 1900, 2000)]
    assert result.samples == 1000 and all(0 <= h <= 1000 for h in result.hits)
    with pytest.raises(ValueError, match="chunk"):
        audit(_emoji(), "a", "b", epsilon=4.0, samples=10, rng=np.random.default_rng(), chunk=0)
