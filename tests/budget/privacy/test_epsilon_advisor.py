"""The epsilon advisor: mechanism variance against the best known frequency oracle."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dp_governor.budget.privacy.accountant import Accountant
from dp_governor.budget.privacy.epsilon_advisor import (
    WASTE_THRESHOLD,
    advise,
    advise_sketch,
    optimal_variance,
    render_advice,
    same_accuracy_epsilon,
)
from dp_governor.budget.reporting.report import build_report
from dp_governor.budget.reporting.report_text import render_text
from dp_governor.budget.rule.book import PolicyBook
from dp_governor.mechanisms.variance import cms_c, hcms_c
from dp_governor.policies import PolicyCreate
from dp_governor.policies.defaults import default_policies
from dp_governor.policies.model import Policy


def _lh_variance(epsilon: float, g: float) -> float:
    """Local hashing's per-report variance with ``g`` buckets (Wang et al. 2017, Eq. for LH)."""
    e = math.exp(epsilon)
    return (e - 1.0 + g) ** 2 / ((e - 1.0) ** 2 * (g - 1.0))


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0, 20.0])
def test_optimal_variance_is_optimized_local_hashing(epsilon: float) -> None:
    best = optimal_variance(epsilon)
    assert best == pytest.approx(_lh_variance(epsilon, math.exp(epsilon) + 1.0), rel=1e-12)
    # no integer number of buckets does better: g = e^eps + 1 minimises LH's variance
    for g in range(2, 200):
        assert _lh_variance(epsilon, g) >= best * (1 - 1e-12)


@pytest.mark.parametrize(
    ("mechanism", "epsilon", "ratio", "same"),
    [
        ("hcms", 4.0, 14.18, 1.71),  # the figures: about 14x, matched at about 1.7
        ("cms", 4.0, 2.40, 3.17),  # about 2.4x
        ("cms", 2.0, 1.28, 1.81),
    ],
)
def test_known_answers(mechanism: str, epsilon: float, ratio: float, same: float) -> None:
    advice = advise_sketch(mechanism, epsilon, k=2048, m=1024)
    assert advice.ratio == pytest.approx(ratio, abs=0.01)
    assert advice.epsilon_same_accuracy == pytest.approx(same, abs=0.01)
    assert optimal_variance(advice.epsilon_same_accuracy) == pytest.approx(advice.variance)


def test_variance_is_the_exact_formula_for_a_rare_item() -> None:
    m = 1024
    scale = (m / (m - 1)) ** 2
    hcms = advise_sketch("hcms", 4.0, k=2048, m=m)
    assert hcms.variance == pytest.approx(scale * (hcms_c(4.0) ** 2 - 1 / m**2), rel=1e-12)
    cms = advise_sketch("cms", 4.0, k=2048, m=m).variance
    expected = (cms_c(4.0) ** 2 - 1) / 4 + (1 - 1 / m - 1 / 2048 + 1 / (2048 * m)) / m
    assert cms == pytest.approx(scale * (expected + 1 / (2048 * m) - 1 / (2048 * m * m)))


@given(st.floats(0.05, 20.0))
def test_same_accuracy_epsilon_inverts_the_oracle(epsilon: float) -> None:
    assert same_accuracy_epsilon(optimal_variance(epsilon)) == pytest.approx(epsilon, rel=1e-9)
    for mechanism in ("cms", "hcms"):
        advice = advise_sketch(mechanism, epsilon, k=16, m=256)
        assert advice.ratio >= 1.0 - 1e-12  # nothing beats the best known oracle
        assert 0 < advice.epsilon_same_accuracy <= epsilon


def test_defaults_warn_where_a_quarter_is_wasted() -> None:
    advice = {p.name: advise(p) for p in default_policies()}
    warned = sorted(name for name, a in advice.items() if a.warning)
    assert warned == ["safari-autoplay", "safari-crash-domains", "safari-energy-domains"]
    for a in advice.values():
        assert (a.wasted_fraction > WASTE_THRESHOLD) == (a.warning is not None)
        assert a.epsilon_same_accuracy <= a.epsilon_per_report
    safari = advice["safari-energy-domains"]
    assert safari.wasted_fraction == pytest.approx(1 - 1.71 / 4, abs=0.005)
    assert "57%" in (safari.warning or "") and "1.71" in (safari.warning or "")
    assert render_advice(safari).startswith("WARNING safari-energy-domains")
    quicktype = advice["quicktype"]  # SFP: word at 2 and fragment at 6, each its own sketch
    assert [s.part for s in quicktype.sketches] == ["word", "fragment"]
    assert quicktype.epsilon_same_accuracy == pytest.approx(
        sum(s.epsilon_same_accuracy for s in quicktype.sketches)
    )


def test_a_policy_at_the_threshold() -> None:
    fields = {
        "name": "toy",
        "mechanism": "cms",
        "k": 16,
        "m": 1024,
        "epsilon_per_report": 4.0,
        "max_reports_per_day": 1,
    }
    cms = advise(Policy(version=1, **PolicyCreate.model_validate(fields).model_dump()))
    assert cms.warning is None and 0.2 < cms.wasted_fraction < WASTE_THRESHOLD
    fields["m"] = 16  # a narrow sketch: collisions cost more than a quarter
    narrow = advise(Policy(version=1, **PolicyCreate.model_validate(fields).model_dump()))
    assert narrow.warning is not None and narrow.wasted_fraction > WASTE_THRESHOLD


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: advise_sketch("olh", 1.0, k=1, m=2), "mechanism"),
        (lambda: advise_sketch("cms", 0.0, k=1, m=2), "epsilon"),
        (lambda: advise_sketch("cms", math.nan, k=1, m=2), "epsilon"),
        (lambda: advise_sketch("cms", 1.0, k=0, m=2), "`k`"),
        (lambda: advise_sketch("cms", 1.0, k=1, m=1), "`m`"),
        (lambda: optimal_variance(-1.0), "epsilon"),
        (lambda: same_accuracy_epsilon(0.0), "variance"),
        (lambda: same_accuracy_epsilon(math.inf), "variance"),
    ],
)
def test_bad_input(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_the_audit_report_carries_the_advice() -> None:
    policies = [Policy(version=1, **p.model_dump()) for p in default_policies()]
    book = PolicyBook.build(policies, {})
    report = build_report(book, 20_000, [], [], accountant=Accountant())
    by_name = {line.use_case: line.epsilon_advice for line in report.use_cases}
    assert all(a is not None for a in by_name.values())
    safari = by_name["safari-energy-domains"]
    assert safari is not None and safari.warning is not None
    data = report.to_dict()
    json.dumps(data, allow_nan=False)
    line = next(u for u in data["use_cases"] if u["use_case"] == "emoji")
    assert line["epsilon_advice"]["sketches"][0]["ratio"] == pytest.approx(2.40, abs=0.01)
    text = render_text(report)
    assert "Epsilon advisor (each mechanism against optimized local hashing" in text
    assert "  WARNING safari-energy-domains: report hcms at 4" in text
