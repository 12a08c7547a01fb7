"""Reading an epsilon off a composed privacy loss distribution, without dp-accounting's traps.

dp-accounting 0.6.0 has two traps a budget service must not pass on:

- ``PrivacyLossDistribution.get_epsilon_for_delta`` returns ``inf`` (with an overflow warning)
  once the composed loss passes about 709 (``e^709`` is the largest float): 89 pure events of
  epsilon 8 (712) come out as ``inf``, 88 (704) and 100 (800) as finite values. ``inf`` is a
  valid but useless bound, and it must never reach a report or the API;
- ``PLDAccountant`` ignores the count of a composed ``RandomizedResponseDpEvent`` (90 reports
  at epsilon 8 come out as 8.0). This module's callers build PLDs from privacy parameters and
  self-compose them instead; the trap is kept visible in the tests.

:func:`epsilon_for_delta` answers ``None`` where the library's answer is not a finite number,
so the caller falls back to a valid figure it can name (the basic sum of the epsilons).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # dp-accounting (and scipy under it) load where a PLD is computed
    from dp_accounting.pld import privacy_loss_distribution as pld

__all__ = ["epsilon_for_delta"]


def epsilon_for_delta(composed: pld.PrivacyLossDistribution, delta: float) -> float | None:
    """``composed.get_epsilon_for_delta(delta)``, or ``None`` where it is not finite.

    dp-accounting divides probability masses that overflow to ``inf`` past a loss of about
    709; the warning is silenced here because the caller handles the answer (a pessimistic
    ``inf`` becomes ``None``, and so does a NaN).
    """
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        value = float(composed.get_epsilon_for_delta(delta))
    return value if math.isfinite(value) and value >= 0.0 else None
