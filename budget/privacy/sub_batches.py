"""A shuffled batch as sub-batches of one report per device, and their composed central epsilon.

A device with ``j`` reports in one batch is in ``j`` sub-batches: sub-batch ``i`` holds the
``i``-th report of every device with at least ``i`` reports. :func:`batch_layers` counts them
from the reports per device (the flush records it with each batch); :func:`compose_sizes` is the
central ``epsilon`` of one device's sub-batches, FMT21-amplified and composed with PLD. Sizes are
rounded down to a grid of ``2^(1/8)`` steps (never up: a smaller ``n`` hides less), so a year of
batches composes a few distinct pairs, memoized. Pure: the read side
(:mod:`dp_governor.budget.reporting.central`) chooses which sizes to compose.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Final

__all__ = ["batch_layers", "compose_sizes", "round_down"]

_GRID: Final = 8  # sizes rounded down to 2^(i / _GRID)


def batch_layers(per_device: Iterable[int]) -> list[int]:
    """``layers[i]``: how many devices have more than ``i`` reports in the batch.

    >>> batch_layers([1, 2, 1, 3])
    [4, 2, 1]
    """
    histogram = Counter(per_device)
    top = max(histogram, default=0)
    out = []
    remaining = sum(histogram.values())
    for i in range(1, top + 1):
        out.append(remaining)
        remaining -= histogram.get(i, 0)
    return out


def round_down(n: int) -> int:
    """The largest grid size ``<= n`` (``floor(2^(i/8))``, exact below 16)."""
    if n < 16:
        return n
    i = math.floor(math.log2(n) * _GRID)
    while math.floor(2.0 ** ((i + 1) / _GRID)) <= n:
        i += 1
    while math.floor(2.0 ** (i / _GRID)) > n:
        i -= 1
    size: int = math.floor(2.0 ** (i / _GRID))
    return size


@lru_cache(maxsize=1024)
def _compose(slots: tuple[tuple[float, int], ...], delta: float) -> tuple[float, str]:
    """``compose_shuffled`` of sub-batches ``(eps0, n)`` (memoized by the sorted multiset)."""
    # dp-accounting and scipy load where a central figure is computed, not with the ledger
    from dp_governor.budget.privacy.amplification import compose_shuffled, shuffle_epsilon

    if len(slots) == 1:
        bound = shuffle_epsilon(slots[0][0], slots[0][1], delta)
        return bound.epsilon, bound.method
    result = compose_shuffled(list(slots), delta)
    return result.epsilon, result.method


def compose_sizes(eps0: float, sizes: Sequence[int], delta: float) -> tuple[float, str]:
    """Central ``epsilon`` at ``delta`` of sub-batches of ``sizes`` devices, composed.

    One device in each sub-batch (a batch's layers: a device with ``len(sizes)`` reports),
    each sub-batch FMT21-amplified at local ``eps0``; sizes are rounded down to the grid.
    Returns the epsilon and the method that gave it.

    >>> round(compose_sizes(4.0, [10**6], 1e-6)[0], 4)  # 10^6 rounds down to 961,548
    0.0504
    """
    if not sizes or any(n < 1 for n in sizes):
        raise ValueError(f"`sizes` must be a non-empty list of integers >= 1, got {sizes!r}")
    return _compose(tuple(sorted((float(eps0), round_down(int(n))) for n in sizes)), delta)
