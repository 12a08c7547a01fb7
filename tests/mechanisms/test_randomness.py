"""Exact Bernoulli sampling, seeded and from the OS CSPRNG."""

from __future__ import annotations

import math
from decimal import Context
from fractions import Fraction

import numpy as np
import pytest

from dp_governor.mechanisms.randomness import (
    bernoulli,
    flip_probability,
    os_bernoulli,
    threshold_bytes,
)
from tests.mechanisms.helpers import forbid_numpy_and_stdlib_random

Z = 5.0


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0, 20.0])
def test_threshold_is_exact_to_float_precision(epsilon: float) -> None:
    for p in (1.0 / (1.0 + math.exp(epsilon / 2)), 1.0 / (1.0 + math.exp(epsilon))):
        t = threshold_bytes(p)
        realised = Fraction(int.from_bytes(t.tobytes(), "big"), 1 << (8 * t.size))
        assert abs(realised - Fraction(p)) <= Fraction(p) * Fraction(1, 1 << 53)


def test_flip_probability_is_the_correctly_rounded_value() -> None:
    # An 80-digit decimal exponential, rounded once to a double, is the oracle: the platform's
    # exp (and so 1 / (1 + exp(x)) in floats) differs from it in the last place for some x.
    ctx = Context(prec=80)
    grid = [i / 100 for i in range(1, 2001)] + [i / 200 for i in range(1, 401, 7)]
    for x in [*grid, 1e-12, 0.123456, 37.5, 700.25]:
        exact = ctx.divide(1, ctx.add(1, ctx.exp(ctx.create_decimal_from_float(x))))
        assert flip_probability(x) == float(exact), x
    assert flip_probability(746.0) == 0.0


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("inf"), float("nan")])
def test_flip_probability_refuses_degenerate_epsilons(epsilon: float) -> None:
    with pytest.raises(ValueError, match="`epsilon`"):
        flip_probability(epsilon)


@pytest.mark.parametrize("p", [0.5, 0.1192029220221175, 0.0003353501304664781, 0.9])
def test_seeded_bernoulli_frequency(p: float) -> None:
    n = 2_000_000
    draws = bernoulli(p, n, rng=np.random.default_rng(1))
    assert abs(draws.mean() - p) < Z * math.sqrt(p * (1 - p) / n)


def test_ties_are_resolved_with_further_bytes() -> None:
    # p = 1/256 + 1/2**16: the first byte decides only P = 1/256 of the mass; ties go deeper.
    p = 1 / 256 + 1 / 65536
    n = 4_000_000
    draws = bernoulli(p, n, rng=np.random.default_rng(2))
    assert abs(draws.mean() - p) < Z * math.sqrt(p * (1 - p) / n)


def test_same_seed_same_draws_and_shape() -> None:
    a = bernoulli(0.3, (4, 5), rng=np.random.default_rng(9))
    b = bernoulli(0.3, (4, 5), rng=np.random.default_rng(9))
    assert a.shape == (4, 5) and np.array_equal(a, b)


def test_os_bernoulli_frequency() -> None:
    p, n = 0.1192029220221175, 400_000
    draws = os_bernoulli(p, n)
    assert abs(draws.mean() - p) < Z * math.sqrt(p * (1 - p) / n)


def test_os_path_never_touches_numpy_random(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("numpy randomness used on the device path")

    forbid_numpy_and_stdlib_random(monkeypatch, boom)
    assert os_bernoulli(0.25, 1000).shape == (1000,)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, float("nan")])
def test_rejects_degenerate_probabilities(p: float) -> None:
    with pytest.raises(ValueError, match="`p`"):
        threshold_bytes(p)


DEVICE_MECHANISMS = ["emoji", "safari-energy-domains", "quicktype"]


@pytest.mark.parametrize("name", DEVICE_MECHANISMS)
def test_the_device_path_uses_only_the_os_csprng(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dp_governor.policies import default_policies, mechanism_for

    mech = mechanism_for(next(p for p in default_policies() if p.name == name))

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("numpy or stdlib randomness used on the device path")

    forbid_numpy_and_stdlib_random(monkeypatch, boom)
    reports = [mech.privatize_one(f"value-{i}").to_dict() for i in range(100)]
    assert len(reports) == 100


@pytest.mark.parametrize("name", DEVICE_MECHANISMS)
def test_the_randomness_drawn_does_not_depend_on_the_input(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same byte requests and the same number of bounded draws for every input."""
    import secrets

    from dp_governor.policies import default_policies, mechanism_for

    mech = mechanism_for(next(p for p in default_policies() if p.name == name))
    calls: list[tuple[str, int]] = []
    real_bytes, real_below = secrets.token_bytes, secrets.randbelow  # what mechanisms use

    def token_bytes(n: int) -> bytes:
        calls.append(("bytes", n))
        return real_bytes(n)

    def randbelow(n: int) -> int:
        calls.append(("below", n))
        return real_below(n)

    monkeypatch.setattr(secrets, "token_bytes", token_bytes)
    monkeypatch.setattr(secrets, "randbelow", randbelow)
    seen = []
    for value in ("a", "a much longer value than the first", "ü😂", ""):
        calls.clear()
        mech.privatize_one(value)
        seen.append(list(calls))
    assert all(s == seen[0] for s in seen), seen
