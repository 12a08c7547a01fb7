"""Frequency estimates with their standard errors, and the row-gather kernel the sketches share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dp_governor.mechanisms.hashing import Fingerprints, HashFamily, Item

__all__ = ["DiscoveredWord", "FrequencyEstimate", "gather_row_sums", "plugin_stderr"]

FloatArray = npt.NDArray[np.float64]

_BLOCK_CELLS = 1 << 16


@dataclass(frozen=True, slots=True, eq=False)
class FrequencyEstimate:
    """Estimated counts of ``candidates`` from ``n`` reports, like a scipy result object.

    Attributes:
        candidates: the queried items, in the order of ``counts``.
        counts: unbiased (over the hash family) count estimates, ``float64``.
        stderr: plug-in standard errors from the exact analytic variance.
        n: the number of reports behind the estimate.
    """

    candidates: tuple[Item, ...]
    counts: FloatArray
    stderr: FloatArray
    n: int

    def __len__(self) -> int:
        return len(self.candidates)

    def top(self, t: int) -> list[tuple[Item, float, float]]:
        """The ``t`` candidates with the largest estimates, as ``(item, count, stderr)``."""
        order = np.argsort(-self.counts, kind="stable")[:t]
        return [(self.candidates[i], float(self.counts[i]), float(self.stderr[i])) for i in order]

    def interval(self, z: float = 1.959963984540054) -> tuple[FloatArray, FloatArray]:
        """Normal-approximation interval ``counts -+ z * stderr`` (95% by default)."""
        return self.counts - z * self.stderr, self.counts + z * self.stderr


@dataclass(frozen=True, slots=True)
class DiscoveredWord:
    """A discovered word with its estimate, the puzzle piece it was joined on, and its fragments."""

    word: str
    count: float
    stderr: float
    puzzle: int
    fragments: tuple[str, ...]


def gather_row_sums(
    tables: Sequence[npt.NDArray[np.integer]], family: HashFamily, fp: Fingerprints, m: int
) -> npt.NDArray[np.int64]:
    """Return ``S[t, i] = sum_j tables[t][j, h_j(item_i)]`` for each ``(k, m)`` table, as ``int64``.

    The hashes of a block of rows are computed once and gathered from every table (SFP's five
    fragment sketches share one family). Blocks stay cache-sized (about ``2**16`` cells) and
    each gather reads within a few contiguous table rows.
    """
    k = tables[0].shape[0]
    d = len(fp)
    out = np.zeros((len(tables), d), dtype=np.int64)
    if d == 0:
        return out
    flat = [np.ascontiguousarray(t).reshape(-1) for t in tables]
    cols = min(d, _BLOCK_CELLS)
    rows_per_block = max(1, _BLOCK_CELLS // cols)
    for c0 in range(0, d, cols):
        c1 = min(d, c0 + cols)
        sub = fp.take(np.arange(c0, c1)) if (c0, c1) != (0, d) else fp
        for r0 in range(0, k, rows_per_block):
            r1 = min(k, r0 + rows_per_block)
            idx = family.evaluate_block(sub, r0, r1, m)
            idx += (np.arange(r0, r1, dtype=np.int64) * m)[:, None]
            for t, table in enumerate(flat):
                vals = np.take(table, idx)
                out[t, c0:c1] += vals.sum(axis=0, dtype=np.int64)
    return out


def plugin_stderr(
    variance: Callable[[FloatArray, FloatArray], FloatArray], counts: FloatArray, n: int
) -> FloatArray:
    """Standard errors from an exact variance ``variance(f, f2_others)`` with plug-in counts.

    The unknown true counts are replaced by the estimates clipped to ``[0, n]``, and the sum of
    the other items' squared counts by ``sum(max(est^2 - var0, 0))`` over the candidates, which
    removes the noise variance ``var0`` from each squared estimate. That term's coefficient is
    ``O(1/(k m))``, so the plug-in matters only for tiny sketches.
    """
    f_hat = np.clip(counts, 0.0, float(n))
    var0 = variance(f_hat, np.zeros_like(f_hat))
    f2 = float(np.maximum(counts * counts - var0, 0.0).sum())
    f2_others = np.maximum(f2 - f_hat * f_hat, 0.0)
    out: FloatArray = np.sqrt(np.maximum(variance(f_hat, f2_others), 0.0))
    return out
