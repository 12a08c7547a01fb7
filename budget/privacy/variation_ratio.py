"""Wang et al.'s variation-ratio bound for shuffled reports, evaluated exactly: compared, not used.

Method: Wang, Peng, Li, Wen, Li, Yu, Wang and Yang, "Privacy amplification via shuffling:
unified, simplified, and tightened", VLDB 2024 (arXiv:2304.05007): Lemma 4.4's decomposition
and the pair of counts its upper bound rests on (``amplificationUB`` of the authors' reference
code evaluates it). A local randomizer ``R`` has the ``(p, beta, q)``-variation property when for
all inputs ``x, x', x''`` and outputs ``y``: ``R(x)(y) <= p R(x')(y)``, the total variation
distance of ``R(x)`` and ``R(x')`` is at most ``beta``, and ``max(R(x)(y), R(x')(y)) <= q
R(x'')(y)``. With ``alpha = beta / (p - 1)``, ``r = alpha p / q`` and ``gamma = 1 - alpha -
p alpha`` the paper bounds the shuffled reports of ``n`` devices (device 1's input changed) by
the pair of counts

    C ~ Bin(n - 1, 2 r),  A | C ~ Bin(C, 1/2),
    device 1 adds (1, 0) w.p. p alpha, (0, 1) w.p. alpha, (0, 0) w.p. gamma   (P; Q swaps the
    first two), observed: (A + its first count, C - A + its second count).

For a generic ``eps0``-LDP randomizer (``p = q = e^eps0``, ``beta = tanh(eps0 / 2)``) this is
the pair of Feldman, McMillan and Talwar, SODA 2023 (clone probability ``2 / (e^eps0 + 1)``);
with a randomizer's own smaller ``beta`` it is tighter (CMS: ``tanh(eps / 4)``, HCMS:
``tanh(eps / 2) / 2``).

Why the service does not use it (docs/amplification.md, "The variation-ratio reduction"): when
``gamma > 0`` device 1's leftover component differs from the other devices' leftovers, and
whether device 1 is the one in the leftover, given the counts, has a different law under the
two inputs, so the shuffled batch is not a post-processing of the counts alone. Exact
enumeration finds randomizers with the property whose shuffled batch has a larger ``delta``
than the pair, the service's own CMS and HCMS among them (two devices: 0.109 against 0.0083 for
CMS at eps 4, 0.0305 against 0.0166 for a binary randomizer;
``tests/budget/privacy/test_variation_ratio.py``). With ``gamma = 0`` (``beta`` at its largest,
``(p - 1) / (p + 1)``) the leftover-free decomposition needs every other device to hold
``(R(x) + R(x')) / (p + 1)`` of the candidates' mass at every output, which ``eps0``-LDP does not
give and the service's sketches do not meet (:func:`clone_margin`); the SODA 2023 paper's erratum
likewise restricts its general bounds to a class of randomizers. The module is kept to
reproduce the published figures and to measure what the reduction would claim beside the
bound the service shows (:mod:`dp_governor.budget.privacy.amplification`).

Evaluation (an upper bound on the pair's own ``delta``, whatever the float rounding): the
observation is ``(a, m - a)`` with ``m`` the total count; for each ``m`` the privacy loss is
increasing in ``a``, so the divergence at ``m`` is one tail past the threshold

    low_m = (m (e^eps p - 1) + (p / q) gamma (e^eps - 1) (n - m) / (1 - 2 r))
            / ((p - 1)(e^eps + 1)),

written with ``S_c(t) = Pr[Bin(c, 1/2) >= t]`` and ``w_c = Pr[C = c]`` as

    delta_m(t) = w_{m-1} ((p - e^eps) alpha S_{m-1}(t - 1) + (1 - e^eps p) alpha S_{m-1}(t))
                 + w_m gamma (1 - e^eps) S_m(t).

The best of ``t`` in ``floor(low_m) + {0, 1, 2}`` is taken (float error cannot move the
threshold further), each term carries a ``1e-9`` relative rounding allowance, ``c`` beyond ten
standard deviations of ``C`` is charged ``delta = 1`` (its exact binomial mass), and the two
totals ``m`` at the edges of the kept range are charged their whole mass. The pair is symmetric
(swapping the counts maps ``P`` to ``Q``), so one direction serves both.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral, Real
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

__all__ = [
    "VariationParameters",
    "clone_margin",
    "variation_ratio_delta",
    "variation_ratio_epsilon",
]

FloatArray = npt.NDArray[np.float64]

_TAIL_SDS: Final = 10.0  # c beyond this many standard deviations of C is charged delta = 1
_REL: Final = 1e-9  # rounding allowance per term (scipy's binomial functions: ~1e-13 relative)
_NO_GAIN: Final = 1e-6  # search below (1 - this) log p; at log p itself delta is 0
_EPS_RTOL: Final = 1e-6  # first step up from the root finder's crossing, relative to epsilon


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"`{name}` must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"`{name}` must be finite, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class VariationParameters:
    """A randomizer's ``(p, beta, q)``: largest likelihood ratio, total variation, and clone ratio.

    ``p > 1``; ``0 < beta <= (p - 1) / (p + 1)`` (no ``p``-bounded pair is further apart);
    ``q >= 1`` with ``2 r <= 1``. Built from closed forms (:meth:`generic`, :meth:`cms`,
    :meth:`hcms`) or computed exactly from a randomizer's output distributions
    (:meth:`of_distributions`).

    >>> VariationParameters.cms(4.0).beta  # tanh(1)
    0.7615941559557649
    """

    p: float
    beta: float
    q: float

    def __post_init__(self) -> None:
        p = _positive(self.p, "p")
        beta = _positive(self.beta, "beta")
        q = _positive(self.q, "q")
        if p <= 1.0:
            raise ValueError(f"`p` must be > 1, got {self.p!r}")
        if not (0.0 < beta <= (p - 1.0) / (p + 1.0) * (1.0 + 1e-12)):
            raise ValueError(f"`beta` must be in (0, (p - 1) / (p + 1)], got {self.beta!r}")
        if q < 1.0 or 2.0 * beta * p / ((p - 1.0) * q) > 1.0 + 1e-12:
            raise ValueError(f"`q` must be >= 1 and give 2 r <= 1, got {self.q!r}")

    @property
    def alpha(self) -> float:
        """``beta / (p - 1)``: device 1's weight on its less likely part."""
        return self.beta / (self.p - 1.0)

    @property
    def r(self) -> float:
        """``alpha p / q``: each other device's probability of each of the two clone parts."""
        return self.alpha * self.p / self.q

    @property
    def leftover(self) -> float:
        """``gamma = 1 - alpha - p alpha``, device 1's weight outside both parts (>= 0)."""
        return max(0.0, 1.0 - self.alpha * (1.0 + self.p))

    @classmethod
    def generic(cls, eps0: float) -> VariationParameters:
        """Any ``eps0``-LDP randomizer: ``p = q = e^eps0``, ``beta = tanh(eps0 / 2)``."""
        eps0 = _positive(eps0, "eps0")
        return cls(math.exp(eps0), math.tanh(eps0 / 2.0), math.exp(eps0))

    @classmethod
    def cms(cls, epsilon: float) -> VariationParameters:
        """Apple's CMS, two hash positions apart: each bit flips w.p. ``1 / (1 + e^(eps/2))``.

        Two inputs differ in two coordinates of the sign vector: the likelihood ratio is at
        most ``((1 - f) / f)^2 = e^eps`` and the total variation ``(1 - f)^2 - f^2 = 1 - 2 f =
        tanh(eps / 4)`` (smaller when their hashes collide in some rows).
        """
        epsilon = _positive(epsilon, "epsilon")
        return cls(math.exp(epsilon), math.tanh(epsilon / 4.0), math.exp(epsilon))

    @classmethod
    def hcms(cls, epsilon: float) -> VariationParameters:
        """Apple's HCMS: one Hadamard coefficient, its sign flipped w.p. ``1 / (1 + e^eps)``.

        Two distinct rows of a Hadamard matrix differ in half their coefficients, so the total
        variation is ``tanh(eps / 2) / 2`` and the likelihood ratio at most ``e^eps``.
        """
        epsilon = _positive(epsilon, "epsilon")
        return cls(math.exp(epsilon), math.tanh(epsilon / 2.0) / 2.0, math.exp(epsilon))

    @classmethod
    def of_distributions(cls, rows: npt.ArrayLike) -> VariationParameters:
        """Exact ``(p, beta, q)`` of a randomizer given as its output distributions, one per row.

        Every entry must be positive (a zero makes ``p`` infinite) and every row sum to 1.
        """
        table = np.asarray(rows, dtype=np.float64)
        if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] < 2:
            raise ValueError(f"`rows` must be a 2-D table of >= 2 distributions, got {table.shape}")
        if not np.all(np.isfinite(table)) or np.any(table <= 0.0):
            raise ValueError("`rows` must hold finite probabilities > 0")
        if not np.allclose(table.sum(axis=1), 1.0, rtol=0.0, atol=1e-12):
            raise ValueError("every row of `rows` must sum to 1")
        p = beta = q = 0.0
        for i, j in itertools.permutations(range(table.shape[0]), 2):
            p = max(p, float(np.max(table[i] / table[j])))
            beta = max(beta, 0.5 * float(np.abs(table[i] - table[j]).sum()))
            top = np.maximum(table[i], table[j])
            q = max(q, float(np.max(top[None, :] / table).max()))
        return cls(p, beta, q)


