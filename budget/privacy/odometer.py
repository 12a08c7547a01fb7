"""Privacy filters and odometers for fully adaptive composition of pure-epsilon reports.

A device sends reports ``1, 2, ...``; report ``i`` is ``eps_i``-DP (pure, ``delta_i = 0``), and
``eps_i`` as well as the mechanism may depend on everything released before it (*fully adaptive*
composition, Rogers, Roth, Ullman and Vadhan, "Privacy odometers and filters: pay-as-you-go
composition", NeurIPS 2016). Fixed-schedule composition theorems (including the exact optimal one
in :mod:`dp_governor.budget.privacy.accountant`) do not apply to such sequences as they stand; the
two objects here do.

All of them read three running totals, :class:`OdometerState`: ``n``, ``S1 = sum eps_i`` and
``S2 = sum eps_i^2`` (integers in micro-epsilon and micro-epsilon squared, so charging is exact and
O(1)). The gate computes them from a device's account row, whose slots determine them exactly
(:meth:`dp_governor.budget.rule.state.AccountState.scaled_lifetime`; docs/odometer.md, "Storage"),
and enforces the filter there (:mod:`dp_governor.budget.rule.filter`).

**Filter** (:func:`admit`): Whitehouse, Ramdas, Rogers and Wu, "Fully-adaptive composition in
differential privacy", ICML 2023 (PMLR 202:36990-37007; arXiv:2203.05481), the advanced
composition filter for approximate DP. With target ``(eps_g, delta_g)``, ``delta_g = delta' +
delta''``, the interaction stops at the first ``n`` for which

    ``eps_g < sqrt(2 log(1/delta') sum_{m<=n+1} eps_m^2) + 1/2 sum_{m<=n+1} eps_m^2``
    or ``delta'' < sum_{m<=n+1} delta_m``,

and the stopped composition is ``(eps_g, delta_g)``-DP. For pure reports every ``delta_m = 0``,
so ``delta'' = 0``, ``delta' = delta_g`` and report ``t`` is admitted iff
``sqrt(2 log(1/delta_g) S2') + S2'/2 <= eps_g`` with ``S2' = S2 + eps_t^2``. The left side
increases in ``S2'``, so this is ``S2' <= V*`` with
``V* = (sqrt(2 log(1/delta_g) + 2 eps_g) - sqrt(2 log(1/delta_g)))^2``: the filter needs ``S2``
only. Why it holds: the privacy loss ``L_m`` of an ``eps_m``-DP report lies in
``[-eps_m, eps_m]`` with conditional mean at most ``eps_m tanh(eps_m/2) <= eps_m^2/2``, so by
Hoeffding's lemma ``exp(lambda sum (L_m - mean_m) - lambda^2 S2/2)`` is a supermartingale for
predictable ``eps_m``; Ville's inequality with ``lambda = sqrt(2 log(1/delta)/V*)`` bounds the
loss by ``sqrt(2 log(1/delta) V*) + V*/2 = eps_g`` at every admitted time, except with
probability ``delta``.

**Odometer** (:func:`running_epsilon`): the same paper's odometer from the Gaussian mixture
boundary (method of mixtures; Howard, Ramdas, McAuliffe and Sekhon, "Time-uniform, nonparametric,
nonasymptotic confidence sequences", Ann. Statist. 2021). For a mixing precision ``rho > 0``
fixed in advance, with probability at least ``1 - delta``, simultaneously for every ``n``,

    ``L_n <= S2/2 + sqrt(2 (S2 + rho) log(sqrt((S2 + rho)/rho) / delta))``.

Mixing the supermartingale above over ``lambda ~ N(0, 1/rho)`` gives
``sqrt(rho/(S2+rho)) exp(S^2/(2(S2+rho)))``, and Ville's inequality bounds it by ``1/delta``. The
price of holding at all times at once is the ``sqrt((S2+rho)/rho)`` inside the logarithm; ``rho``
makes the bound tightest near ``S2 = tuned_for`` (:func:`mixture_rho`). The reading is the smaller
of this and ``S1``: pure-DP losses are bounded by ``S1`` surely, so the minimum is still valid.

Figure: at ``eps_g = 4``, ``delta_g = 1e-9`` the filter admits 141 reports of 0.05 where a basic
sum cap admits 80: 61 more (``V* = 0.35275``). Reports of ``e`` get about ``V*/e^2`` against
``eps_g/e``, so above ``e = V*/eps_g = 0.088`` the basic cap admits more (with 0.1: 35 against
40); :func:`admit_either` takes the better of the two, still valid.

Floating point: thresholds are computed in binary floating point (``log``, ``sqrt``), then the
filter's cap ``V*`` is rounded *down* by a relative ``FLOAT_SLACK`` to integer micro-epsilon
squared and compared exactly; the odometer's reading is rounded *up* by the same relative amount.
Both therefore err on the side of privacy, never by more than ``FLOAT_SLACK`` relative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Final

from dp_governor.policies.model import to_micro

__all__ = [
    "FLOAT_SLACK",
    "MICRO",
    "OdometerState",
    "Target",
    "admit",
    "admit_basic",
    "admit_either",
    "charge",
    "filter_cap_sq",
    "filter_epsilon",
    "mixture_epsilon",
    "mixture_rho",
    "running_epsilon",
]

MICRO: Final = 1_000_000
MICRO_SQ: Final = MICRO * MICRO
FLOAT_SLACK: Final = 1e-12
DEFAULT_TUNED_FOR: Final = 1.0


def _real(value: object, field: str) -> float:
    """``value`` as a finite float, or a ValueError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{field}` must be a finite number, got {value!r}")
    return float(value)


def _delta(value: object, field: str = "delta") -> float:
    """A delta strictly between 0 and 1."""
    delta = _real(value, field)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"`{field}` must be > 0 and < 1, got {value!r}")
    return delta


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{field}` must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Target:
    """A filter's target guarantee ``(epsilon, delta)`` for the whole adaptive sequence.

    >>> Target(4.0, 1e-9)
    Target(epsilon=4.0, delta=1e-09)
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        epsilon = _real(self.epsilon, "epsilon")
        if epsilon <= 0:
            raise ValueError(f"`epsilon` must be > 0, got {self.epsilon!r}")
        _delta(self.delta)


@dataclass(frozen=True, slots=True)
class OdometerState:
    """One device's running totals: ``count``, ``sum eps`` (micro) and ``sum eps^2`` (micro^2).

    Integers, so that charging is exact and the gate can store them as they are. The fields must
    be consistent totals of positive epsilons: all zero together, and
    ``sum_eps^2 / count <= sum_eps_sq <= sum_eps^2`` (Cauchy-Schwarz).

    >>> charge(charge(OdometerState(), 0.5), 0.25)
    OdometerState(count=2, sum_eps=750000, sum_eps_sq=312500000000)
    """

    count: int = 0
    sum_eps: int = 0
    sum_eps_sq: int = 0

    def __post_init__(self) -> None:
        n = _count(self.count, "count")
        s1 = _count(self.sum_eps, "sum_eps")
        s2 = _count(self.sum_eps_sq, "sum_eps_sq")
        if (n == 0) != (s1 == 0) or (n == 0) != (s2 == 0):
            raise ValueError(
                f"`count`, `sum_eps` and `sum_eps_sq` must be zero together, got {n}, {s1}, {s2}"
            )
        if s2 > s1 * s1 or s1 * s1 > n * s2:
            raise ValueError(
                f"`sum_eps_sq` must lie between sum_eps^2/count and sum_eps^2, got {s2} "
                f"with sum_eps {s1}, count {n}"
            )

    @property
    def epsilon_sum(self) -> float:
        """``S1 = sum eps_i``: the basic (pure, delta 0) composition of the reports so far."""
        return self.sum_eps / MICRO

    @property
    def epsilon_sq_sum(self) -> float:
        """``S2 = sum eps_i^2``, the variance proxy of the privacy loss."""
        return self.sum_eps_sq / MICRO_SQ


def _eps_micro(eps: float) -> int:
    """A report's epsilon as exact micro-epsilon: finite, > 0, a multiple of 1e-6."""
    micro = to_micro(eps, "eps")
    if micro <= 0:
        raise ValueError(f"`eps` must be > 0, got {eps!r}")
    return micro


