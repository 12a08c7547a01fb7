"""The filter and the odometer against their theorems, on random adaptive sequences."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_governor.budget.privacy.accountant import optimal_epsilon
from dp_governor.budget.privacy.odometer import (
    OdometerState,
    Target,
    admit,
    admit_basic,
    admit_either,
    charge,
    filter_cap_sq,
    mixture_epsilon,
    mixture_rho,
    running_epsilon,
)

MICRO = 1_000_000
# Relative width of the band around the filter's boundary where float evaluation of the theorem
# and the module's exact comparison against a rounded-down cap may legitimately disagree (the
# module documents a 1e-12 relative margin; float log/sqrt add a few ulps).
BOUNDARY = 1e-9


def theorem_epsilon(eps_micro: list[int], delta: float) -> float:
    """The filter theorem's left side, evaluated directly from the whole prefix."""
    s2 = math.fsum((e / MICRO) ** 2 for e in eps_micro)
    return math.sqrt(2.0 * math.log(1.0 / delta) * s2) + s2 / 2.0


def v_star(target: Target) -> float:
    """The largest sum of squares the theorem allows, solved from its condition directly."""
    a = math.sqrt(2.0 * math.log(1.0 / target.delta))
    return (-a + math.sqrt(a * a + 2.0 * target.epsilon)) ** 2


@dataclass(frozen=True)
class Step:
    eps_micro: int
    admitted: bool
    before: OdometerState
    after: OdometerState