def clone_margin(rows: npt.ArrayLike) -> float:
    """Smallest ``R(x'')(y) (p + 1) / (R(x)(y) + R(x')(y))`` over inputs and outputs (exact).

    At least 1 exactly when every other device's report holds a clone of weight ``1 / (p + 1)``
    of each of the two candidate inputs' parts in the decomposition without leftover
    (``gamma = 0``, clone probability ``2 / (p + 1)``), with ``p`` the table's own largest
    ratio: what the generic pair (Feldman, McMillan and Talwar, SODA 2023) needs from a
    randomizer, and ``eps0``-LDP alone does not give (``e^-eps0`` only). CMS and HCMS fall
    short of it (``(e^eps + 1) / (2 e^eps)``, where the two candidates agree on a bit the third
    does not).
    """
    table = np.asarray(rows, dtype=np.float64)
    p = VariationParameters.of_distributions(table).p
    margin = math.inf
    for i, j in itertools.combinations(range(table.shape[0]), 2):
        pair = table[i] + table[j]
        margin = min(margin, float(np.min((p + 1.0) * table / pair[None, :])))
    return margin


def _check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"`n` must be an integer >= 1, got {n!r}")
    return int(n)


@lru_cache(maxsize=1024)
def _delta(params: VariationParameters, n: int, epsilon: float) -> float:
    """The bound on the pair's ``delta(epsilon)`` described in the module docstring."""
    p, alpha, gamma, rate = params.p, params.alpha, params.leftover, 2.0 * params.r
    if epsilon >= math.log(p):
        return 0.0
    trials = n - 1
    if trials == 0 or rate == 0.0:
        return min(1.0, alpha * (p - math.exp(epsilon)))  # device 1 alone
    mean = trials * rate
    sd = math.sqrt(trials * rate * (1.0 - rate))
    lo = max(0, math.floor(mean - _TAIL_SDS * sd))
    hi = min(trials, math.ceil(mean + _TAIL_SDS * sd + _TAIL_SDS))
    tail = float(stats.binom.cdf(lo - 1, trials, rate)) + float(stats.binom.sf(hi, trials, rate))
    c = np.arange(lo, hi + 1, dtype=np.float64)
    w = np.asarray(stats.binom.pmf(c, trials, rate), dtype=np.float64)
    # totals m = lo .. hi + 1; a c outside [lo, hi] is in the tail (weight 0 here)
    m = np.arange(lo, hi + 2, dtype=np.float64)
    w_prev = np.concatenate(([0.0], w))  # Pr[C = m - 1]
    w_same = np.concatenate((w, [0.0]))  # Pr[C = m]
    # at m = lo > 0 only the leftover part remains (likelihood ratio 1: no divergence); at
    # m = hi + 1 <= n - 1 only device 1's two parts remain, whose threshold differs from the
    # formula's: that total is charged its whole mass instead
    cut_top = hi < trials
    edges = float(w[-1]) * alpha * (1.0 + p) if cut_top else 0.0
    if cut_top:
        w_prev[-1] = 0.0
    e = math.exp(epsilon)
    spread = (n - m) / (1.0 - rate) if rate < 1.0 else np.zeros_like(m)
    low = (m * (e * p - 1.0) + (p / params.q) * gamma * (e - 1.0) * spread) / (
        (p - 1.0) * (e + 1.0)
    )
    base = np.floor(low)
    m_prev = np.maximum(m - 1.0, 0.0)  # Bin(-1, .) is undefined; its weight is 0 anyway
    best = np.zeros_like(m)
    allowance = np.zeros_like(m)
    for shift in (0.0, 1.0, 2.0):
        t = np.clip(base + shift, 0.0, m + 2.0)
        s_prev_shift = np.asarray(stats.binom.sf(t - 2.0, m_prev, 0.5), dtype=np.float64)
        s_prev = np.asarray(stats.binom.sf(t - 1.0, m_prev, 0.5), dtype=np.float64)
        s_same = np.asarray(stats.binom.sf(t - 1.0, m, 0.5), dtype=np.float64)
        gain = w_prev * alpha * (p * s_prev_shift + s_prev) + w_same * gamma * s_same
        cost = e * (w_prev * alpha * (s_prev_shift + p * s_prev) + w_same * gamma * s_same)
        value = gain - cost
        better = value > best
        best = np.where(better, value, best)
        allowance = np.maximum(allowance, _REL * (gain + cost))
    total = math.fsum((best + allowance).tolist()) + edges + tail
    if not math.isfinite(total):
        raise ArithmeticError(f"non-finite bound at n={n}, epsilon={epsilon!r}: {params}")
    return min(1.0, total * (1.0 + _REL))


