"""The Sylvester-Hadamard matrix and the fast Walsh-Hadamard transform (FWHT).

``H_1 = [1]``, ``H_2m = [[H_m, H_m], [H_m, -H_m]]``, so ``H[a, b] = (-1)**popcount(a & b)``,
``H = H.T`` and ``H @ H = m * I``: transforming twice multiplies by ``m``. The transform is
unnormalised, as in Apple's Algorithm 7; the missing ``1/m`` of the inverse is supplied by the
device sampling the row ``l`` uniformly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["fwht", "hadamard", "hadamard_entry", "is_power_of_two"]

_BASE = 16
_BLOCK_CELLS = 1 << 17


def is_power_of_two(m: int) -> bool:
    """Return whether ``m`` is a positive power of two.

    >>> is_power_of_two(1024), is_power_of_two(1000)
    (True, False)
    """
    return m > 0 and m & (m - 1) == 0


def hadamard(m: int) -> npt.NDArray[np.int64]:
    """The explicit ``m x m`` Sylvester-Hadamard matrix (for tests and small ``m``).

    >>> hadamard(4).tolist()
    [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]
    """
    if not is_power_of_two(m):
        raise ValueError(f"`m` must be a power of 2, got {m}")
    a = np.arange(m, dtype=np.uint64)
    return hadamard_entry(a[:, None], a[None, :])


def hadamard_entry(row: npt.ArrayLike, col: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """``H[row, col] = (-1)**popcount(row & col)``, elementwise."""
    r = np.asarray(row).astype(np.uint64, copy=False)
    c = np.asarray(col).astype(np.uint64, copy=False)
    parity = np.bitwise_count(r & c).astype(np.int64) & 1
    out: npt.NDArray[np.int64] = 1 - 2 * parity
    return out


def fwht(x: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """Return ``x @ H_m`` along the last axis in ``O(m log m)`` per row.

    Integer input gives output of the same integer dtype (exact while every partial sum fits it
    and stays below ``2**53``: for a row of ``+-1`` sums, the row's report count bounds them);
    float input gives ``float64``. Rows are transformed in cache-sized blocks: the first four
    butterfly stages as one product with ``H_16``, the rest as in-place butterflies.
    """
    a = np.asarray(x)
    m = a.shape[-1]
    if not is_power_of_two(m):
        raise ValueError(f"the last axis must have a power-of-2 length, got {m}")
    integer = np.issubdtype(a.dtype, np.integer)
    rows = a.reshape(-1, m)
    out = np.empty(rows.shape, dtype=a.dtype if integer else np.float64)
    base = min(_BASE, m)
    h_base = hadamard(base).astype(np.float64)
    block = max(1, _BLOCK_CELLS // m)
    for start in range(0, rows.shape[0], block):
        y = rows[start : start + block].astype(np.float64)
        r = y.shape[0]
        y = (y.reshape(-1, base) @ h_base).reshape(r, m)
        h = base
        while h < m:
            v = y.reshape(r, m // (2 * h), 2, h)
            lo = v[:, :, 0, :]
            hi = v[:, :, 1, :]
            total = lo + hi
            np.subtract(lo, hi, out=hi)
            lo[...] = total
            h *= 2
        out[start : start + r] = np.rint(y) if integer else y
    return out.reshape(a.shape)
