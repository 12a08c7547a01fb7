"""Bad parameters and bad report bodies are refused with messages naming the field."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from dp_governor.mechanisms import CMS, HCMS, SFP, CmsSketch, HcmsSketch, InvalidReport

BAD_EPSILONS: list[Any] = [float("nan"), float("inf"), -float("inf"), 0, -1, "4", True, None]


@pytest.mark.parametrize("eps", BAD_EPSILONS)
@pytest.mark.parametrize("mechanism", [CMS, HCMS])
def test_bad_epsilon(mechanism: Any, eps: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="`epsilon`"):
        mechanism(epsilon=eps, k=4, m=8)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0, "m": 8}, "`k`"),
        ({"k": 4.0, "m": 8}, "`k`"),
        ({"k": 2**21, "m": 8}, "`k`"),
        ({"k": 4, "m": 1}, "`m`"),
        ({"k": 4, "m": True}, "`m`"),
        ({"k": 4, "m": "8"}, "`m`"),
    ],
)
@pytest.mark.parametrize("mechanism", [CMS, HCMS])
def test_bad_sizes(mechanism: Any, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises((ValueError, TypeError), match=field):
        mechanism(epsilon=1.0, **kwargs)


def test_hcms_needs_a_power_of_two_but_cms_does_not() -> None:
    with pytest.raises(ValueError, match="`m` must be a power of 2, got 1000"):
        HCMS(epsilon=1.0, k=4, m=1000)
    cms = CMS(epsilon=1.0, k=4, m=1000)
    reports = cms.privatize(["a", "b"] * 50, rng=np.random.default_rng(0))
    assert reports.bits.shape == (100, 125)
    est = cms.sketch().add(reports).estimate(["a"])
    assert est.n == 100


def test_numpy_integers_are_accepted_and_coerced() -> None:
    mech = CMS(epsilon=np.float64(2.0), k=np.int64(4), m=np.int32(8))  # type: ignore[arg-type]
    assert type(mech.k) is int and type(mech.m) is int and type(mech.epsilon) is float


def test_sfp_validation() -> None:
    with pytest.raises(ValueError, match="`epsilon_fragment`"):
        SFP(epsilon_word=2.0, epsilon_fragment=float("nan"))
    with pytest.raises(ValueError, match="`alphabet`"):
        SFP(epsilon_word=2.0, epsilon_fragment=6.0, alphabet="abc")
    with pytest.raises(ValueError, match="`alphabet`"):
        SFP(epsilon_word=2.0, epsilon_fragment=6.0, alphabet="aa ")
    assert SFP(epsilon_word=2.0, epsilon_fragment=6.0).epsilon == 8.0


CMS_MECH = CMS(epsilon=4.0, k=16, m=12)
GOOD_BITS = base64.b64encode(bytes([0xFF, 0xF0])).decode()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"j": 16, "bits": GOOD_BITS}, "`j`"),
        ({"j": -1, "bits": GOOD_BITS}, "`j`"),
        ({"j": True, "bits": GOOD_BITS}, "`j`"),
        ({"j": 1.0, "bits": GOOD_BITS}, "`j`"),
        ({"j": "1", "bits": GOOD_BITS}, "`j`"),
        ({"bits": GOOD_BITS}, "`j`"),
        ({"j": 1, "bits": "not base64!"}, "`bits`"),
        ({"j": 1, "bits": base64.b64encode(b"\x00").decode()}, "`bits`"),
        ({"j": 1, "bits": base64.b64encode(b"\xff\xff").decode()}, "`bits`"),  # padding set
        ({"j": 1, "bits": 5}, "`bits`"),
        ({"j": 1, "bits": GOOD_BITS, "epsilon": 9}, "`epsilon`"),
        ([1, 2], "`report`"),
    ],
)
def test_cms_bad_bodies(body: Any, field: str) -> None:
    with pytest.raises(InvalidReport, match=field):
        CMS_MECH.parse_report(body)


HCMS_MECH = HCMS(epsilon=4.0, k=16, m=32)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"j": 16, "l": 0, "bit": 1}, "`j`"),
        ({"j": 0, "l": 32, "bit": 1}, "`l`"),
        ({"j": 0, "l": -1, "bit": 1}, "`l`"),
        ({"j": 0, "l": 0, "bit": 0}, "`bit`"),
        ({"j": 0, "l": 0, "bit": True}, "`bit`"),
        ({"j": 0, "l": 0, "bit": 1.0}, "`bit`"),
        ({"j": 0, "l": 0, "bit": 2}, "`bit`"),
        ({"j": 0, "l": 0}, "`bit`"),
        ({"j": 0, "l": 0, "bit": 1, "k": 4}, "`k`"),
    ],
)
def test_hcms_bad_bodies(body: Any, field: str) -> None:
    with pytest.raises(InvalidReport, match=field) as info:
        HCMS_MECH.parse_report(body)
    assert info.value.field == field.strip("`")


def test_sfp_bad_bodies_name_the_nested_field() -> None:
    sfp = SFP(epsilon_word=2.0, epsilon_fragment=6.0, k=4, m=8, k_fragment=4, m_fragment=8)
    good = sfp.privatize_one("hello").to_dict()
    for position in (1, 10, 2.0, True, "2"):
        with pytest.raises(InvalidReport, match="`position`"):
            sfp.parse_report({**good, "position": position})
    with pytest.raises(InvalidReport, match=r"`fragment\.j`"):
        sfp.parse_report({**good, "fragment": {**good["fragment"], "j": 4}})
    with pytest.raises(InvalidReport, match=r"`word\.bits`"):
        sfp.parse_report({**good, "word": {"j": 0, "bits": "AAAA"}})


def test_sketch_add_refuses_out_of_range_reports() -> None:
    mech = HCMS(epsilon=1.0, k=4, m=8)
    bad = mech.privatize(["a"], rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="`j`"):
        mech.sketch().add(type(bad)(bad.j + 4, bad.l, bad.bit))
    with pytest.raises(ValueError, match="`l`"):
        mech.sketch().add(type(bad)(bad.j, bad.l + 8, bad.bit))
    with pytest.raises(ValueError, match="bits"):
        mech.sketch().add(type(bad)(bad.j, bad.l, bad.bit * 0))


def test_from_arrays_round_trip_and_consistency_checks() -> None:
    cms = CMS(epsilon=2.0, k=8, m=16)
    sk = cms.sketch().add(cms.privatize(["x", "y"] * 40, rng=np.random.default_rng(1)))
    again = CmsSketch.from_arrays(cms, sk.counts, sk.row_counts)
    assert np.array_equal(again.counts, sk.counts) and again.n == 80
    with pytest.raises(ValueError, match="P\\[j, l\\] <= n_j"):
        CmsSketch.from_arrays(cms, sk.counts + 100, sk.row_counts)
    with pytest.raises(ValueError, match="shapes"):
        CmsSketch.from_arrays(cms, sk.counts[:2], sk.row_counts)
    hcms = HCMS(epsilon=2.0, k=8, m=16)
    hs = hcms.sketch().add(hcms.privatize(["x"] * 30, rng=np.random.default_rng(1)))
    assert np.array_equal(HcmsSketch.from_arrays(hcms, hs.sums, hs.row_counts).sums, hs.sums)
    with pytest.raises(ValueError, match="n_j"):
        HcmsSketch.from_arrays(hcms, hs.sums * 0 + 5, hs.row_counts)


def test_counts_widen_before_they_could_overflow() -> None:
    cms = CMS(epsilon=2.0, k=2, m=8)
    rows = np.array([2**31 - 10, 0])
    sk = CmsSketch.from_arrays(cms, np.zeros((2, 8), dtype=np.int64), rows)
    sk.add(cms.privatize(["a"] * 40, rng=np.random.default_rng(0)))
    assert sk.counts.dtype == np.int64
    assert sk.n == 2**31 - 10 + 40


def test_frequency_estimate_helpers() -> None:
    cms = CMS(epsilon=4.0, k=16, m=64)
    values = ["a"] * 500 + ["b"] * 200 + ["c"] * 10
    est = (
        cms.sketch()
        .add(cms.privatize(values, rng=np.random.default_rng(0)))
        .estimate(["c", "a", "b"])
    )
    assert [t[0] for t in est.top(2)] == ["a", "b"]
    lo, hi = est.interval()
    assert np.all(lo < est.counts) and np.all(est.counts < hi)
    assert len(est) == 3
