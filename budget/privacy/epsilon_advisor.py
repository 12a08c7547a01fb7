"""How much of a policy's epsilon its mechanism wastes, against the best known frequency oracle.

For each sketch a use case publishes (CMS or HCMS; SFP's word and fragment sketches), the exact
variance of one report's contribution to the estimate of a rare item (true count 0, the other
devices' values spread: ``f = 0``, ``F2 = n``), from :mod:`dp_governor.mechanisms.variance` (Apple's
Appendices A and B), is set beside the variance of the best known frequency oracle at the same
epsilon,

    V*(eps) = 4 e^eps / (e^eps - 1)^2 = 1 / sinh(eps / 2)^2   per report,

that of optimized local hashing (Wang, Blocki, Li and Jha, "Locally differentially private
protocols for frequency estimation", USENIX Security 2017, with ``g = e^eps + 1``), which subset
selection also reaches for large domains, the order Ye and Barg prove minimax optimal there
("Optimal schemes for discrete distribution estimation under locally differential privacy",
IEEE Transactions on Information Theory, 2018). The epsilon at which that oracle matches the
mechanism's accuracy solves ``V*(eps') = V``: ``eps' = 2 asinh(1 / sqrt(V))``. A policy whose
mechanism needs more than ``1 / (1 - WASTE_THRESHOLD)`` times that epsilon (it spends more than
a quarter of its epsilon on the mechanism's inefficiency) is warned about. The figures compare
accuracy at equal privacy only; switching mechanism is a decision about devices already in the
field, which the advisor does not make.

>>> advice = advise_sketch("hcms", 4.0, k=2048, m=1024)
>>> round(advice.ratio, 1), round(advice.epsilon_same_accuracy, 2)
(14.2, 1.71)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from dp_governor.mechanisms.variance import cms_variance_exact, hcms_variance_exact
from dp_governor.policies.model import PolicyBase

__all__ = [
    "REFERENCE",
    "WASTE_THRESHOLD",
    "EpsilonAdvice",
    "SketchAdvice",
    "advise",
    "advise_sketch",
    "optimal_variance",
    "render_advice",
    "same_accuracy_epsilon",
]

WASTE_THRESHOLD: Final = 0.25
REFERENCE: Final = (
    "optimized local hashing (Wang, Blocki, Li and Jha, USENIX Security 2017) and, for large"
    " domains, subset selection (Ye and Barg, IEEE Trans. Inf. Theory 2018): per-report"
    " variance 4 e^eps / (e^eps - 1)^2 for an item of frequency near 0"
)


def optimal_variance(epsilon: float) -> float:
    """``4 e^eps / (e^eps - 1)^2``, the best known oracle's per-report variance at ``epsilon``.

    >>> round(optimal_variance(4.0), 4)
    0.076
    """
    _check_epsilon(epsilon)
    return 1.0 / math.sinh(epsilon / 2.0) ** 2


def same_accuracy_epsilon(variance: float) -> float:
    """The epsilon at which the best known oracle has per-report ``variance``.

    >>> round(same_accuracy_epsilon(optimal_variance(3.0)), 12)
    3.0
    """
    if not (math.isfinite(variance) and variance > 0):
        raise ValueError(f"`variance` must be finite and > 0, got {variance!r}")
    return 2.0 * math.asinh(1.0 / math.sqrt(variance))


def _check_epsilon(epsilon: float) -> None:
    if isinstance(epsilon, bool) or not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"`epsilon` must be finite and > 0, got {epsilon!r}")


@dataclass(frozen=True, slots=True)
class SketchAdvice:
    """One sketch's per-report variance beside the best known oracle's, at its epsilon."""

    part: str
    mechanism: str
    epsilon: float
    variance: float
    optimal_variance: float
    ratio: float
    epsilon_same_accuracy: float


@dataclass(frozen=True, slots=True)
class EpsilonAdvice:
    """A use case's epsilon against what the best known oracle needs for the same accuracy.

    ``epsilon_same_accuracy`` sums its sketches' (SFP: word and fragment); ``wasted_fraction``
    is ``1 - epsilon_same_accuracy / epsilon_per_report``; ``warning`` is set past
    :data:`WASTE_THRESHOLD`.
    """

    use_case: str
    mechanism: str
    epsilon_per_report: float
    sketches: list[SketchAdvice]
    epsilon_same_accuracy: float
    wasted_fraction: float
    warning: str | None
    reference: str = REFERENCE


def advise_sketch(
    mechanism: str, epsilon: float, *, k: int, m: int, part: str = "report"
) -> SketchAdvice:
    """Per-report variance of a CMS or HCMS sketch (exact, rare item) against ``V*(epsilon)``."""
    _check_epsilon(epsilon)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"`k` must be an integer >= 1, got {k!r}")
    if isinstance(m, bool) or not isinstance(m, int) or m < 2:
        raise ValueError(f"`m` must be an integer >= 2, got {m!r}")
    if mechanism == "cms":
        exact = cms_variance_exact
    elif mechanism == "hcms":
        exact = hcms_variance_exact
    else:
        raise ValueError(f"`mechanism` must be 'cms' or 'hcms', got {mechanism!r}")
    variance = float(exact(epsilon, k, m, 1.0, 0.0, 1.0))  # n = 1, f = 0, F2 of others = n
    best = optimal_variance(epsilon)
    return SketchAdvice(
        part=part,
        mechanism=mechanism,
        epsilon=epsilon,
        variance=variance,
        optimal_variance=best,
        ratio=variance / best,
        epsilon_same_accuracy=min(epsilon, same_accuracy_epsilon(variance)),
    )


def advise(policy: PolicyBase) -> EpsilonAdvice:
    """The advice for one policy (SFP: its word and fragment sketches, each at its epsilon)."""
    if policy.mechanism == "sfp":
        if policy.epsilon_word is None or policy.epsilon_fragment is None:
            raise ValueError("an sfp policy needs `epsilon_word` and `epsilon_fragment`")
        if policy.k_fragment is None or policy.m_fragment is None:
            raise ValueError("an sfp policy needs `k_fragment` and `m_fragment`")
        sketches = [
            advise_sketch("cms", policy.epsilon_word, k=policy.k, m=policy.m, part="word"),
            advise_sketch(
                "cms",
                policy.epsilon_fragment,
                k=policy.k_fragment,
                m=policy.m_fragment,
                part="fragment",
            ),
        ]
    else:
        sketches = [
            advise_sketch(policy.mechanism, policy.epsilon_per_report, k=policy.k, m=policy.m)
        ]
    needed = math.fsum(s.epsilon_same_accuracy for s in sketches)
    wasted = max(0.0, 1.0 - needed / policy.epsilon_per_report)
    warning = None
    if wasted > WASTE_THRESHOLD:
        worst = max(sketches, key=lambda s: s.ratio)
        warning = (
            f"{policy.name}: {policy.mechanism} at epsilon {policy.epsilon_per_report:g} is as"
            f" accurate as the best known frequency oracle at epsilon {needed:.3g}: it wastes"
            f" {wasted:.0%} of its epsilon (more than {WASTE_THRESHOLD:.0%}); the {worst.part}"
            f" sketch's variance is {worst.ratio:.3g}x the oracle's at equal epsilon"
        )
    return EpsilonAdvice(
        use_case=policy.name,
        mechanism=policy.mechanism,
        epsilon_per_report=policy.epsilon_per_report,
        sketches=sketches,
        epsilon_same_accuracy=needed,
        wasted_fraction=wasted,
        warning=warning,
    )


def render_advice(advice: EpsilonAdvice) -> str:
    """One line: the variance ratios, the epsilon that would do, and the warning if any."""
    parts = "; ".join(
        f"{s.part} {s.mechanism} at {s.epsilon:g}: variance {s.ratio:.3g}x the best known"
        f" oracle's, which matches it at epsilon {s.epsilon_same_accuracy:.3g}"
        for s in advice.sketches
    )
    head = "WARNING " if advice.warning else ""
    return (
        f"{head}{advice.use_case}: {parts}; {advice.wasted_fraction:.0%} of epsilon"
        f" {advice.epsilon_per_report:g} wasted (would do: {advice.epsilon_same_accuracy:.3g})"
    )
