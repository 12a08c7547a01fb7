"""Central ``(epsilon, delta)`` of a shuffled batch of eps0-LDP reports: amplification by shuffling.

Method: Feldman, McMillan and Talwar, "Hiding among the clones: a simple and nearly optimal
analysis of privacy amplification by shuffling", FOCS 2021 (arXiv:2012.12803), Theorem 3.2,
evaluated numerically. For any ``eps0``-DP local randomizers (adaptively chosen ones included),
the shuffled reports of two neighbouring datasets (device 1's input changed) are a common
post-processing of the pair

    C ~ Bin(n - 1, e^-eps0),  A | C ~ Bin(C, 1/2),  D ~ Bern(e^eps0 / (e^eps0 + 1)),
    P = (A + D, C - A + 1 - D),  Q = (A + 1 - D, C - A + D),

so the batch is ``(eps, delta)``-DP whenever ``P`` and ``Q`` are. ``P`` and ``Q`` are
``(eps, delta_P)``-indistinguishable with ``delta_P(eps) = sum_c Bin(n-1, e^-eps0)(c) delta_c(eps)``
(``C`` is observed: it is the sum of the two coordinates, minus one). Swapping the coordinates
maps ``P`` to ``Q`` (``C - A`` has the law of ``A``), so the hockey-stick divergence is the same
in both directions. Given ``C = c`` the privacy loss of ``a = A + D`` is increasing in ``a``:

    P_c(a) / Q_c(a) = (e^eps0 a + c + 1 - a) / (e^eps0 (c + 1 - a) + a),

so ``delta_c(eps) = sum_{a >= t} (P_c(a) - e^eps Q_c(a))`` with ``t`` the first ``a`` past
``x* = (c + 1)(e^eps - e^-eps0) / ((1 - e^-eps0)(e^eps + 1))``, and in closed form through the
tails of ``Bin(c, 1/2)``:

    delta_c(eps) = k B_c(t - 1) - (e^eps - 1) S_c(t),   k = (e^eps0 - e^eps) / (e^eps0 + 1),

``B_c`` the pmf and ``S_c(t) = Pr[Bin(c, 1/2) >= t]`` (scipy's binomial functions). Each
evaluation is therefore O(1) in ``c``.

What makes the figure an upper bound (not an estimate):

- ``delta_c`` is non-increasing in ``c``: ``(P_{c+1}, Q_{c+1})`` is ``(P_c, Q_c)`` with one more
  fair coin added to a coordinate, a post-processing. Past ``_MAX_BLOCKS`` values of ``c`` we
  group consecutive ``c`` into blocks and charge each block its *smallest* ``c``'s ``delta_c``
  (the largest in the block); the reference implementation published with the paper uses one
  block endpoint twice in its upper-bound branch, which this does not follow;
- ``c`` outside ``[lo, hi]`` (about ten standard deviations of ``C``) is charged
  ``delta_c <= 1``: the exact binomial tail mass ``Pr[C < lo] + Pr[C > hi]`` is added;
- the threshold ``t`` is taken as the best of ``floor(x*) + {0, 1, 2}`` (any ``t`` gives a
  value at most ``delta_c``; the exact one gives ``delta_c``), so float rounding in ``x*`` can
  not move it; each term carries a rounding allowance of ``_REL`` times its magnitude, a
  generous bound on the relative error of scipy's binomial pmf and survival function.

``shuffle_epsilon`` finds where the bound crosses ``delta`` (Brent's method on its logarithm,
in ``[0, eps0]``) and returns a value at which the bound itself was evaluated and found
``<= delta``. Reference point (eps0 = 4, n = 10^6, delta = 10^-6): the paper's closed form
(Theorem 3.1) gives about 0.2, its numerical method 0.049-0.050, and this module 0.0493 (the same
theorem, evaluated in closed form per ``c``). Tighter published pairs (SODA 2023's, about 0.034;
Wang et al.'s variation-ratio pair with a mechanism's own parameters, about 0.030 for CMS and
0.024 for HCMS) are evaluated in :mod:`dp_governor.budget.privacy.variation_ratio`, which says why
neither is a bound for the service's sketches (the latter fails on their exact enumeration).

Batches compose (``compose_shuffled``) through dp-accounting's privacy loss distributions:
of the pair ``(P, Q)`` itself (the whole curve, tight over long windows) or of each batch's
``(epsilon, delta)`` point; the smaller is kept and the method named.

Assumptions (the caller's to enforce): the shuffler is honest (it hides which device sent
which report and is not observed by the adversary); ``n`` counts distinct devices whose reports
are in the batch and that the adversary does not control; each device contributes exactly one
``eps0``-LDP report to the batch (several reports of one device:
:mod:`dp_governor.budget.reporting.central` composes the batch's sub-batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral, Real
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import optimize, stats

from dp_governor.budget.privacy._pld_read import epsilon_for_delta
from dp_governor.budget.privacy.display import fmt_up

__all__ = [
    "BASIC_METHOD",
    "CURVE_METHOD",
    "MAX_EPS0",
    "METHOD",
    "PAIRS_METHOD",
    "AmplifiedBound",
    "ComposedBound",
    "clear_caches",
    "compose_shuffled",
    "fmt21_closed_form_epsilon",
    "shuffle_delta",
    "shuffle_epsilon",
]

METHOD: Final = "FMT21 Theorem 3.2 (hiding among the clones), exact numerical evaluation"
PAIRS_METHOD: Final = "dp-accounting PLD of each batch's (eps, delta) pair, composed"
CURVE_METHOD: Final = "dp-accounting PLD of each batch's FMT21 pair (P, Q), composed"
BASIC_METHOD: Final = "basic sum of the batches' local epsilons (delta 0)"
MAX_EPS0: Final = 100.0  # e^eps0 stays finite; n e^-eps0 clones is 0 for any real n anyway
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_MAX_BLOCKS: Final = 1024  # values of c evaluated per delta; more are grouped into blocks
_TAIL_SDS: Final = 10.0  # c beyond this many standard deviations of C is charged delta_c = 1
_PLD_BLOCKS: Final = 64  # blocks of c in the privacy loss distribution of the clones' pair
_PLD_SLACK: Final = 1e-12  # infinite-loss mass covering rounding in the PLD's probabilities
_REL: Final = 1e-9  # rounding allowance per term (scipy's binomial functions: ~1e-13 relative)
_NO_GAIN: Final = 1e-6  # a bound within this fraction of eps0 is reported as eps0 itself
_EPS_RTOL: Final = 1e-6  # first step up from the root finder's crossing, relative to epsilon
# "best" tries the (eps, delta) pairs only over this many batches: the curve dominates them
# exactly, and won in every case measured from 2 batches on (docs/amplification.md), while the
# pairs' self-composition is most of the cost of a long horizon (3.6 s of 3.9 s for 730 batches)
_PAIRS_MAX_BEST: Final = 8


@dataclass(frozen=True, slots=True)
class AmplifiedBound:
    """The central ``(epsilon, delta)`` of one shuffled batch, and how it was obtained.

    ``amplified`` is False when shuffling does not beat the local guarantee at this ``delta``;
    then ``epsilon == eps0`` and ``delta == 0`` (the local ``eps0``-DP holds centrally as is).
    """

    epsilon: float
    delta: float
    n: int
    eps0: float
    method: str
    amplified: bool
    note: str


@dataclass(frozen=True, slots=True)
class ComposedBound:
    """``(epsilon, delta)`` of several shuffled batches composed, with the per-batch figures.

    ``batches`` holds each batch's own bound at ``batch_delta`` (the share of ``delta`` each
    batch was given with ``PAIRS_METHOD``; ``delta`` itself, for information, otherwise).
    """

    epsilon: float
    delta: float
    batch_delta: float
    batches: tuple[AmplifiedBound, ...]
    method: str


def _check_eps0(eps0: float, name: str = "eps0") -> float:
    if isinstance(eps0, bool) or not isinstance(eps0, Real):
        raise ValueError(f"`{name}` must be a number > 0, got {eps0!r}")
    value = float(eps0)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be finite and > 0, got {eps0!r}")
    if value > MAX_EPS0:
        raise ValueError(f"`{name}` must be <= {MAX_EPS0:g} (the bound's range), got {eps0!r}")
    return value


def _check_n(n: int, name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {n!r}")
    return int(n)


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, Real):
        raise ValueError(f"`delta` must be a number in (0, 1), got {delta!r}")
    value = float(delta)
    if not (0.0 < value < 1.0):
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}")
    return value


def _check_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real):
        raise ValueError(f"`epsilon` must be a number >= 0, got {epsilon!r}")
    value = float(epsilon)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"`epsilon` must be finite and >= 0, got {epsilon!r}")
    return value


@dataclass(frozen=True, slots=True)
class _Clones:
    """Blocks of ``c`` (each charged at its smallest ``c``), their masses and the dropped tail."""

    starts: IntArray
    mass: FloatArray
    tail: float


@lru_cache(maxsize=256)
def _clones(eps0: float, n: int, max_blocks: int = _MAX_BLOCKS) -> _Clones:
    """The law of ``C ~ Bin(n - 1, e^-eps0)`` restricted to ten standard deviations, in blocks."""
    trials = n - 1
    p = math.exp(-eps0)
    if trials == 0 or p == 0.0:
        return _Clones(np.zeros(1, dtype=np.int64), np.ones(1), 0.0)
    mean = trials * p
    sd = math.sqrt(trials * p * (1.0 - p))
    lo = max(0, math.floor(mean - _TAIL_SDS * sd))
    hi = min(trials, math.ceil(mean + _TAIL_SDS * sd + _TAIL_SDS))
    tail = float(stats.binom.cdf(lo - 1, trials, p)) + float(stats.binom.sf(hi, trials, p))
    c = np.arange(lo, hi + 1, dtype=np.int64)
    pmf = np.asarray(stats.binom.pmf(c, trials, p), dtype=np.float64)
    width = -(-c.size // max_blocks)  # ceil
    index = np.arange(0, c.size, width)
    starts = c[index]
    mass = np.add.reduceat(pmf, index)
    starts.setflags(write=False)
    mass.setflags(write=False)
    return _Clones(starts, mass, tail)


@lru_cache(maxsize=4096)
def _delta_upper(eps0: float, n: int, epsilon: float) -> float:
    """The bound on ``delta(epsilon)`` described in the module docstring (memoized)."""
    if epsilon >= eps0:
        return 0.0
    clones = _clones(eps0, n)
    c = clones.starts.astype(np.float64)
    em1 = math.expm1(epsilon)  # e^eps - 1
    kappa = -math.expm1(epsilon - eps0) / (1.0 + math.exp(-eps0))  # (e^eps0 - e^eps)/(e^eps0 + 1)
    x_star = (c + 1.0) * (math.exp(epsilon) - math.exp(-eps0))
    x_star /= -math.expm1(-eps0) * (math.exp(epsilon) + 1.0)
    base = np.floor(x_star)
    best = np.zeros_like(c)
    allowance = np.zeros_like(c)
    for shift in (0.0, 1.0, 2.0):
        t = np.clip(base + shift, 0.0, c + 2.0)
        head = kappa * np.asarray(stats.binom.pmf(t - 1.0, c, 0.5), dtype=np.float64)
        tail = em1 * np.asarray(stats.binom.sf(t - 1.0, c, 0.5), dtype=np.float64)
        value = head - tail
        better = value > best
        best = np.where(better, value, best)
        allowance = np.maximum(allowance, _REL * (head + tail))
    total = math.fsum((clones.mass * (best + allowance)).tolist()) + clones.tail
    return min(1.0, total * (1.0 + _REL))


def shuffle_delta(eps0: float, n: int, epsilon: float) -> float:
    """Upper bound on ``delta`` at ``epsilon`` for ``n`` shuffled ``eps0``-LDP reports (cached).

    Feldman, McMillan and Talwar, FOCS 2021, Theorem 3.2, evaluated as in the module docstring.

    >>> shuffle_delta(1.0, 1, 0.5) > 0.1  # one device: no other report to hide among
    True
    >>> shuffle_delta(1.0, 1000, 1.0)
    0.0
    """
    return _delta_upper(_check_eps0(eps0), _check_n(n), _check_epsilon(epsilon))


def _log_excess(epsilon: float, eps0: float, n: int, delta: float) -> float:
    """``log(bound(epsilon) / delta)``, finite where the bound is 0 (for the root finder)."""
    return math.log(max(_delta_upper(eps0, n, epsilon), 1e-300)) - math.log(delta)


def _smallest_epsilon(eps0: float, n: int, delta: float) -> float:
    """Smallest ``epsilon`` with ``bound(epsilon) <= delta``, found where the bound was checked.

    Brent's method on ``log(bound / delta)`` locates the crossing (the bound is non-increasing
    in ``epsilon``); the answer is then stepped up until the bound evaluated there is
    ``<= delta``, so it never rests on the root finder's tolerance.
    """
    if _delta_upper(eps0, n, 0.0) <= delta:
        return 0.0
    top = eps0 * (1.0 - _NO_GAIN)
    if _delta_upper(eps0, n, top) > delta:
        return eps0
    root = float(
        optimize.brentq(_log_excess, 0.0, top, args=(eps0, n, delta), xtol=1e-12, rtol=1e-9)
    )
    epsilon = root
    step = max(root * _EPS_RTOL, 1e-12)
    while _delta_upper(eps0, n, epsilon) > delta:
        epsilon = min(epsilon + step, top)
        step *= 2.0
    return epsilon


@lru_cache(maxsize=4096)
def _shuffle_epsilon(eps0: float, n: int, delta: float) -> AmplifiedBound:
    hi = _smallest_epsilon(eps0, n, delta)
    if hi >= eps0 * (1.0 - _NO_GAIN):
        return AmplifiedBound(
            epsilon=eps0,
            delta=0.0,
            n=n,
            eps0=eps0,
            method=METHOD,
            amplified=False,
            note=(
                f"shuffling {n} reports gives no amplification at delta={delta:g}; "
                f"the local guarantee ({eps0:g}, 0) holds centrally"
            ),
        )
    return AmplifiedBound(
        epsilon=hi,
        delta=delta,
        n=n,
        eps0=eps0,
        method=METHOD,
        amplified=True,
        note=(
            f"{n} distinct devices, one {eps0:g}-LDP report each, through an honest shuffler: "
            f"({fmt_up(hi, 4)}, {delta:g})-DP centrally"
        ),
    )


def shuffle_epsilon(eps0: float, n: int, delta: float) -> AmplifiedBound:
    """Smallest ``epsilon`` (to 1e-6 relative) the bound certifies at ``delta``, cached.

    The returned ``epsilon`` is one at which :func:`shuffle_delta`'s bound was evaluated and
    found ``<= delta``, so it is valid whatever the root finder's precision. At eps0 = 4,
    n = 10^6, delta = 10^-6 it is about 0.049 (the paper's numerical figure is 0.049-0.050).

    >>> bound = shuffle_epsilon(4.0, 10**6, 1e-6)
    >>> 0.045 < bound.epsilon < 0.051, bound.amplified
    (True, True)
    >>> shuffle_epsilon(1.0, 2, 1e-6).amplified
    False
    """
    return _shuffle_epsilon(_check_eps0(eps0), _check_n(n), _check_delta(delta))


def fmt21_closed_form_epsilon(eps0: float, n: int, delta: float) -> float | None:
    """FMT21 Theorem 3.1's closed form; None outside ``eps0 <= log(n / (16 log(4 / delta)))``.

    ``eps = log(1 + (e^eps0 - 1)/(e^eps0 + 1) (8 sqrt(e^eps0 log(4/delta) / n) + 8 e^eps0 / n))``;
    a looser but simpler upper bound, kept for comparison (about 0.2 at the reference point).

    >>> round(fmt21_closed_form_epsilon(4.0, 10**6, 1e-6) or 0.0, 3)
    0.201
    """
    eps0 = _check_eps0(eps0)
    n = _check_n(n)
    delta = _check_delta(delta)
    if eps0 > math.log(n / (16.0 * math.log(4.0 / delta))):
        return None
    e0 = math.exp(eps0)
    spread = 8.0 * math.sqrt(e0 * math.log(4.0 / delta) / n) + 8.0 * e0 / n
    return math.log1p(math.tanh(eps0 / 2.0) * spread)


def clear_caches() -> None:
    """Forget every memoized bound (for benchmarks that time a first call)."""
    _clones.cache_clear()
    _clones_pld.cache_clear()
    _delta_upper.cache_clear()
    _shuffle_epsilon.cache_clear()


@lru_cache(maxsize=256)
def _clones_pld(eps0: float, n: int, interval: float) -> pld.PrivacyLossDistribution:
    """dp-accounting PLD of FMT21's pair ``(P, Q)`` itself: its whole curve, not one point.

    ``(P, Q)`` dominates the shuffled batch, and ``(C, P_lo(C))`` dominates ``(C, P_C)`` for
    ``lo(C) <= C`` (add ``C - lo(C)`` fair coins), so each block of ``c`` is taken at its
    smallest ``c``. Losses ``log((e^eps0 a + c + 1 - a) / (e^eps0 (c + 1 - a) + a))`` are
    rounded up to the grid (with a margin, so float error never rounds one down); ``a`` beyond
    ten standard deviations, ``c`` outside the blocks and ``_PLD_SLACK`` go to infinite loss.
    The pair is symmetric (swapping the coordinates of ``P`` gives ``Q``).
    """
    clones = _clones(eps0, n, _PLD_BLOCKS)
    q = 1.0 / (1.0 + math.exp(-eps0))
    growth = -math.expm1(-eps0) * math.exp(eps0)  # e^eps0 - 1
    infinity = clones.tail + _PLD_SLACK
    keys: list[IntArray] = []
    probs: list[FloatArray] = []
    for c_int, mass in zip(clones.starts.tolist(), clones.mass.tolist(), strict=True):
        c = float(c_int)
        half_width = _TAIL_SDS * math.sqrt(c) / 2.0 + 2.0
        a_lo = max(0, math.floor(c / 2.0 - half_width))
        a_hi = min(c_int + 1, math.ceil(c / 2.0 + half_width))
        a = np.arange(a_lo, a_hi + 1, dtype=np.float64)
        fair = np.asarray(stats.binom.pmf(np.arange(a_lo - 1, a_hi + 1), c, 0.5), dtype=np.float64)
        p_a = q * fair[:-1] + (1.0 - q) * fair[1:]  # P_c(a) = q B(a - 1) + (1 - q) B(a)
        below = q * stats.binom.cdf(a_lo - 2, c, 0.5) + (1.0 - q) * stats.binom.cdf(
            a_lo - 1, c, 0.5
        )
        above = q * stats.binom.sf(a_hi - 1, c, 0.5) + (1.0 - q) * stats.binom.sf(a_hi, c, 0.5)
        infinity += mass * (float(below) + float(above))
        loss = np.log((a * growth + c + 1.0) / ((c + 1.0 - a) * growth + c + 1.0))
        keys.append(np.ceil(loss / interval + 1e-6).astype(np.int64))
        probs.append(mass * p_a)
    key = np.concatenate(keys)
    prob = np.concatenate(probs)
    low = int(key.min())
    rounded = np.bincount(key - low, weights=prob)
    pmf = {low + int(i): float(rounded[i]) for i in np.flatnonzero(rounded)}
    return pld.PrivacyLossDistribution.create_from_rounded_probability(
        pmf, min(1.0, infinity), interval, pessimistic_estimate=True, symmetric=True
    )


def _pair_pld(epsilon: float, delta: float, interval: float) -> pld.PrivacyLossDistribution:
    return pld.from_privacy_parameters(
        pld_common.DifferentialPrivacyParameters(epsilon, delta),
        value_discretization_interval=interval,
    )


def _read_epsilon(composed: pld.PrivacyLossDistribution, delta: float) -> float:
    # dp-accounting overflows to inf once the composed loss passes about 709; inf is a valid
    # (useless) bound here, and compose_shuffled then keeps the basic sum instead
    found = epsilon_for_delta(composed, delta)
    return math.inf if found is None else found


def _compose(parts: list[tuple[pld.PrivacyLossDistribution, int]]) -> pld.PrivacyLossDistribution:
    composed: pld.PrivacyLossDistribution | None = None
    for one, count in parts:
        part = one.self_compose(count) if count > 1 else one
        composed = part if composed is None else composed.compose(part)
    assert composed is not None
    return composed


def _compose_pairs(
    counts: dict[tuple[float, int], int], delta: float, discretization: float
) -> tuple[float, float]:
    """Smallest ``epsilon`` over a few splits of ``delta``, and the per-batch ``delta`` used."""
    total = sum(counts.values())
    best = (math.inf, delta / total)
    for fraction in (0.1, 0.25, 0.5, 0.75, 0.9):
        batch_delta = fraction * delta / total
        parts = []
        for (eps0, n), count in counts.items():
            bound = shuffle_epsilon(eps0, n, batch_delta)
            parts.append((_pair_pld(bound.epsilon, bound.delta, discretization), count))
        epsilon = _read_epsilon(_compose(parts), delta)
        if epsilon < best[0]:
            best = (epsilon, batch_delta)
    return best


def compose_shuffled(
    batches: list[tuple[float, int]],
    delta: float,
    *,
    method: Literal["best", "pairs", "curve"] = "best",
    discretization: float = 1e-4,
) -> ComposedBound:
    """``(epsilon, delta)`` of several shuffled batches that may each include the same device.

    Two valid compositions with dp-accounting's privacy loss distributions (PLD), pessimistic:

    - ``"pairs"``: each batch's bound ``(e_i, d_i)`` at a share of ``delta`` becomes the PLD of
      an ``(e_i, d_i)``-DP mechanism (``from_privacy_parameters``: loss ``inf`` with
      probability ``d_i``, ``+-e_i`` otherwise, the dominating pair of every such mechanism,
      Kairouz, Oh and Viswanath 2015); the share is tried at a few fixed fractions and the
      smallest ``epsilon`` kept (each is a valid guarantee);
    - ``"curve"``: the PLD of FMT21's dominating pair ``(P, Q)`` itself (its whole privacy
      curve), far tighter over long windows; losses on a grid of ``min(discretization,
      e_1 / 50)``, ``e_1`` the smallest batch's own ``epsilon`` at ``delta``.

    ``"best"`` computes both and keeps the smaller (the pairs only over at most
    ``_PAIRS_MAX_BEST`` batches: the ``(e_i, d_i)`` pair dominates the batch's curve, so the
    pairs can only win through the curve's grid, which they never did from 2 batches on in
    the cases measured). Equal batches compose by ``self_compose``.
    Whatever the method, the basic sum of the batches' ``eps0`` (delta 0, sequential
    composition) is kept instead where it is smaller or the PLD's answer is not finite
    (dp-accounting overflows to ``inf`` past a loss of about 709), named ``BASIC_METHOD``:
    no ``inf`` or NaN leaves this function.

    >>> day = compose_shuffled([(4.0, 10**6)], 1e-6)
    >>> day.epsilon < 0.07
    True
    """
    delta = _check_delta(delta)
    if not isinstance(batches, list | tuple) or not batches:
        raise ValueError(f"`batches` must be a non-empty list of (eps0, n), got {batches!r}")
    counts: dict[tuple[float, int], int] = {}
    for i, item in enumerate(batches):
        if not isinstance(item, tuple) or len(item) != 2:
            raise ValueError(f"`batches[{i}]` must be a pair (eps0, n), got {item!r}")
        key = (_check_eps0(item[0], f"batches[{i}].eps0"), _check_n(item[1], f"batches[{i}].n"))
        counts[key] = counts.get(key, 0) + 1
    if method not in ("best", "pairs", "curve"):
        raise ValueError(f"`method` must be 'best', 'pairs' or 'curve', got {method!r}")
    if not (math.isfinite(discretization) and discretization > 0):
        raise ValueError(f"`discretization` must be finite and > 0, got {discretization!r}")
    own = {key: shuffle_epsilon(key[0], key[1], delta) for key in counts}
    results: list[tuple[float, float, str]] = []
    total = sum(counts.values())
    if method == "pairs" or (method == "best" and total <= _PAIRS_MAX_BEST):
        epsilon, batch_delta = _compose_pairs(counts, delta, discretization)
        results.append((epsilon, batch_delta, PAIRS_METHOD))
    if method in ("best", "curve"):
        smallest = min(bound.epsilon for bound in own.values())
        interval = min(discretization, max(smallest / 50.0, 1e-7))
        parts = [(_clones_pld(eps0, n, interval), count) for (eps0, n), count in counts.items()]
        results.append((_read_epsilon(_compose(parts), delta), delta, CURVE_METHOD))
    basic = math.fsum(eps0 * count for (eps0, _), count in counts.items())
    results.append((basic, delta, BASIC_METHOD))
    # a tie goes to the basic sum: the simplest figure to check
    epsilon, batch_delta, name = min(results, key=lambda r: (r[0], r[2] != BASIC_METHOD))
    shown = (
        own
        if name != PAIRS_METHOD
        else {key: shuffle_epsilon(key[0], key[1], batch_delta) for key in counts}
    )
    return ComposedBound(
        epsilon=epsilon,
        delta=delta,
        batch_delta=batch_delta,
        batches=tuple(shown[(float(e), int(m))] for e, m in batches),
        method=name,
    )
