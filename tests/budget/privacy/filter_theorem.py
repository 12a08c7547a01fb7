"""The filter theorem's condition, written from its statement: the oracle for the gate's filters.

Whitehouse, Ramdas, Rogers and Wu (ICML 2023), advanced-composition filter for pure reports,
with the basic sum beside it (docs/odometer.md): a sequence ending with the report asked about
is admitted when its basic sum is within the target's epsilon (compared exactly, in integer
micro-epsilon), or when ``sqrt(2 log(1/delta) S2) + S2/2 <= epsilon`` (evaluated in floating
point from the whole sequence, not from the module's ``V*``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dp_governor.policies.model import to_micro
from tests.budget.privacy.test_odometer import BOUNDARY, theorem_epsilon

__all__ = ["theorem_admits"]


def theorem_admits(weights: Sequence[int], epsilon: float, delta: float) -> bool | None:
    """Whether a filter of target ``(epsilon, delta)`` admits ``weights``' last report.

    ``weights`` are the group-scaled micro-epsilons the filter counts, the new report included.
    ``None``: within a relative ``BOUNDARY`` of the theorem's line, where floating-point
    evaluation and the gate's exact comparison may legitimately differ.
    """
    if sum(weights) <= to_micro(epsilon):
        return True
    lhs = theorem_epsilon(list(weights), delta)
    if abs(lhs - epsilon) <= BOUNDARY * epsilon:
        return None
    return lhs <= epsilon