def charge(state: OdometerState, eps: float) -> OdometerState:
    """The totals after one more report of ``eps``: O(1), exact.

    >>> charge(OdometerState(), 0.05)
    OdometerState(count=1, sum_eps=50000, sum_eps_sq=2500000000)
    """
    e = _eps_micro(eps)
    return OdometerState(state.count + 1, state.sum_eps + e, state.sum_eps_sq + e * e)


def filter_epsilon(sum_eps_sq: float, delta: float) -> float:
    """The filter theorem's left side ``sqrt(2 log(1/delta) S2) + S2/2`` (floating point).

    >>> round(filter_epsilon(141 * 0.05**2, 1e-9), 4)
    3.9985
    """
    s2 = _real(sum_eps_sq, "sum_eps_sq")
    if s2 < 0:
        raise ValueError(f"`sum_eps_sq` must be >= 0, got {sum_eps_sq!r}")
    return math.sqrt(2.0 * math.log(1.0 / _delta(delta)) * s2) + s2 / 2.0


def filter_cap_sq(target: Target) -> int:
    """``V*`` in micro-epsilon squared, rounded down: the filter admits while ``S2 <= V*``.

    ``V* = (sqrt(a + 2 eps_g) - sqrt(a))^2`` with ``a = 2 log(1/delta_g)``, evaluated as
    ``(2 eps_g / (sqrt(a + 2 eps_g) + sqrt(a)))^2`` to avoid cancellation when ``eps_g << a``.

    >>> filter_cap_sq(Target(4.0, 1e-9))
    352746556067
    """
    a = 2.0 * math.log(1.0 / target.delta)
    v_star = (2.0 * target.epsilon / (math.sqrt(a + 2.0 * target.epsilon) + math.sqrt(a))) ** 2
    return math.floor(v_star * MICRO_SQ * (1.0 - FLOAT_SLACK))


