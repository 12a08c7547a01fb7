"""Empirical privacy audit of a randomizer as deployed: does the charge match the real loss?

For two inputs ``x`` and ``x'`` the audit estimates the probability of the known worst-case
event ``E`` under each from samples, and turns Clopper-Pearson bounds at level ``alpha`` into
bounds on ``ln P(E | x) / P(E | x')``:

- CMS (flip probability ``1 / (1 + e^(eps/2))``): ``E`` = the report's bit at ``h_j(x)`` is +1
  and its bit at ``h_j(x')`` is -1, for the report's own row ``j``. Rows where the two hash
  alike make ``E`` impossible under both, so the ratio is ``((1 - p) / p)^2 = e^eps`` exactly.
- HCMS (keep probability ``q = e^eps / (1 + e^eps)``): ``E`` = the bit equals
  ``H[l, h_j(x)]`` where ``H[l, h_j(x)] != H[l, h_j(x')]``: the ratio is ``q / (1 - q) = e^eps``.
- SFP as a whole report: the word report's CMS event and the fragment report's CMS event (the
  fragments of ``x`` and ``x'`` at the report's position), independent, so ``e^(eps_w + eps_f)``.

The lower bound on epsilon must not exceed the charged epsilon (the mechanism leaks no more
than it is charged for) and the upper bound must reach it (it leaks as much as designed: a
randomizer that lost its signal, say by ignoring the hash row, fails here). Pure numpy and
scipy; the caller passes the generator, and may pass a ``privatize`` to audit a variant.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms.interface import Mechanism

__all__ = ["AuditResult", "audit", "clopper_pearson", "exact_max_log_ratio"]

BoolArray = npt.NDArray[np.bool_]
CHUNK = 1 << 17  # reports drawn at a time: memory holds one chunk, whatever ``samples`` is


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """The exact two-sided ``1 - alpha`` interval of a binomial proportion."""
    if not 0 <= successes <= trials or trials <= 0:
        raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
    from scipy.stats import beta  # scipy loads where an interval is computed

    lo = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    hi = (
        1.0
        if successes == trials
        else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    )
    return lo, hi


@dataclass(frozen=True, slots=True)
class AuditResult:
    """Event counts under both inputs and the epsilon interval they support."""

    mechanism: str
    epsilon: float
    samples: int
    alpha: float
    hits: tuple[int, int]
    lower: float
    estimate: float
    upper: float

    @property
    def leaks_more(self) -> bool:
        """The lower bound exceeds the charged epsilon: the charge is too small."""
        return self.lower > self.epsilon

    @property
    def reaches(self) -> bool:
        """The upper bound reaches the charged epsilon: the mechanism works as designed."""
        return self.upper >= self.epsilon

    @property
    def passed(self) -> bool:
        """Neither more loss than charged nor less signal than designed."""
        return not self.leaks_more and self.reaches


def audit(
    mech: Mechanism,
    x: Any,
    x_prime: Any,
    *,
    epsilon: float,
    samples: int,
    rng: np.random.Generator,
    alpha: float = 1e-6,
    privatize: Callable[[npt.NDArray[np.object_], np.random.Generator], Any] | None = None,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> AuditResult:
    """Audit ``mech`` (or ``privatize``, a variant of its randomizer) against ``epsilon``.

    ``samples`` reports are drawn for each input, ``chunk`` at a time (only the event counts
    are kept); ``x`` and ``x'`` must differ (for SFP, in their fragment at every position
    too). ``progress`` is called with the reports drawn so far and ``2 * samples``.
    """
    if samples < 1 or chunk < 1:
        raise ValueError(f"`samples` and `chunk` must be >= 1, got {samples}, {chunk}")
    draw = privatize or (lambda values, g: mech.privatize(values, rng=g))
    hits = [0, 0]
    drawn = 0
    for i, value in enumerate((x, x_prime)):
        for start in range(0, samples, chunk):
            n = min(chunk, samples - start)
            reports = draw(np.asarray([value] * n, dtype=object), rng)
            hits[i] += int(mech.audit_event(reports, x, x_prime).sum())
            drawn += n
            if progress is not None:
                progress(drawn, 2 * samples)
    lo_x, hi_x = clopper_pearson(hits[0], samples, alpha)
    lo_y, hi_y = clopper_pearson(hits[1], samples, alpha)

    def ln_ratio(a: float, b: float) -> float:
        if a <= 0.0:
            return -math.inf
        return math.inf if b <= 0.0 else math.log(a / b)

    return AuditResult(
        mechanism=mech.name,
        epsilon=epsilon,
        samples=samples,
        alpha=alpha,
        hits=(hits[0], hits[1]),
        lower=ln_ratio(lo_x, hi_y),
        estimate=ln_ratio(hits[0] / samples, hits[1] / samples),
        upper=ln_ratio(hi_x, lo_y),
    )


def exact_max_log_ratio(mech: Mechanism) -> float:
    """The exact privacy loss of ``mech``'s randomizer at a small size, by enumeration.

    The same mechanism and epsilon with ``k`` and ``m`` small enough to enumerate every output
    (CMS k = 2, m = 8; HCMS k = 8, m = 64; SFP: its two CMS parts, composed), for two inputs
    that hash apart in every row (:meth:`~dp_governor.mechanisms.Mechanism.enumerated_loss`).
    """
    return mech.enumerated_loss()
