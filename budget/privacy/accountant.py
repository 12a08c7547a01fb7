"""Cumulative privacy loss of pure-epsilon ledgers: basic, exactly tight, and group privacy.

A device's ledger is a multiset ``{epsilon: count}`` of pure eps-LDP events. Three answers:

- basic sequential composition: ``sum(epsilon)`` with ``delta = 0``;
- the *optimal* ``(epsilon, delta)`` bound (Kairouz, Oh and Viswanath 2015; Murtagh and Vadhan
  2016 for heterogeneous epsilons): every eps-DP mechanism is a post-processing of randomized
  response with that epsilon, so composing randomized responses is tight. Its privacy loss is
  ``L = sum_j eps_j (2 S_j - c_j)`` with ``S_j ~ Bin(c_j, e^eps_j / (1 + e^eps_j))`` and
  ``delta(e) = P(L > e) - e^e Q(L > e)``, ``Q`` the neighbouring distribution. We enumerate the
  support (``prod_j (c_j + 1)`` points) in log space and invert ``delta(e)`` by bisection;
- past ``max_exact_points`` support points, dp-accounting's privacy loss distribution (PLD) of
  ``from_privacy_parameters(eps, 0)`` self-composed per value (pessimistic, hence valid), on a
  grid of ``pld_discretization`` or, where that would take more than :data:`PLD_MAX_BUCKETS`
  buckets of memory, the finest coarser grid that fits (:func:`pld_grid`; still valid, looser).

The reported bound is the smaller valid one, with its method and what it is named (``bound``:
"exact optimal", "PLD upper bound" or "basic sum"), and with what it is a bound of (``kind``): a
schedule fixed in advance (such as the caps' worst case), for which the optimal composition is a
guarantee, or a running total of what one device actually sent, for which only the basic sum is
(an adaptively chosen sequence can break the optimal figure: Rogers, Roth, Ullman and Vadhan
2016; Whitehouse, Ramdas, Rogers and Wu 2023; see docs/accounting.md). Everything is computed in
log space, so every accepted policy (epsilon up to 20, groups up to 1,000) gives finite figures.
Group privacy with group size
``g``: a pure eps event is ``g * eps``-DP for groups; an ``(eps, delta)`` event becomes
``(g eps, delta sum_{i<g} e^(i eps))`` (:func:`group_privacy`). Results are memoized by the
ledger's multiset, so a population with repeated ledgers is cheap to audit.

Note: do not use ``PLDAccountant`` with ``RandomizedResponseDpEvent`` and a count: in
dp-accounting 0.6.0 it ignores the count (90 reports at eps 8 come out as 8.0 instead of 720).
Its ``get_epsilon_for_delta`` overflows to ``inf`` past a loss of about 709; every figure here
then falls back to the basic sum, labelled so (:mod:`dp_governor.budget.privacy._pld_read`).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import version
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import numpy.typing as npt

from dp_governor.budget.privacy._pld_read import epsilon_for_delta

if TYPE_CHECKING:  # dp-accounting (and scipy under it) load where a PLD is computed
    from dp_accounting.pld import privacy_loss_distribution as pld

__all__ = [
    "Accountant",
    "PrivacyLoss",
    "basic_composition",
    "group_privacy",
    "optimal_delta",
    "optimal_epsilon",
    "pld_epsilon",
]

MICRO: Final = 1_000_000
Method = Literal["basic", "optimal-rr", "pld"]
Bound = Literal[
    "exact optimal",
    "PLD upper bound",
    "basic sum",
    "upper bound (dominating schedule)",
    "upper bound (group privacy)",
]
Kind = Literal["fixed schedule", "running total"]
BOUNDS: Final[dict[Method, Bound]] = {
    "optimal-rr": "exact optimal",
    "pld": "PLD upper bound",
    "basic": "basic sum",
}
NOTES: Final[dict[tuple[Kind, Bound], str]] = {
    ("fixed schedule", "exact optimal"): "the optimal (epsilon, delta) of this schedule fixed in"
    " advance (Kairouz-Oh-Viswanath; Murtagh-Vadhan): a guarantee",
    ("fixed schedule", "PLD upper bound"): "a pessimistic PLD bound (dp-accounting) of this"
    " schedule fixed in advance: a guarantee, slightly above the optimum",
    ("fixed schedule", "basic sum"): "the sum of the epsilons (delta 0): a guarantee; no"
    " (epsilon, delta) bound computed here is smaller",
    ("running total", "exact optimal"): "a running total: the optimal composition of what the"
    " device actually sent, as if it had been fixed in advance. Not a guarantee against an"
    " adaptively chosen sequence (Rogers-Roth-Ullman-Vadhan 2016); the basic sum is",
    ("running total", "PLD upper bound"): "a running total: a PLD bound of what the device"
    " actually sent, as if it had been fixed in advance. Not a guarantee against an adaptively"
    " chosen sequence (Rogers-Roth-Ullman-Vadhan 2016); the basic sum is",
    ("running total", "basic sum"): "the sum of what the device actually sent (delta 0): a"
    " valid privacy filter for pure epsilon, and what the gate enforces",
    ("fixed schedule", "upper bound (group privacy)"): "the optimal composition of this"
    " schedule fixed in advance, each report at group_size x epsilon (group privacy, Dwork-Roth"
    " Theorem 2.2, itself an upper bound for a group): an upper bound for groups, not their"
    " exact optimum",
    ("running total", "upper bound (group privacy)"): "a running total: the optimal composition"
    " of what the device actually sent, each report at group_size x epsilon (group privacy, an"
    " upper bound for a group), as if fixed in advance. Not a guarantee against an adaptively"
    " chosen sequence (Rogers-Roth-Ullman-Vadhan 2016); the basic sum is",
}
GROUPED: Final = "upper bound (group privacy)"
Ledger = Mapping[float, int]
FloatArray = npt.NDArray[np.float64]


def _normalise(events: Ledger | Iterable[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    items = events.items() if isinstance(events, Mapping) else events
    merged: dict[float, int] = {}
    for eps, count in items:
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"event `epsilon` must be finite and > 0, got {eps!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"event `count` must be an integer >= 0, got {count!r}")
        if count:
            merged[float(eps)] = merged.get(float(eps), 0) + count
    return tuple(sorted(merged.items()))


def basic_composition(events: Ledger | Iterable[tuple[float, int]]) -> float:
    """``sum(epsilon * count)``, the pure (delta = 0) bound.

    >>> basic_composition({4.0: 90})
    360.0
    """
    return math.fsum(eps * count for eps, count in _normalise(events))


def group_privacy(epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """An ``(eps, delta)`` event's guarantee for groups of ``g``: ``(g eps, delta sum e^(i eps))``.

    A ``delta`` of 1 or more says nothing; it is reported as 1.0.

    >>> group_privacy(1.0, 0.0, 3)
    (3.0, 0.0)
    >>> group_privacy(8.0, 1e-9, 89)
    (712.0, 1.0)
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"`group_size` must be an integer >= 1, got {group_size!r}")
    if delta == 0.0:
        return group_size * epsilon, 0.0
    # log(delta sum_i e^(i eps)) in log space: e^(i eps) overflows floats past eps * i > 709
    log_factor = float(np.logaddexp.reduce(np.arange(group_size) * epsilon))
    return group_size * epsilon, min(1.0, math.exp(min(0.0, math.log(delta) + log_factor)))