def admit(state: OdometerState, eps: float, target: Target) -> bool:
    """Whether the advanced-composition filter admits one more report of ``eps``.

    True iff ``sqrt(2 log(1/delta_g) S2') + S2'/2 <= eps_g`` with the report counted
    (``S2' = S2 + eps^2``); the whole admitted sequence is then ``(eps_g, delta_g)``-DP however
    each ``eps_i`` was chosen (Whitehouse et al. 2023; see the module docstring).

    >>> s, n = OdometerState(), 0
    >>> while admit(s, 0.05, Target(4.0, 1e-9)):
    ...     s, n = charge(s, 0.05), n + 1
    >>> n
    141
    """
    e = _eps_micro(eps)
    return state.sum_eps_sq + e * e <= filter_cap_sq(target)


def admit_basic(state: OdometerState, eps: float, target: Target) -> bool:
    """The basic filter: admit iff ``S1 + eps <= eps_g`` exactly (a pure ``(eps_g, 0)`` cap).

    Valid under full adaptivity for pure reports, since each report's privacy loss is at most its
    ``eps`` surely; ``target.delta`` is not used. Compared in exact rational arithmetic.

    >>> admit_basic(OdometerState(79, 3_950_000, 79 * 2_500_000_000), 0.05, Target(4.0, 1e-9))
    True
    """
    e = _eps_micro(eps)
    cap = Fraction(Decimal(repr(target.epsilon))) * MICRO
    return state.sum_eps + e <= cap


def admit_either(state: OdometerState, eps: float, target: Target) -> bool:
    """Admit if the basic or the advanced filter would: the better of the two, still valid.

    With the report counted, either ``S1 <= eps_g`` (the loss is at most ``eps_g`` surely) or
    ``S2 <= V*`` (the loss is at most ``eps_g`` outside the one event of probability
    ``delta_g`` on which the filter's supermartingale crosses its line). So the loss at the stop
    exceeds ``eps_g`` only on that event, and the stopped sequence is ``(eps_g, delta_g)``-DP.

    >>> state, target = OdometerState(), Target(4.0, 1e-9)
    >>> admit_either(state, 1.0, target), admit(state, 1.0, target)
    (True, False)
    """
    return admit_basic(state, eps, target) or admit(state, eps, target)


def mixture_rho(tuned_for: float, delta: float) -> float:
    """The mixing precision that makes the odometer tightest near ``S2 = tuned_for``.

    ``rho = m / (2 log(1/delta) + log(1 + 2 log(1/delta)))`` (Howard et al. 2021's approximate
    optimum for the normal mixture). Any ``rho > 0`` is valid if fixed before the reports are
    seen; this only chooses where the bound is closest to the fixed-schedule one.

    >>> round(mixture_rho(1.0, 1e-9), 6)
    0.022126
    """
    m = _real(tuned_for, "tuned_for")
    if m <= 0:
        raise ValueError(f"`tuned_for` must be > 0, got {tuned_for!r}")
    log_inv = math.log(1.0 / _delta(delta))
    return m / (2.0 * log_inv + math.log1p(2.0 * log_inv))


def mixture_epsilon(sum_eps_sq: float, delta: float, rho: float) -> float:
    """The mixture odometer ``S2/2 + sqrt(2 (S2 + rho) log(sqrt((S2 + rho)/rho)/delta))``.

    Rounded up by a relative ``FLOAT_SLACK``.

    >>> round(mixture_epsilon(1.0, 1e-9, mixture_rho(1.0, 1e-9)), 3)
    7.303
    """
    s2 = _real(sum_eps_sq, "sum_eps_sq")
    if s2 < 0:
        raise ValueError(f"`sum_eps_sq` must be >= 0, got {sum_eps_sq!r}")
    r = _real(rho, "rho")
    if r <= 0:
        raise ValueError(f"`rho` must be > 0, got {rho!r}")
    d = _delta(delta)
    v = s2 + r
    bound = s2 / 2.0 + math.sqrt(v * (math.log(v / r) + 2.0 * math.log(1.0 / d)))
    return bound * (1.0 + FLOAT_SLACK)


def running_epsilon(
    state: OdometerState, delta: float, *, tuned_for: float = DEFAULT_TUNED_FOR
) -> float:
    """A valid running epsilon at ``delta`` for the reports so far, however they were chosen.

    ``min(S1, mixture_epsilon(S2, delta, mixture_rho(tuned_for, delta)))``: with probability at
    least ``1 - delta`` the privacy loss stays below this reading at every time at once, so the
    reading is an ``(eps, delta)`` guarantee whenever it is quoted. Non-decreasing as reports are
    added. ``tuned_for`` (a sum of squared epsilons) must be fixed by policy, never chosen after
    looking at a device's totals.

    >>> running_epsilon(OdometerState(), 1e-9)
    0.0
    >>> running_epsilon(charge(OdometerState(), 1.0), 1e-9)
    1.0
    """
    rho = mixture_rho(tuned_for, delta)
    if state.count == 0:
        return 0.0
    return min(state.epsilon_sum, mixture_epsilon(state.epsilon_sq_sum, delta, rho))