def adaptive_run(seed: int, target: Target, steps: int, scale_micro: int) -> list[Step]:
    """An analyst who picks each epsilon from what the device released and what was refused.

    Each report is randomized response on a fixed bit; the next epsilon is drawn around the last
    one, larger after a released 1, smaller after a 0 or a refusal, so the schedule depends on
    earlier outputs and on the filter's answers.
    """
    rng = np.random.default_rng(seed)
    state = OdometerState()
    level = scale_micro
    out: list[Step] = []
    for _ in range(steps):
        eps_micro = int(rng.integers(1, 2 * level + 1))
        ok = admit(state, eps_micro / MICRO, target)
        before = state
        if ok:
            state = charge(state, eps_micro / MICRO)
            p_one = 1.0 / (1.0 + math.exp(-eps_micro / MICRO))
            released_one = bool(rng.random() < p_one)
            level = min(4 * scale_micro, level * 2) if released_one else max(1, level // 2)
        else:
            level = max(1, level // 3)
        out.append(Step(eps_micro, ok, before, state))
    return out


targets = st.builds(
    Target,
    epsilon=st.floats(min_value=0.05, max_value=20.0),
    delta=st.floats(min_value=1e-15, max_value=0.5),
)
runs = st.tuples(
    st.integers(min_value=0, max_value=2**32 - 1),
    targets,
    st.integers(min_value=1, max_value=150),
    st.integers(min_value=1, max_value=2 * MICRO),
)


@settings(max_examples=150, deadline=None)
@given(runs)
def test_admissions_match_the_theorem_on_the_whole_prefix(
    run: tuple[int, Target, int, int],
) -> None:
    seed, target, steps, scale = run
    admitted: list[int] = []
    for step in adaptive_run(seed, target, steps, scale):
        lhs = theorem_epsilon([*admitted, step.eps_micro], target.delta)
        if abs(lhs - target.epsilon) > BOUNDARY * target.epsilon:
            assert step.admitted == (lhs <= target.epsilon), (lhs, target)
        elif step.admitted:
            assert lhs <= target.epsilon * (1 + BOUNDARY)
        if step.admitted:
            admitted.append(step.eps_micro)
        # the O(1) state is exactly the totals of the admitted history
        assert step.after == OdometerState(
            len(admitted), sum(admitted), sum(e * e for e in admitted)
        )


@settings(max_examples=150, deadline=None)
@given(runs)
def test_no_admitted_sequence_exceeds_what_the_theorem_allows(
    run: tuple[int, Target, int, int],
) -> None:
    seed, target, steps, scale = run
    cap = v_star(target)
    for step in adaptive_run(seed, target, steps, scale):
        s = step.after
        if s.count == 0:
            continue
        # the theorem's condition on the admitted prefix, and the basic sum it implies for that
        # many reports (Cauchy-Schwarz: S1 <= sqrt(n S2) <= sqrt(n V*))
        assert s.epsilon_sq_sum <= cap * (1 + BOUNDARY)
        assert s.epsilon_sum <= math.sqrt(s.count * cap) * (1 + BOUNDARY)
        # the better-of-both filter never admits what both filters refuse
        for eps in (step.eps_micro / MICRO, 0.5, 0.01):
            both_refuse = not admit(s, eps, target) and not admit_basic(s, eps, target)
            assert not (both_refuse and admit_either(s, eps, target))


def count_admitted(eps: float, target: Target, *, basic: bool) -> int:
    state, n = OdometerState(), 0
    gate = admit_basic if basic else admit
    while gate(state, eps, target):
        state, n = charge(state, eps), n + 1
    return n


def test_many_small_reports_get_more_than_a_basic_cap() -> None:
    target = Target(4.0, 1e-9)
    filtered = count_admitted(0.05, target, basic=False)
    basic = count_admitted(0.05, target, basic=True)
    # the count the theorem's condition allows, solved independently
    assert filtered == math.floor(v_star(target) / 0.05**2) == 141
    assert basic == 80
    assert (
        filtered - basic == 61
    )  # the figure quoted in budget/privacy/odometer.py and docs/odometer.md


@pytest.mark.parametrize("eps", [0.005, 0.01, 0.02, 0.05, 0.08, 0.15, 0.5])
@pytest.mark.parametrize("target", [Target(4.0, 1e-9), Target(8.0, 1e-6), Target(2.0, 1e-12)])
def test_the_filter_beats_basic_below_the_crossover(eps: float, target: Target) -> None:
    # equal reports of e: about V*/e^2 admitted against eps_g/e, crossing at e = V*/eps_g
    filtered = count_admitted(eps, target, basic=False)
    basic = count_admitted(eps, target, basic=True)
    assert (filtered > basic) == (eps < v_star(target) / target.epsilon)


def test_either_takes_the_better_of_both() -> None:
    target = Target(4.0, 1e-9)
    for eps in (0.05, 0.1, 1.0):
        state, n = OdometerState(), 0
        while admit_either(state, eps, target):
            state, n = charge(state, eps), n + 1
        best = max(count_admitted(eps, target, basic=b) for b in (False, True))
        assert n >= best


def test_basic_cap_is_exact_at_the_boundary() -> None:
    s = OdometerState(1, 1_999_999, 1_999_999**2)
    assert admit_basic(s, 0.000001, Target(2.0, 1e-9))
    assert not admit_basic(s, 0.000002, Target(2.0, 1e-9))
    assert not admit_basic(s, 0.000001, Target(1.999999999, 1e-9))


def test_cap_is_rounded_down() -> None:
    target = Target(4.0, 1e-9)
    assert filter_cap_sq(target) <= v_star(target) * MICRO * MICRO


@settings(max_examples=150, deadline=None)
@given(runs, st.floats(min_value=1e-15, max_value=0.5), st.floats(min_value=1e-3, max_value=1e3))
def test_odometer_dominates_fixed_schedule_advanced_composition_and_is_monotone(
    run: tuple[int, Target, int, int], delta: float, tuned_for: float
) -> None:
    seed, target, steps, scale = run
    previous = 0.0
    for step in adaptive_run(seed, target, steps, scale):
        s = step.after
        reading = running_epsilon(s, delta, tuned_for=tuned_for)
        fixed = min(s.epsilon_sum, theorem_epsilon_from(s, delta))
        assert reading >= fixed
        assert reading >= previous
        assert reading <= s.epsilon_sum
        previous = reading


def theorem_epsilon_from(s: OdometerState, delta: float) -> float:
    """Advanced composition for a fixed schedule with these totals (delta' = delta)."""
    v = s.epsilon_sq_sum
    return math.sqrt(2.0 * math.log(1.0 / delta) * v) + v / 2.0


@pytest.mark.parametrize(
    ("eps", "n"), [(0.05, 80), (0.05, 400), (0.01, 2000), (0.2, 100), (1.0, 3), (0.5, 64)]
)
@pytest.mark.parametrize("delta", [1e-6, 1e-9])
def test_odometer_is_never_below_the_exact_optimal_composition(
    eps: float, n: int, delta: float
) -> None:
    # Any valid (eps, delta) bound for this schedule is at least its exact optimum.
    state = OdometerState(n, round(eps * MICRO) * n, round(eps * MICRO) ** 2 * n)
    assert running_epsilon(state, delta) >= optimal_epsilon({eps: n}, delta)


def test_odometer_known_values() -> None:
    target_delta = 1e-9
    rho = mixture_rho(1.0, target_delta)
    # tuned for S2 = 1: within 6% of fixed-schedule advanced composition there
    v = 1.0
    fixed = math.sqrt(2 * math.log(1 / target_delta) * v) + v / 2
    assert fixed < mixture_epsilon(v, target_delta, rho) < 1.06 * fixed
    state = OdometerState(400, 400 * 50_000, 400 * 2_500_000_000)  # 400 reports of 0.05
    assert running_epsilon(state, target_delta) == pytest.approx(7.303, abs=1e-3)


def test_filter_and_odometer_hold_on_simulated_adaptive_randomized_response() -> None:
    """Monte Carlo: adaptive randomized response, privacy loss tracked exactly.

    For each run, ``L_n`` is the realised privacy loss of the released bits for the true bit 1
    against 0. With ``delta = 0.05`` the odometer's crossing frequency (at any time) and the
    filter's overshoot frequency must stay below ``delta`` within ``z = 5`` binomial standard
    errors.
    """
    rng = np.random.default_rng(20240518)
    runs_n, steps, delta = 20_000, 120, 0.05
    target = Target(3.0, delta)
    cap = filter_cap_sq(target) / MICRO**2
    rho = mixture_rho(1.0, delta)
    level = np.full(runs_n, 0.2)
    loss = np.zeros(runs_n)
    s1 = np.zeros(runs_n)
    s2 = np.zeros(runs_n)
    stopped = np.zeros(runs_n, dtype=bool)
    filter_loss = np.zeros(runs_n)
    crossed = np.zeros(runs_n, dtype=bool)
    for _ in range(steps):
        eps = np.round(level * rng.uniform(0.5, 1.5, runs_n), 6)
        released_one = rng.random(runs_n) < 1.0 / (1.0 + np.exp(-eps))
        loss += np.where(released_one, eps, -eps)
        s1 += eps
        s2 += eps * eps
        a = s2 + rho
        reading = np.minimum(
            s1, s2 / 2 + np.sqrt(a * (np.log(a / rho) + 2 * math.log(1 / delta))) * (1 + 1e-12)
        )
        crossed |= loss > reading
        stopped |= s2 > cap
        filter_loss = np.where(stopped, filter_loss, loss)
        # the analyst raises epsilon after a released 1 and lowers it after a 0
        level = np.clip(np.where(released_one, level * 1.5, level / 1.5), 0.01, 1.0)
    bound = delta + 5 * math.sqrt(delta * (1 - delta) / runs_n)
    assert crossed.mean() <= bound
    assert (filter_loss > target.epsilon).mean() <= bound


def _raises(field: str, call: Any) -> None:
    with pytest.raises(ValueError, match=f"`{field}`"):
        call()


BAD: list[tuple[str, Any]] = [
    ("epsilon", lambda: Target(0.0, 1e-9)),
    ("epsilon", lambda: Target(-1.0, 1e-9)),
    ("epsilon", lambda: Target(math.nan, 1e-9)),
    ("epsilon", lambda: Target(math.inf, 1e-9)),
    ("epsilon", lambda: Target(cast(Any, True), 1e-9)),
    ("epsilon", lambda: Target(cast(Any, "4"), 1e-9)),
    ("delta", lambda: Target(4.0, 0.0)),
    ("delta", lambda: Target(4.0, 1.0)),
    ("delta", lambda: Target(4.0, -1e-9)),
    ("delta", lambda: Target(4.0, math.nan)),
    ("count", lambda: OdometerState(-1, 0, 0)),
    ("count", lambda: OdometerState(cast(Any, True), 1, 1)),
    ("sum_eps", lambda: OdometerState(1, cast(Any, 1.5), 1)),
    ("sum_eps_sq", lambda: OdometerState(1, 1, -1)),
    ("count", lambda: OdometerState(1, 0, 0)),
    ("count", lambda: OdometerState(0, 5, 25)),
    ("sum_eps_sq", lambda: OdometerState(2, 10, 200)),
    ("sum_eps_sq", lambda: OdometerState(2, 10, 10)),
    ("eps", lambda: charge(OdometerState(), 0.0)),
    ("eps", lambda: charge(OdometerState(), -0.1)),
    ("eps", lambda: charge(OdometerState(), math.nan)),
    ("eps", lambda: charge(OdometerState(), math.inf)),
    ("eps", lambda: charge(OdometerState(), 1e-7)),
    ("eps", lambda: charge(OdometerState(), cast(Any, True))),
    ("eps", lambda: charge(OdometerState(), cast(Any, "0.1"))),
    ("eps", lambda: admit(OdometerState(), 0.0, Target(4.0, 1e-9))),
    ("eps", lambda: admit_basic(OdometerState(), -1.0, Target(4.0, 1e-9))),
    ("delta", lambda: running_epsilon(OdometerState(), 0.0)),
    ("delta", lambda: running_epsilon(OdometerState(), 1.5)),
    ("tuned_for", lambda: running_epsilon(OdometerState(), 1e-9, tuned_for=0.0)),
    ("rho", lambda: mixture_epsilon(1.0, 1e-9, 0.0)),
    ("sum_eps_sq", lambda: mixture_epsilon(-1.0, 1e-9, 1.0)),
]


@pytest.mark.parametrize(("field", "call"), BAD)
def test_bad_inputs_raise_naming_the_field(field: str, call: Any) -> None:
    _raises(field, call)
