"""Per-row column counts of packed bit vectors without unpacking them: the CMS server's fold.

``add_bit_counts(counts, rows, bits)`` adds bit ``l`` of packed vector ``i`` to
``counts[rows[i], l]``. Unpacking costs a byte per bit; this costs a few word operations per 64
bits. The vectors are grouped by row (a radix argsort of 16-bit row numbers) and gathered
rank-major into blocks of rows of about equal depth that fit in cache, so that the ``r``-th
vectors of every row in a block form one row of 64-bit words. Each block is then counted with
bit-sliced arithmetic: carry-save adders (three words in, a sum word and a carry word out, five
operations) cut the rows by a third per level, and SWAR lane widening (2-, 4-, 8- and 16-bit
lanes, each level summing as many rows as its lanes hold) adds up what is left. Exact for any
input, pure numpy; blocks may run on threads, since numpy releases the GIL in its loops and
blocks write disjoint rows of ``counts``.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["add_bit_counts"]

Words = npt.NDArray[np.uint64]

_WORD: Final = np.dtype("<u8")  # little-endian, so byte b of a word is its bits 8b..8b+7
_LANE_MASKS: Final = {w: np.uint64(int(("0" * w + "1" * w) * (32 // w), 2)) for w in (1, 2, 4, 8)}
# Rows summed per lane widening: 3 rows of 1 bit fit 2-bit lanes, 5 of <= 3 fit 4 bits, 17 of
# <= 15 fit 8 bits. The last level sums everything into 16-bit lanes, so a block takes at most
# 65,535 ranks (vectors per row) at a time.
_GROUP: Final = {1: 3, 2: 5, 4: 17}
_MAX_RANKS: Final = 65535
_CSA_LEVELS: Final = 2
_CSA_MIN_ROWS: Final = 6  # fewer rows go straight to lane widening
_BLOCK_BYTES: Final = 1 << 20  # with its scratch, about one core's L2 cache
# Plane ``8 h8 + s`` of a block's counts holds coordinate ``8 h8 + 7 - s`` of each 16.
_COORD_ORDER: Final = np.array([8 * h + 7 - b for h in (0, 1) for b in range(8)])
_KEY_PART: Final = 1 << 16  # sort keys are built this many at a time
_CHUNK: Final = 1 << 23  # at most this many vectors grouped at a time: 64 MiB of indices
_MIN_CHUNK: Final = 1 << 21


class _Workspace:
    """Scratch buffers reused across blocks, so that the allocator does not map fresh pages."""

    def __init__(self) -> None:
        self._bufs: dict[str, Words] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> Words:
        size = math.prod(shape)
        buf = self._bufs.get(name)
        if buf is None or buf.size < size:
            buf = np.empty(size, dtype=_WORD)
            self._bufs[name] = buf
        return buf[:size].reshape(shape)


def _up(x: int, g: int) -> int:
    return -(-x // g) * g


def _csa(ws: _Workspace, level: int, x: Words) -> Words:
    """One carry-save level: ``(A, 3t, C) -> (2A, t', C)``, sums first, then carries.

    ``t'`` is ``t`` rounded up to a multiple of three (zero rows) for the next level.
    """
    a_count, r, c_words = x.shape
    t = r // 3
    out = ws.get(f"csa{level}", (2, a_count, _up(t, 3), c_words))
    out[:, :, t:] = 0
    total, carry = out[0, :, :t], out[1, :, :t]
    u = ws.get(f"xor{level}", (a_count, t, c_words))
    a, b, c = x[:, :t], x[:, t : 2 * t], x[:, 2 * t :]
    np.bitwise_xor(a, b, out=u)
    np.bitwise_xor(u, c, out=total)
    np.bitwise_and(a, b, out=carry)
    np.bitwise_and(u, c, out=u)
    np.bitwise_or(carry, u, out=carry)
    return out.reshape(2 * a_count, out.shape[2], c_words)


def _sum_parts(parts: Words, out: Words) -> Words:
    """Sum ``parts`` over its axis ``-3`` into ``out``: explicit adds of contiguous blocks.

    Faster than ``np.add.reduce`` over an axis that is neither the first nor the last.
    """
    g = parts.shape[-3]
    if g == 1:
        out[...] = parts[..., 0, :, :]
        return out
    np.add(parts[..., 0, :, :], parts[..., 1, :, :], out=out)
    for i in range(2, g):
        np.add(out, parts[..., i, :, :], out=out)
    return out


def _widen(ws: _Workspace, x: Words, w: int) -> Words:
    """Split ``w``-bit lanes into ``2w``-bit lanes (new leading axis: low, high), sum row groups.

    Rows ``i``, ``i + groups``, ``i + 2 groups``, ... form group ``i``: contiguous blocks to add.
    """
    *lead, r, c_words = x.shape
    groups = -(-r // _GROUP[w])
    g = -(-r // groups)  # the fewest groups, as even as possible
    y = ws.get(f"split{w}", (2, *lead, g * groups, c_words))
    mask = _LANE_MASKS[w]
    lo, hi = y[0, ..., :r, :], y[1, ..., :r, :]
    np.bitwise_and(x, mask, out=lo)
    np.right_shift(x, np.uint64(w), out=hi)
    np.bitwise_and(hi, mask, out=hi)
    y[..., r:, :] = 0
    out = ws.get(f"sum{w}", (2, *lead, groups, c_words))
    return _sum_parts(y.reshape(2, *lead, g, groups, c_words), out)


def _count_block(ws: _Workspace, p: Words) -> npt.NDArray[np.uint16]:
    """Column counts of the rows of ``p`` (``(3t, C)`` words) as ``(16, C, 4)`` 16-bit lanes.

    Entry ``[s, c, q]`` counts bit ``16 q + s`` of word ``c``.
    """
    x = p[None]
    lw = np.zeros(1, dtype=np.uint64)  # log2 weight of each stacked array
    level = 0
    while level < _CSA_LEVELS and x.shape[1] >= _CSA_MIN_ROWS:
        x = _csa(ws, level, x)
        lw = np.concatenate([lw, lw + np.uint64(1)])
        level += 1
    for w in (1, 2, 4):
        x = _widen(ws, x, w)  # leading axes (h4, h2, h1): bit 8 q' + 4 h4 + 2 h2 + h1
    a_count, r, c_words = x.shape[-3:]
    y = ws.get("split8", (2, *x.shape))
    np.bitwise_and(x, _LANE_MASKS[8], out=y[0])
    np.right_shift(x, np.uint64(8), out=y[1])
    np.bitwise_and(y[1], _LANE_MASKS[8], out=y[1])
    np.left_shift(y, lw[:, None, None], out=y)  # weigh each carry-save array; sums stay <= ranks
    z = ws.get("total", (16, 1, c_words))
    _sum_parts(y.reshape(16, a_count * r, 1, c_words), z)
    return z.view("<u2").reshape(16, c_words, 4)


def _group_order(rows: npt.NDArray[np.integer], k: int) -> npt.NDArray[np.integer]:
    """Indices that sort ``rows`` stably.

    Up to 65,536 rows (every sketch the policies make), numpy's stable argsort of the row
    numbers as 16-bit integers, which is a radix sort: two linear passes, 18-20 ns a report
    on 2^23 of them here against 65-68 for sorting 64-bit ``row << b | index`` words, whose
    comparison sort is fast only where numpy dispatches it to SIMD code (about 5 ns on a CPU
    where it does). More rows: one sort of such words, 32-bit when the row and the
    index fit, else 64-bit; the sorted words, masked to their index bits, are the indices.
    """
    n = rows.shape[0]
    if k <= 1 << 16:
        return np.argsort(rows.astype(np.uint16), kind="stable")
    shift = max(1, (n - 1).bit_length())
    wide = shift + max(1, (k - 1).bit_length()) > 32
    dtype = np.dtype(np.uint64 if wide else np.uint32)
    key = np.arange(n, dtype=dtype)
    part = np.empty(min(n, _KEY_PART), dtype=dtype)
    for s in range(0, n, _KEY_PART):  # by parts: no second n-long temporary
        e = min(n, s + _KEY_PART)
        np.left_shift(rows[s:e], shift, out=part[: e - s], casting="unsafe")
        key[s:e] |= part[: e - s]
    key.sort()
    key &= np.array((1 << shift) - 1, dtype=dtype)
    return key.view(np.int64) if wide else key


@dataclass(frozen=True)
class _Grouped:
    """Vectors as 64-bit words, their order grouped by row, and each row's start and size."""

    words: Words
    order: npt.NDArray[np.integer]  # uint32 or int64; np.take converts each block's share
    starts: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    touched: npt.NDArray[np.int64]  # rows with vectors, deepest first


def _fold_block(
    ws: _Workspace,
    g: _Grouped,
    block: tuple[int, int],
    counts: npt.NDArray[np.integer],
    block_bytes: int,
) -> None:
    """Count the vectors of one block of rows into ``counts``, ranks a slice at a time."""
    b0, kk = block
    n, n_words = g.words.shape
    m = counts.shape[1]
    rb = g.touched[b0 : b0 + kk]
    sz = g.sizes[rb]
    first = g.starts[rb]
    top = int(sz.max())
    step = max(1, min(_MAX_RANKS, 4 * block_bytes // (kk * 8 * n_words)))
    for r0 in range(0, top, step):
        ranks = np.arange(r0, min(top, r0 + step))[:, None]
        pos = first + ranks
        np.minimum(pos, n - 1, out=pos)
        r = ranks.shape[0]
        p = ws.get("gather", (_up(r, 3) if r >= _CSA_MIN_ROWS else r, kk, n_words))
        np.take(
            g.words, g.order[pos].reshape(-1), axis=0, out=p[:r].reshape(-1, n_words), mode="clip"
        )
        ragged = max(0, min(r, int(sz.min()) - r0))  # ranks below it are in every row
        p[ragged:r][ranks[ragged:] >= sz] = 0  # ranks past a row's size
        p[r:] = 0
        z = _count_block(ws, p.reshape(p.shape[0], kk * n_words))
        # Bit 16 q + 8 h8 + s of word w is coordinate 64 w + 16 q + 8 h8 + (7 - s): lay the
        # counts out in coordinate order (a small copy) so that the add into ``counts`` reads
        # and writes whole rows.
        flat = ws.get("coords", (kk * n_words * 16,)).view("<u2").reshape(kk, 64 * n_words)
        flat.reshape(kk, n_words, 4, 16)[...] = (
            z[_COORD_ORDER].transpose(1, 2, 0).reshape(kk, n_words, 4, 16)
        )
        counts[rb] += flat[:, :m]


def add_bit_counts(
    counts: npt.NDArray[np.integer],
    rows: npt.ArrayLike,
    bits: npt.NDArray[np.uint8],
    *,
    threads: int = 1,
    block_bytes: int | None = None,
) -> None:
    """Add bit ``l`` of ``bits[i]`` (packed big-endian) to ``counts[rows[i], l]``, in place.

    Args:
        counts: a ``(k, m)`` integer array, written in place.
        rows: ``n`` row indices in ``[0, k)`` (not checked here: callers validate).
        bits: ``(n, ceil(m / 8))`` packed vectors; bits past ``m`` are ignored.
        threads: blocks of rows counted concurrently (numpy releases the GIL in its loops, but
            a block is some 60 short calls, so threads contend for it between them: bigger
            blocks by default).
        block_bytes: the gathered block size (tuning; results do not depend on it).
    """
    if block_bytes is None:
        block_bytes = _BLOCK_BYTES if threads <= 1 else 2 * _BLOCK_BYTES
    k, m = counts.shape
    rows = np.asarray(rows).astype(np.int64, copy=False)
    n = rows.shape[0]
    if bits.dtype != np.uint8 or bits.shape != (n, (m + 7) // 8):
        raise ValueError(f"bits must be uint8 of shape ({n}, {(m + 7) // 8}), got {bits.shape}")
    # Vectors grouped at a time: about 1,000 a row, within [_MIN_CHUNK, _CHUNK]. Fewer make
    # shallow rows (padding, and one more pass over the sketch per chunk: 3.6-4.1 M reports/s
    # at k = 65,536 with 2^21, 5.7-6.5 M with 2^23); more spread the random gathers over more
    # memory (at k = 2,048: 9.8-10.1 M/s with 2^21, 7.5-9.2 M with 2^23).
    chunk = min(_CHUNK, max(_MIN_CHUNK, 1024 * k))
    if n > chunk:
        for s in range(0, n, chunk):
            add_bit_counts(
                counts,
                rows[s : s + chunk],
                bits[s : s + chunk],
                threads=threads,
                block_bytes=block_bytes,
            )
        return
    if n == 0:
        return
    n_words = -(-bits.shape[1] // 8)
    if bits.shape[1] % 8 or not bits.flags.c_contiguous:
        padded = np.zeros((n, 8 * n_words), dtype=np.uint8)
        padded[:, : bits.shape[1]] = bits
        bits = padded
    words = bits.view(_WORD)
    order = _group_order(rows, k)
    sizes = np.bincount(rows, minlength=k)
    starts = np.cumsum(sizes) - sizes
    # Deepest rows first, so that a block's rows have about the same depth and little of the
    # rank-major block is padding; each block holds about ``block_bytes`` of vectors.
    touched = np.flatnonzero(sizes)
    touched = touched[np.argsort(sizes[touched], kind="stable")[::-1]]
    blocks: list[tuple[int, int]] = []
    b0 = 0
    while b0 < touched.size:
        depth = min(int(sizes[touched[b0]]), _MAX_RANKS)
        # Gathered vectors and the block's int32 counts each stay within block_bytes.
        kk = block_bytes // (8 * n_words * max(depth, 32))
        kk = max(1, min(touched.size - b0, kk))
        blocks.append((b0, kk))
        b0 += kk
    grouped = _Grouped(words, order, starts, sizes, touched)
    local = threading.local()

    def run(block: tuple[int, int]) -> None:
        ws: _Workspace | None = getattr(local, "ws", None)
        if ws is None:
            ws = local.ws = _Workspace()
        _fold_block(ws, grouped, block, counts, block_bytes)

    if threads <= 1 or len(blocks) == 1:
        for block in blocks:
            run(block)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in pool.map(run, blocks):
            pass