def _support(
    ledger: tuple[tuple[float, int], ...],
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Loss values and their log-probabilities under P and Q, over the composed support."""
    loss = np.zeros(1)
    logp = np.zeros(1)
    logq = np.zeros(1)
    for eps, count in ledger:
        s = np.arange(count + 1, dtype=np.float64)
        log_binom = (
            math.lgamma(count + 1)
            - np.array([math.lgamma(x + 1) for x in s])
            - np.array([math.lgamma(count - x + 1) for x in s])
        )
        log_p = -float(np.logaddexp(0.0, -eps))  # log(e^eps / (1 + e^eps)), no overflow
        log_1mp = -float(np.logaddexp(0.0, eps))  # log(1 / (1 + e^eps))
        lp = log_binom + s * log_p + (count - s) * log_1mp
        lq = log_binom + s * log_1mp + (count - s) * log_p
        lv = eps * (2 * s - count)
        loss = (loss[:, None] + lv[None, :]).ravel()
        logp = (logp[:, None] + lp[None, :]).ravel()
        logq = (logq[:, None] + lq[None, :]).ravel()
    return loss, logp, logq


class _Tails:
    """Sorted support with cumulative upper tails, to evaluate ``delta(e)`` in O(log n)."""

    def __init__(self, ledger: tuple[tuple[float, int], ...]) -> None:
        loss, logp, logq = _support(ledger)
        order = np.argsort(-loss, kind="stable")
        self.loss_desc = loss[order]
        self.tail_p = np.logaddexp.accumulate(logp[order])
        self.tail_q = np.logaddexp.accumulate(logq[order])

    def delta(self, e: float) -> float:
        """``P(L > e) - e^e Q(L > e)``, computed as ``P(L > e)(1 - e^(e + lq - lp))``."""
        # number of support points with loss > e (loss_desc is descending)
        k = int(np.searchsorted(-self.loss_desc, -e, side="left"))
        if k == 0:
            return 0.0
        lp = float(self.tail_p[k - 1])
        lq = float(self.tail_q[k - 1])
        exponent = e + lq - lp
        if exponent >= 0.0:  # e^e Q(L > e) >= P(L > e): nothing left (and no overflow)
            return 0.0
        return max(0.0, -math.exp(lp) * math.expm1(exponent))


def optimal_delta(events: Ledger | Iterable[tuple[float, int]], epsilon: float) -> float:
    """The optimal ``delta`` at ``epsilon`` for a pure ledger (exact enumeration)."""
    return _Tails(_normalise(events)).delta(epsilon)


def optimal_epsilon(events: Ledger | Iterable[tuple[float, int]], delta: float) -> float:
    """The smallest ``epsilon >= 0`` with ``delta(epsilon) <= delta`` (exact, by bisection)."""
    ledger = _normalise(events)
    if not ledger:
        return 0.0
    tails = _Tails(ledger)
    hi = math.fsum(e * c for e, c in ledger)
    if tails.delta(0.0) <= delta:
        return 0.0
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if tails.delta(mid) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi


def composed_pld(
    events: Ledger | Iterable[tuple[float, int]], discretization: float = 1e-3
) -> pld.PrivacyLossDistribution | None:
    """dp-accounting's pessimistic PLD of a pure ledger (``None`` for an empty ledger)."""
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution as pld

    composed = None
    for eps, count in _normalise(events):
        one = pld.from_privacy_parameters(
            pld_common.DifferentialPrivacyParameters(eps, 0.0),
            value_discretization_interval=discretization,
        )
        part = one.self_compose(count) if count > 1 else one
        composed = part if composed is None else composed.compose(part)
    return composed


def pld_epsilon(
    events: Ledger | Iterable[tuple[float, int]],
    delta: float,
    discretization: float = 1e-3,
) -> float:
    """dp-accounting's pessimistic PLD bound for a pure ledger (valid, slightly loose).

    Where dp-accounting's answer is not finite (it overflows to ``inf`` once the composed loss
    passes about 709: :mod:`dp_governor.budget.privacy._pld_read`), the basic sum, also a valid
    bound, is returned.

    >>> pld_epsilon({8.0: 89}, 1e-6)  # dp-accounting alone says inf
    712.0
    """
    composed = composed_pld(events, discretization)
    if composed is None:
        return 0.0
    found = epsilon_for_delta(composed, delta)
    basic = basic_composition(events)
    return basic if found is None else min(found, basic)


@dataclass(frozen=True, slots=True)
class PrivacyLoss:
    """Cumulative loss of one ledger, with how it was computed (to recompute it offline).

    ``epsilon`` is the smaller valid bound at ``delta``; ``epsilon_basic`` is the pure sum;
    ``bound`` names what ``epsilon`` is, ``kind`` what it is a bound of, and ``note`` says what
    that means for the reader (see the module docstring).
    """

    events: int
    epsilon_basic: float
    epsilon: float
    delta: float
    method: Method
    group_size: int
    accountant: str
    bound: Bound = "basic sum"
    kind: Kind = "fixed schedule"
    note: str = ""


class Accountant:
    """Composes ledgers, choosing the exact method when its support is small enough, memoized."""

    def __init__(
        self,
        *,
        max_exact_points: int = 2_000_000,
        pld_discretization: float = 1e-3,
        memo_size: int = 100_000,
    ) -> None:
        self.max_exact_points = max_exact_points
        self.pld_discretization = pld_discretization
        self._memo: OrderedDict[tuple[object, ...], PrivacyLoss] = OrderedDict()
        self._memo_size = memo_size
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.name = f"dp-governor optimal-rr / dp-accounting {version('dp-accounting')}"

    @property
    def hit_rate(self) -> float:
        """Fraction of :meth:`loss` calls answered from the memo."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def loss(
        self,
        events: Ledger | Iterable[tuple[float, int]],
        *,
        delta: float,
        group_size: int = 1,
        kind: Kind = "fixed schedule",
        grouped: bool = False,
    ) -> PrivacyLoss:
        """The loss of a ledger of pure events for groups of ``group_size``, at ``delta``.

        ``kind`` says what the ledger is: a schedule fixed in advance, or a running total of
        what a device actually sent (the figure is labelled accordingly). ``grouped`` says the
        events are already scaled by a group size above 1: an exact composition of them is
        then an upper bound for the group, and labelled so (as with ``group_size > 1``).
        """
        if not (0.0 < delta < 1.0):
            raise ValueError(f"`delta` must be in (0, 1), got {delta!r}")
        if kind not in ("fixed schedule", "running total"):
            raise ValueError(f"`kind` must be 'fixed schedule' or 'running total', got {kind!r}")
        grouped = grouped or group_size > 1
        if isinstance(events, tuple):  # fast path: an already sorted, merged ledger
            found = self._memo.get((events, delta, group_size, kind, grouped))
            if found is not None:
                self.hits += 1
                return found
        ledger = _normalise(events)
        key = (ledger, delta, group_size, kind, grouped)
        with self._lock:  # the memos are shared by the service's threads
            found = self._memo.get(key)
            if found is not None:
                self.hits += 1
                self._memo.move_to_end(key)
                return found
        self.misses += 1
        result = self._compute(ledger, delta, group_size, kind, grouped)
        with self._lock:
            self._memo[key] = result
            while len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return result

    def _compute(
        self,
        ledger: tuple[tuple[float, int], ...],
        delta: float,
        group_size: int,
        kind: Kind,
        grouped: bool,
    ) -> PrivacyLoss:
        scaled = tuple((group_privacy(eps, 0.0, group_size)[0], c) for eps, c in ledger)
        basic = math.fsum(e * c for e, c in scaled)
        n = sum(c for _, c in scaled)
        tight, method = basic, "basic"
        if scaled:
            points = math.prod(c + 1 for _, c in scaled)
            if points <= self.max_exact_points:
                tight, method = optimal_epsilon(scaled, delta), "optimal-rr"
            elif (grid := pld_grid(scaled, self.pld_discretization)) is not None:
                found = epsilon_for_delta(_PLDS.get(scaled, grid), delta)
                tight, method = (basic, "basic") if found is None else (found, "pld")
            if not math.isfinite(tight) or tight >= basic:
                tight, method = basic, "basic"
        bound = BOUNDS[method]  # type: ignore[index]
        if grouped and bound == "exact optimal":
            bound = GROUPED
        return PrivacyLoss(
            n,
            basic,
            tight,
            delta,
            method,  # type: ignore[arg-type]
            group_size,
            self.name,
            bound,
            kind,
            NOTES[(kind, bound)],
        )


class _PldCache:
    """The process's composed PLDs, least recently used first, at most PLD_CACHE_BUCKETS buckets.

    A composed PLD does not depend on delta, nor on which accountant asked: another delta, or
    another accountant of the same process (a command run in-process, a what-if), costs one
    epsilon-for-delta search instead of the composition. One cache a process also bounds the
    memory of all of them together.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plds: OrderedDict[
            tuple[tuple[tuple[float, int], ...], float], tuple[pld.PrivacyLossDistribution, int]
        ] = OrderedDict()

    def get(
        self, ledger: tuple[tuple[float, int], ...], grid: tuple[float, int]
    ) -> pld.PrivacyLossDistribution:
        """The PLD of ``ledger`` on ``grid``: cached, or composed and cached."""
        discretization, buckets = grid
        key = (ledger, discretization)
        with self._lock:
            found = self._plds.get(key)
            if found is not None:
                self._plds.move_to_end(key)
                return found[0]
        composed = composed_pld(ledger, discretization)
        assert composed is not None
        with self._lock:
            self._plds[key] = (composed, buckets)
            while sum(b for _, b in self._plds.values()) > PLD_CACHE_BUCKETS:
                self._plds.popitem(last=False)
        return composed


_PLDS = _PldCache()


# Memory: dp-accounting's FFT convolution of an array of ``b`` buckets holds about 64 bytes a
# bucket at its peak (complex transforms, the power, the inverse, the real part), so a PLD is
# built on a grid coarse enough that no array it makes has more than PLD_MAX_BUCKETS buckets
# (about 256 MiB at the peak); a coarser pessimistic grid is still a valid upper bound, only
# looser. The composed PLDs kept for other deltas hold at most PLD_CACHE_BUCKETS buckets.
PLD_MAX_BUCKETS: Final = 4_000_000
PLD_CACHE_BUCKETS: Final = 16_000_000
PLD_TAIL_MASS: Final = 1e-15  # dp-accounting's default truncation of a self-composition
# Past an event epsilon of PLD_MAX_EPSILON dp-accounting's ``from_privacy_parameters`` calls
# ``math.exp(epsilon)`` and overflows (at such epsilons the optimum is the basic sum anyway).
PLD_MAX_EPSILON: Final = 500.0


def pld_buckets(ledger: tuple[tuple[float, int], ...], discretization: float) -> int:
    """The longest array dp-accounting makes for the PLD of ``ledger`` on ``discretization``.

    One pure event is two losses, rounded up to the grid; ``count`` of them self-compose by FFT
    over the range dp-accounting's own Chernoff bounds keep
    (``common.compute_self_convolve_bounds``, computed here on the same two-point list), and
    the parts compose into an array as long as their sum.
    """
    from dp_accounting.pld import common as pld_common

    total = 0
    for eps, count in ledger:
        length = math.ceil(eps / discretization) - math.ceil(-eps / discretization) + 1
        width = length
        if count > 1:
            probs = np.zeros(length)
            probs[0], probs[-1] = 1.0 / (1.0 + math.exp(eps)), 1.0 / (1.0 + math.exp(-eps))
            low, high = pld_common.compute_self_convolve_bounds(probs, count, PLD_TAIL_MASS)
            width = max(high - low + 1, length)
        total += width
    return total


def pld_grid(ledger: tuple[tuple[float, int], ...], finest: float) -> tuple[float, int] | None:
    """The discretization a PLD of ``ledger`` is built on, and its buckets (``None``: none).

    ``finest`` unless that would need more than :data:`PLD_MAX_BUCKETS` buckets; then the
    interval grows until it fits. ``None`` past :data:`PLD_MAX_EPSILON`.

    >>> pld_grid(((4.0, 90),), 1e-3)[0]
    0.001
    >>> pld_grid(((0.115444, 1_327_473), (0.001, 46_499)), 1e-3)[1] <= PLD_MAX_BUCKETS
    True
    """
    if max(e for e, _ in ledger) > PLD_MAX_EPSILON:
        return None
    discretization = finest
    for _ in range(32):
        buckets = pld_buckets(ledger, discretization)
        if buckets <= PLD_MAX_BUCKETS:
            return discretization, buckets
        discretization *= 1.25 * buckets / PLD_MAX_BUCKETS
    return None