def variation_ratio_delta(params: VariationParameters, n: int, epsilon: float) -> float:
    """Upper bound on the variation-ratio pair's ``delta`` at ``epsilon`` for ``n`` devices.

    Not a bound the service quotes (module docstring): the reduction behind it does not hold
    for every randomizer with the property.

    >>> variation_ratio_delta(VariationParameters.generic(1.0), 1, 0.5) > 0.1
    True
    """
    if not isinstance(params, VariationParameters):
        raise ValueError(f"`params` must be VariationParameters, got {params!r}")
    epsilon = _positive(epsilon, "epsilon")
    if epsilon < 0.0:
        raise ValueError(f"`epsilon` must be >= 0, got {epsilon!r}")
    return _delta(params, _check_n(n), epsilon)


def _log_excess(epsilon: float, params: VariationParameters, n: int, delta: float) -> float:
    return math.log(max(_delta(params, n, epsilon), 1e-300)) - math.log(delta)


@lru_cache(maxsize=1024)
def _epsilon(params: VariationParameters, n: int, delta: float) -> float:
    top = math.log(params.p) * (1.0 - _NO_GAIN)
    if _delta(params, n, 0.0) <= delta:
        return 0.0
    if _delta(params, n, top) > delta:
        return math.log(params.p)
    root = float(
        optimize.brentq(_log_excess, 0.0, top, args=(params, n, delta), xtol=1e-12, rtol=1e-9)
    )
    epsilon = root
    step = max(root * _EPS_RTOL, 1e-12)
    while _delta(params, n, epsilon) > delta:
        epsilon = min(epsilon + step, top)
        step *= 2.0
    return epsilon


def variation_ratio_epsilon(params: VariationParameters, n: int, delta: float) -> float:
    """Smallest ``epsilon`` (to 1e-6 relative) at which the pair's bound is ``<= delta``.

    The value returned is one at which :func:`variation_ratio_delta` was evaluated and found
    ``<= delta``; ``log p`` when no smaller one is (no amplification).

    >>> round(variation_ratio_epsilon(VariationParameters.generic(4.0), 10**6, 1e-6), 3)
    0.034
    """
    if not isinstance(params, VariationParameters):
        raise ValueError(f"`params` must be VariationParameters, got {params!r}")
    delta = _positive(delta, "delta")
    if not (0.0 < delta < 1.0):
        raise ValueError(f"`delta` must be in (0, 1), got {delta!r}")
    return _epsilon(params, _check_n(n), delta)
